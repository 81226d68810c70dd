"""Shared plumbing of the linear-logistic ERM algorithms (DP-SVRG, DP-SVRG++, DP-GD-ERM, DP-AMD;
``docs/algorithms/erm.md``).

These algorithms work on a closed-form problem (:class:`privopt.objectives.erm.LogisticERM`)
rather than through the generic per-sample-gradient engine: the model must be a linear map with
a single trainable weight of ``p`` entries (e.g. ``nn.Linear(p, 1, bias=False)``), and the
labels must be in {-1, +1} (or {0, 1}). The weight is read at :meth:`setup` and the current
output is written back after every step, so the generic training loop's evaluation, checkpoints
and records keep working.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import Algorithm, RunContext
from privopt.algorithms.config import AlgorithmConfig, non_negative, one_of, param, positive
from privopt.algorithms.mirror import MirrorGeometry, available_geometries, get_geometry
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, Query, ReleasePlan
from privopt.errors import ConfigError, ModelError
from privopt.grads.sums import BoundedSum
from privopt.objectives.erm import LogisticERM

__all__ = [
    "ConstrainedERMConfig",
    "LinearERMAlgorithm",
    "LinearERMConfig",
    "full_gradient_plan",
    "single_thread_blas",
]

_CONTROLLER = None
_DEPTH = 0  # nesting depth of single_thread_blas (inner uses are free)


@contextlib.contextmanager
def single_thread_blas():
    """Context manager limiting BLAS to one thread (re-entrant: nested uses cost nothing).

    The products here are tiny ([n, p] @ [p] with p ~ 50, or length-p dots): multithreaded BLAS
    gains nothing on them and, on a loaded machine, its thread hand-offs made them 10-60x slower
    (measured: 16 ms vs 0.25 ms for a 20,000 x 54 mat-vec on 2 busy cores). Setting the limit
    costs ~0.2 ms, so a caller making many small products wraps them all in one outer use.
    """
    global _CONTROLLER, _DEPTH
    if _DEPTH:
        yield
        return
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    with _CONTROLLER.limit(limits=1, user_api="blas"):
        _DEPTH += 1
        try:
            yield
        finally:
            _DEPTH -= 1


@dataclass(frozen=True)
class LinearERMConfig(AlgorithmConfig):
    """The L2 weight ``l2`` (exact proximal step, data-independent) and the per-sample gradient
    bound ``clip`` (gradients are clipped to it)."""

    l2: float = param(0.0, non_negative)
    clip: float = param(1.0, positive, role="clip")


@dataclass(frozen=True)
class ConstrainedERMConfig(LinearERMConfig):
    """Adds a constraint set for the weight: ``constraint`` is ``"none"`` or a geometry of
    :mod:`privopt.algorithms.mirror` (``"l1-ball"``, ``"l2-ball"``, ``"simplex"``) and ``radius`` the
    balls' radius (the simplex has none: leave it at 1)."""

    constraint: str = param("none", one_of("none", *available_geometries()))
    radius: float = param(1.0, positive)

    def check(self) -> None:
        if self.constraint in ("none", "simplex") and self.radius != 1.0:
            raise ConfigError(f"radius applies to the l1/l2 balls only; constraint {self.constraint!r} has none")

    def geometry(self, dim: int) -> MirrorGeometry | None:
        """The constraint set in ``R^dim`` (``None`` when unconstrained)."""
        if self.constraint == "none":
            return None
        if self.constraint == "simplex":
            return get_geometry("simplex", dim=dim)
        return get_geometry(self.constraint, dim=dim, radius=self.radius)


def full_gradient_plan(n: int, *, clip: float, iterations: int) -> ReleasePlan:
    """One full-data clipped gradient sum per iteration (release ``"grad"`` in phase ``"step"``:
    per-record bound ``clip``, normaliser ``n``), ``iterations`` times: DP-GD's and DP-AMD's plan."""
    query = Query("grad", Fixed(clip), batch=BatchPlan(n, n))
    return ReleasePlan(phases=(Phase("step", iterations, (query,)),))


class LinearERMAlgorithm(Algorithm):
    """Base: binds a run to a :class:`LogisticERM` and keeps the model's weight in sync.

    Attributes (after setup):
        problem: the bound :class:`LogisticERM` (logistic part + ``l2``).
        grad_evals: per-sample gradient evaluations performed so far (for "passes over the data").

    Subclasses name their vector state in ``state_arrays`` (attribute ``_<name>`` saved under
    ``<name>``); the checkpoint state is those vectors, ``grad_evals`` and the releases' state.
    """

    state_arrays: tuple[str, ...] = ()

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._ctx: RunContext | None = None
        self._param: torch.nn.Parameter | None = None
        self.problem: LogisticERM | None = None
        self._grad_evals = 0

    def setup(self, ctx: RunContext) -> None:
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        p_dim = int(ctx.x_train.reshape(ctx.n, -1).shape[1])
        if len(params) != 1 or params[0].numel() != p_dim:
            shapes = [tuple(p.shape) for p in params]
            raise ModelError(
                f"algorithm {self.name!r} needs a linear model with one trainable weight of {p_dim} entries "
                f"(e.g. nn.Linear({p_dim}, 1, bias=False); in a config: model: logreg, "
                f"model_params: {{bias: false, single_logit: true}}, loss: logistic); got trainable parameters {shapes}"
            )
        self._ctx = ctx
        self._param = params[0]
        self.problem = LogisticERM(
            features=ctx.x_train.reshape(ctx.n, -1).detach().cpu().double().numpy(),
            labels=ctx.y_train.detach().cpu().double().numpy(),
            l2=self.config.l2,
        )
        self._grad_evals = 0
        self._bind_releases(ctx)
        self._start(self._param.detach().cpu().double().reshape(-1).numpy().copy())

    def _start(self, w0: np.ndarray) -> None:
        """Initialise the estimator state from the model's initial weight."""
        raise NotImplementedError

    def output(self) -> np.ndarray:
        """The algorithm's current output (what :meth:`finalize` writes into the model)."""
        raise NotImplementedError

    def _sync_model(self) -> None:
        with torch.no_grad():
            w = torch.from_numpy(np.ascontiguousarray(self.output()))
            self._param.copy_(w.reshape(self._param.shape).to(self._param.dtype))

    def finalize(self) -> None:
        self._sync_model()

    def gradient_sum(self, w: np.ndarray, clip: float) -> BoundedSum:
        """The released statistic of :func:`full_gradient_plan`: ``sum_i clip_C(g_i(w))`` (bound ``clip``)."""
        with single_thread_blas():
            return BoundedSum(torch.from_numpy(self.problem.grad_coefficients(w, clip=clip) @ self.problem.x), clip)

    def noisy_gradient(self, w: np.ndarray) -> np.ndarray:
        """One ``"step"`` release: ``(gradient_sum(w) + N(0, (z C)^2 I)) / n``, the noisy mean gradient
        of the logistic part (no regulariser)."""
        g = self.releases.phase("step").release("grad", lambda idx, clip: self.gradient_sum(w, clip))
        self._grad_evals += self.problem.n
        return g.numpy()

    def state_dict(self) -> dict[str, Any]:
        arrays = {name: getattr(self, f"_{name}").tolist() for name in self.state_arrays}
        return {**arrays, "grad_evals": self._grad_evals, "releases": self.releases.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.state_arrays:
            setattr(self, f"_{name}", np.asarray(state[name], dtype=np.float64))
        self._grad_evals = int(state["grad_evals"])
        self.releases.load_state_dict(state.get("releases", {}))

    @property
    def grad_evals(self) -> int:
        """Per-sample gradient evaluations performed so far."""
        return self._grad_evals

    @property
    def passes(self) -> float:
        """Per-sample gradient evaluations divided by n."""
        return self._grad_evals / self.problem.n if self.problem is not None else 0.0
