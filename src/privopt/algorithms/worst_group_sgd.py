"""Noisy-SGD with Multiplicative Group Reweighting (``noisy-sgd-mgr``) and with Active Group
Selection (``noisy-sgd-ags``): offline worst-group ERM by noisy SGD on one group per step.

Each of the T steps picks a group ``i_t``, samples a Poisson batch from it (rate ``q``, the same
for every group) and takes a projected step along the noisy mean of per-sample clipped gradients.

* MGR picks ``i_t ~ λ_t`` and moves λ by multiplicative weights on the p group losses of the whole
  training set at ``w_t``, released with Laplace noise (``λ_i ∝ λ_i·exp(η_λ·L̂_i)``);
* AGS picks ``i_t = argmax_i L̂_i`` by report-noisy-max over the same group losses.

Privacy (``docs/algorithms/worst_group.md``, "Noisy-SGD-MGR"): the gradient of a step is
a Poisson(q)-subsampled Gaussian for the records of the chosen group and independent of the
others; it is accounted as a Poisson(q) Gaussian for EVERY record (the group choice gives no
amplification one may rely on). The group losses are clamped to ``[0, B]``: one record moves one
coordinate of the loss-sum vector by at most B (Laplace scale ``b·B`` on the sums; report-noisy-max
with scale ``b·B/min_i n̂_i`` on the means is ``1/b``-DP). Gradient and loss noise are calibrated
jointly; the loss family's multiplier is ``ratio × z``, by default ``1/(2q)``, which makes the
two families' per-step Rényi divergences about equal (subsampled Gaussian ≈ ``2q²α/z²``,
Laplace ≈ ``α/(2b²)`` for small noise-to-signal ratios). No convexity is needed for privacy: any
``nn.Module`` works; the utility guarantees of the paper hold for convex losses only.

Example (each step releases the gradient and, per method, the noisy losses or the noisy choice):
    >>> from privopt.algorithms import get_algorithm
    >>> for name in ("noisy-sgd-mgr", "noisy-sgd-ags"):
    ...     algo = get_algorithm(name, batch_size=50, epochs=0.5, group_sizes="public")
    ...     print(name, [(s.mechanisms[0][0], s.count) for s in algo.inventory(n=1000).steps])
    noisy-sgd-mgr [('grad', 10), ('group-losses', 10)]
    noisy-sgd-ags [('grad', 10), ('group-choice', 10)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import RunContext, register_algorithm
from privopt.algorithms.config import one_of, optional_positive, param, positive, positive_int
from privopt.algorithms.releases import DrawnBatch, Fixed, Phase, PublicBound, Query
from privopt.algorithms.worst_group_common import WorstGroupAlgorithm, WorstGroupConfig, hedge_step
from privopt.errors import ConfigError
from privopt.grads.flat import num_trainable
from privopt.grads.sums import BoundedSum
from privopt.privacy import Poisson

__all__ = ["GroupSGDConfig", "NoisySGDMGR", "NoisySGDAGS", "NoisySGDMGRConfig", "NoisySGDAGSConfig", "group_rate"]

GRAD, LOSSES, PICK = "grad", "group-losses", "group-choice"


def group_rate(*, batch_size: int, n: int) -> float:
    """The within-group Poisson rate ``q = batch_size/n``: DP-SGD's rate for batches of
    ``batch_size``; a step on group i uses ``q·n_i`` of its records in expectation.

    Example:
        >>> group_rate(batch_size=64, n=4000)
        0.016
    """
    if batch_size > n:
        raise ConfigError(f"batch_size {batch_size} exceeds the training set size {n}")
    return batch_size / n


@dataclass(frozen=True)
class GroupSGDConfig(WorstGroupConfig):
    """Hyper-parameters shared by Noisy-SGD-MGR and Noisy-SGD-AGS.

    Attributes:
        lr: step size η_w on the model parameters.
        clip: per-sample gradient clip threshold (the Lipschitz constant L of the analysis).
        batch_size: sets the within-group rate ``q = batch_size/n`` (DP-SGD's rate for this batch).
        epochs: T = ⌈epochs / q⌉ steps (the accounting schedule of DP-SGD run for ``epochs`` at rate q).
        loss_noise_ratio: the loss family's noise multiplier over the gradient's (``None``: 1/(2q)).
        output: ``"average"`` (the paper) or ``"last"`` iterate.
        normalize: ``"group"`` divides the chosen group's noisy gradient sum by its expected batch
            ``q·n̂_i`` (the paper's batch mean; the noise on it grows like 1/n̂_i), ``"common"`` by
            ``q·n/p`` for every group (DP-SGD's noise level; group i's step is scaled by n̂_i·p/n,
            which the λ-player's weights absorb: the game's minimax point in w is unchanged).
    """

    lr: float = param(0.5, positive, role="lr")
    clip: float = param(1.0, positive, role="clip")
    batch_size: int = param(64, positive_int, role="batch")
    epochs: float = param(5.0, positive, role="epochs")
    loss_noise_ratio: float | None = param(None, optional_positive)
    output: str = param("average", one_of("average", "last"), role="output")
    normalize: str = param("common", one_of("group", "common"))


@dataclass(frozen=True)
class NoisySGDAGSConfig(GroupSGDConfig):
    """AGS's choice rule: ``"noisy-max"`` (the paper: report-noisy-max with ONE Laplace scale
    ``b·B/min_i n̂_i`` for every group mean, charged as ``PureDP(1/b)``) or ``"noisy-losses"``
    (the argmax of the group means released with Laplace noise ``b·B`` on each loss SUM, i.e.
    ``b·B/n̂_i`` on group i's mean, charged as ``Laplace(b)``; identical to the paper's rule when
    groups have equal sizes, and far less noisy for large groups when they do not)."""

    choice: str = param("noisy-max", one_of("noisy-max", "noisy-losses"))


@dataclass(frozen=True)
class NoisySGDMGRConfig(GroupSGDConfig):
    """Noisy-SGD-MGR adds the λ-player's step ``lam_lr`` (``None``: ``√(log p / (U² T))`` with
    ``U = B + 3·(Laplace scale of a group mean)·log(pT)``, the shift that keeps the noisy gains in
    ``[0, 2U]`` with high probability)."""

    lam_lr: float | None = param(None, optional_positive)


class _GroupSGD(WorstGroupAlgorithm):
    """Shared step of MGR and AGS: a projected noisy-SGD step on a Poisson batch of one group."""

    def _rate(self, n: int) -> float:
        return group_rate(batch_size=self.config.batch_size, n=n)

    def steps_for(self, *, n: int) -> int:
        return max(1, math.ceil(self.config.epochs / self._rate(n)))

    def _loss_ratio(self, n: int) -> float:
        r = self.config.loss_noise_ratio
        return r if r is not None else 1.0 / (2.0 * self._rate(n))

    def _step_phase(self, n: int, choice: Query) -> tuple[Phase, ...]:
        """One phase per step: the gradient on a Poisson(q) batch of the chosen group, and ``choice``."""
        grad = Query(GRAD, Fixed(self.config.clip), batch=DrawnBatch(n, Poisson(self._rate(n))))
        return (Phase("step", self.steps_for(n=n), (grad, choice)),)

    def _losses_query(self, n: int) -> Query:
        c = self.config
        return Query(LOSSES, Fixed(c.loss_bound), batch=DrawnBatch(n), mechanism="laplace", ratio=self._loss_ratio(n))

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.q = self._rate(ctx.n)
        self.members = [torch.nonzero(self.groups == i).squeeze(1) for i in range(self.num_groups)]
        self.dim = num_trainable(ctx.model)

    def _sgd_step(self, group: int) -> None:
        """Poisson batch of ``group`` at rate q → noisy clipped mean gradient → projected step."""
        members = self.members[group]
        idx = members[self._ctx.sampler_rng.uniform(members.numel()) < self.q]
        c = self.config
        stat = self._grad_sum(idx, clip=c.clip) if idx.numel() else BoundedSum(torch.zeros(self.dim), bound=c.clip)
        size = float(self.group_sizes()[group]) if c.normalize == "group" else self._ctx.n / self.num_groups
        grad = self.releases.gaussian(GRAD, stat, normalizer=self.q * size)
        w = self._project(self._w() - c.lr * grad.to(self._w0.dtype))
        self._set_w(w)
        self._accumulate(w)

    def _noisy_group_means(self) -> torch.Tensor:
        """Laplace-privatised group losses at the current parameters: ``(s_i + Lap(b·B)) / n̂_i``."""
        return self.releases.laplace(LOSSES, self._group_loss_sums()) / self.group_sizes()

    def finalize(self) -> None:
        if self.config.output == "average":
            self._set_w(self.average_iterate())


@register_algorithm
class NoisySGDMGR(_GroupSGD):
    """Noisy-SGD with Multiplicative Group Reweighting: each step's group is drawn from λ_t, and λ moves
    by multiplicative weights on the Laplace-noised group losses (see the module docstring)."""

    name = "noisy-sgd-mgr"
    summary = "Noisy-SGD-MGR: noisy SGD on a λ-sampled group, multiplicative weights on Laplace-noised group losses"
    Config = NoisySGDMGRConfig

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.lam = np.full(self.num_groups, 1.0 / self.num_groups)

    def _release_phases(self, n: int) -> tuple[Phase, ...]:
        return self._step_phase(n, self._losses_query(n))

    def _lam_lr(self) -> float:
        c = self.config
        if c.lam_lr is not None:
            return c.lam_lr
        T, p = self.num_steps(), self.num_groups
        scale = self.releases.multiplier(LOSSES) * c.loss_bound / float(self.group_sizes().min()) if self.private else 0
        U = c.loss_bound + 3.0 * scale * math.log(p * T)
        return math.sqrt(math.log(max(p, 2)) / (U**2 * T))

    def step(self, t: int) -> dict[str, float]:
        losses = self._noisy_group_means()  # at w_t, as the gradient below
        u = float(self._ctx.sampler_rng.uniform(1))
        group = min(int(np.searchsorted(np.cumsum(self.lam), u, side="right")), self.num_groups - 1)
        self._sgd_step(group)
        self.lam = hedge_step(self.lam, losses.numpy(), step=self._lam_lr())
        return {"group": float(group), **{f"lambda_{i}": float(v) for i, v in enumerate(self.lam)}}

    def _state(self) -> dict[str, Any]:
        return {"lam": self.lam.copy()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.lam = np.asarray(state["lam"], dtype=np.float64)


@register_algorithm
class NoisySGDAGS(_GroupSGD):
    """Noisy-SGD with Active Group Selection: each step trains on the group that report-noisy-max picks
    as the worst (``choice="noisy-max"``) or on the argmax of the Laplace-noised group losses
    (``choice="noisy-losses"``; see the module docstring)."""

    name = "noisy-sgd-ags"
    summary = "Noisy-SGD-AGS: noisy SGD on the group chosen by report-noisy-max over the group losses"
    Config = NoisySGDAGSConfig

    def _release_phases(self, n: int) -> tuple[Phase, ...]:
        if self.config.choice == "noisy-losses":
            return self._step_phase(n, self._losses_query(n))
        # Δ = B / min n̂: public once the sizes are released
        pick = Query(PICK, PublicBound(), batch=DrawnBatch(n), mechanism="noisy-max", ratio=self._loss_ratio(n))
        return self._step_phase(n, pick)

    def _choose(self) -> int:
        if self.config.choice == "noisy-losses":
            return int(torch.argmax(self._noisy_group_means()))  # post-processing of the noisy losses
        sizes = self.group_sizes()
        sums = self._group_loss_sums()
        means = BoundedSum(sums.value / sizes, bound=self.config.loss_bound / float(sizes.min()))
        return self.releases.noisy_max(PICK, means)

    def step(self, t: int) -> dict[str, float]:
        group = self._choose()
        self._sgd_step(group)
        return {"group": float(group)}
