"""Minimax Phased ERM: worst-group risk minimisation by output perturbation over disjoint phases.

Phase ``t = 1..T`` draws a fresh share ``1/T`` of every group's records from the group oracles
(:class:`privopt.group_sampling.GroupOracles`), solves the regularised saddle problem

    min_{w∈W} max_{λ∈Δ_p} Σ_i λ_i L_i(w) + (μ_w/2)‖w − w_{t−1}‖² − μ_λ Σ_i λ_i log λ_i

to a CERTIFIED duality gap ``α_t`` (:mod:`privopt.algorithms.worst_group_scsc`) and releases its
solution with Gaussian noise scaled to the phase's sensitivity ``Δ_t``. Phases use disjoint
records, so the T releases compose in parallel: the run is accounted as ONE Gaussian release (plus
the group-size release). Constants (``docs/algorithms/worst_group.md``, "Minimax Phased ERM"):

    η_t = η·2^{−t},  n_t = min_i n̂_i / T,  μ_w = 1/(η_t n_t),  μ_λ = 1/(η·min_i n̂_i),
    α_t = L²/(8 n_t² μ_w) + B²/(8 n_t² μ_λ),  Δ_t = (3/n_t)·(L/μ_w + B/√(μ_w μ_λ)).

The privacy of the output perturbation rests on convexity: the model must be multinomial logistic
regression (``logreg``). Features are clipped per record to ``‖x‖ ≤ R`` (``feature_norm``), so the
cross-entropy is ``L = √2·√(R²+1)``-Lipschitz and bounded on W by
``B = log(1 + (K−1)·exp(√2·r·√(R²+1)))`` (``r`` = the radius of W plus the distance of its
centre from 0); ``loss_bound`` is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from privopt.algorithms.base import RunContext, register_algorithm
from privopt.algorithms.config import flag, one_of, optional_positive, param, positive, positive_int
from privopt.algorithms.releases import DrawnBatch, Phase, PublicBound, Query
from privopt.algorithms.worst_group_common import WorstGroupAlgorithm, WorstGroupConfig
from privopt.algorithms.worst_group_scsc import SaddleObjective, solve_accelerated, solve_ogd
from privopt.errors import ConfigError, ModelError
from privopt.grads.sums import BoundedSum
from privopt.group_sampling import GroupOracles

__all__ = [
    "MinimaxPhasedERM",
    "MinimaxPhasedERMConfig",
    "PhaseConstants",
    "phase_constants",
    "linear_layer",
    "loss_bound",
]

OUTPUT = "phase-output"


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else positive_int(name, value)


@dataclass(frozen=True)
class MinimaxPhasedERMConfig(WorstGroupConfig):
    """Hyper-parameters of Minimax Phased ERM.

    Attributes:
        eta: the base step η (sets the regularisation: larger η, less regularisation, more noise).
        phases: T (``None``: ``⌊log2(n/p)⌋``, the paper's choice for n/p records per group).
        feature_norm: R; training features are clipped per record to ``‖x‖ ≤ R``.
        radius: W = the ℓ2 ball of this radius around the initial parameters (required here).
        solver: ``"accelerated"`` (default) or ``"ogd"`` (the printed solver); both certify the gap.
        max_solver_iters: iterations before the solver gives up (nothing is then released).
        project_output: project each noisy phase output onto W (post-processing; the paper does not).
    """

    eta: float = param(0.05, positive, role="lr")
    phases: int | None = param(None, _optional_int)
    feature_norm: float = param(4.0, positive)
    radius: float | None = param(5.0, optional_positive)
    solver: str = param("accelerated", one_of("accelerated", "ogd"))
    max_solver_iters: int = param(20_000, positive_int)
    project_output: bool = param(False, flag)

    def check(self) -> None:
        if self.radius is None:
            raise ConfigError("minimax-phased-erm needs radius (W must be bounded: the loss bound B depends on it)")


@dataclass(frozen=True)
class PhaseConstants:
    """Everything phase ``t`` needs, from public quantities only."""

    eta_t: float
    n_t: float
    mu_w: float
    mu_lam: float
    alpha: float
    sensitivity: float


def phase_constants(*, t: int, eta: float, n: float, phases: int, lipschitz: float, bound: float) -> PhaseConstants:
    """Regularisation, target gap and sensitivity of phase ``t`` (1-based) for ``n`` records per group.

    Example:
        >>> c = phase_constants(t=1, eta=0.1, n=1000, phases=4, lipschitz=1.0, bound=1.0)
        >>> round(c.mu_w, 4), round(c.sensitivity, 4)
        (0.08, 0.5743)
    """
    eta_t, n_t = eta * 2.0 ** (-t), n / phases
    mu_w, mu_lam = 1.0 / (eta_t * n_t), 1.0 / (eta * n)
    alpha = lipschitz**2 / (8 * n_t**2 * mu_w) + bound**2 / (8 * n_t**2 * mu_lam)
    sens = (3.0 / n_t) * (lipschitz / mu_w + bound / math.sqrt(mu_w * mu_lam))
    return PhaseConstants(eta_t, n_t, mu_w, mu_lam, alpha, sens)


def loss_bound(*, num_classes: int, margin: float) -> float:
    """``B = log(1 + (K−1)·e^a)``, the cross-entropy's maximum when every logit gap is at most ``a``,
    without overflow: ``a + log((K−1) + e^{−a})``. (Capping ``e^a`` instead understates B for large
    W or features, and with it the phase sensitivity Δ_t.)

    Example:
        >>> round(loss_bound(num_classes=2, margin=1.0), 4), loss_bound(num_classes=3, margin=1e4) > 1e4
        (1.3133, True)
    """
    if num_classes <= 1:
        return 0.0  # one class: the cross-entropy is 0
    return margin + math.log((num_classes - 1) + math.exp(-margin))


def linear_layer(model: nn.Module) -> nn.Linear:
    """The single ``nn.Linear`` (with bias) a logistic-regression model consists of."""
    mods = [m for m in model.modules() if not isinstance(m, (nn.Sequential, nn.Flatten))]
    if len(mods) != 1 or not isinstance(mods[0], nn.Linear) or mods[0].bias is None:
        raise ModelError(
            "minimax-phased-erm needs a convex model: logistic regression (model 'logreg': Flatten + one Linear "
            "with bias); its privacy rests on the stability of a strongly convex problem"
        )
    return mods[0]


@register_algorithm
class MinimaxPhasedERM(WorstGroupAlgorithm):
    """Minimax Phased ERM (see the module docstring and ``docs/algorithms/worst_group.md``).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("minimax-phased-erm", phases=3, group_sizes="public")
        >>> [(s.mechanisms, s.count) for s in algo.inventory(n=1000).steps]
        [((('phase-output', 1.0),), 1)]
    """

    name = "minimax-phased-erm"
    summary = "Minimax Phased ERM: certified saddle solves on disjoint phases, Gaussian output perturbation"
    Config = MinimaxPhasedERMConfig

    def _phases(self, n: int) -> int:
        if self.config.phases is not None:
            return self.config.phases
        p = getattr(self, "num_groups", 1)
        return max(1, int(math.floor(math.log2(max(2.0, n / p)))))

    def steps_for(self, *, n: int) -> int:
        return self._phases(n)

    def _release_phases(self, n: int) -> tuple[Phase, ...]:
        output = Query(OUTPUT, PublicBound(), batch=DrawnBatch(n), disjoint=True)  # Δ_t: public, per phase
        return (Phase("phase", self._phases(n), (output,)),)

    def setup(self, ctx: RunContext) -> None:
        layer = linear_layer(ctx.model)
        super().setup(ctx)
        c = self.config
        self.k = int(layer.out_features)
        x = ctx.x_train.reshape(ctx.n, -1).to(torch.float64)
        self._x = x * (c.feature_norm / x.norm(dim=1, keepdim=True).clamp_min(c.feature_norm))
        feat = math.sqrt(c.feature_norm**2 + 1.0)  # the bias is a constant feature 1
        self.lipschitz = math.sqrt(2.0) * feat
        reach = c.radius + float(self._w0.norm())
        self.bound = loss_bound(num_classes=self.k, margin=math.sqrt(2.0) * reach * feat)
        self.oracles = GroupOracles(self.groups, num_groups=self.num_groups, rng=ctx.sampler_rng)
        self.diagnostics: list[dict[str, float]] = []  # solver gaps etc.: NOT private, never released

    def constants(self, t: int) -> PhaseConstants:
        """Phase ``t``'s constants (1-based) from the released group sizes."""
        n = float(self.group_sizes().min())
        return phase_constants(
            t=t, eta=self.config.eta, n=n, phases=self.num_steps(), lipschitz=self.lipschitz, bound=self.bound
        )

    def _phase_data(self, t: int) -> torch.Tensor:
        """Indices of phase ``t``: the next 1/T of every group (the last phase takes what is left)."""
        T = self.num_steps()
        parts = []
        for i in range(self.num_groups):
            width = self.oracles.remaining(i) if t == T else 1.0 / T
            if width > 0:
                parts.append(self.oracles.draw(i, width=width))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def _solve(self, idx: torch.Tensor, consts: PhaseConstants, center: torch.Tensor):
        c = self.config
        obj = SaddleObjective(
            self._x[idx], self._ctx.y_train[idx], self.groups[idx],
            norm=self.group_sizes() / self.num_steps(), num_classes=self.k,
            mu_w=consts.mu_w, mu_lam=consts.mu_lam, center=center, ball_center=self._w0, radius=c.radius,
        )  # fmt: skip
        solver = solve_accelerated if c.solver == "accelerated" else solve_ogd
        return solver(obj, center, target_gap=consts.alpha, max_iters=c.max_solver_iters)

    def step(self, t: int) -> dict[str, float]:
        phase = t + 1
        consts = self.constants(phase)
        idx = self._phase_data(phase)
        center = self._w().to(torch.float64)
        res = self._solve(idx, consts, center)
        self.diagnostics.append({"phase": phase, "gap": res.gap, "alpha": consts.alpha, "iters": res.iterations})
        w = self.releases.gaussian(OUTPUT, BoundedSum(res.w, bound=consts.sensitivity), indices=idx)
        if self.config.project_output:
            w = self._project(w)
        self._set_w(w)
        std = self.releases.multiplier(OUTPUT) * consts.sensitivity if self.private else 0.0
        return {"phase_noise_std": std}

    def _state(self) -> dict[str, Any]:
        return {"oracles": self.oracles.state_dict()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.oracles.load_state_dict(state["oracles"])
