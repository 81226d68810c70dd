"""Shared plumbing of the worst-group algorithms (``docs/algorithms/worst_group.md``).

* :class:`WorstGroupConfig`: the hyper-parameters every worst-group algorithm has (loss bound B,
  how group sizes become known, the parameter ball W);
* :class:`WorstGroupAlgorithm`: the base class. It binds the algorithm's
  :class:`~privopt.algorithms.releases.ReleasePlan` to the run (through
  :class:`~privopt.algorithms.worst_group_plan.GroupReleaseRun`), reads the training
  records' group ids, releases the group sizes (Laplace on the histogram, once, before anything
  else uses them) unless they are public, keeps the model as a flat vector and averages iterates;
* the λ-player's updates on the probability simplex (multiplicative weights and EXP3), through
  the entropic mirror map of :mod:`privopt.algorithms.mirror`.

Group sizes matter only as *normalisers* (a group's mean loss is its loss sum over its size):
they never enter the accounting, so the noisy sizes are post-processing. Sampling rates are
public configuration, fixed before any data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from privopt.algorithms.base import Algorithm, RunContext
from privopt.algorithms.config import AlgorithmConfig, flag, one_of, optional_positive, param, positive, positive_int
from privopt.algorithms.mirror import get_geometry
from privopt.algorithms.releases import DrawnBatch, Fixed, Phase, Query, ReleasePlan
from privopt.algorithms.worst_group_plan import GroupReleaseRun
from privopt.errors import ConfigError, DataError
from privopt.grads.flat import trainable_parameters
from privopt.grads.sums import BoundedSum, batch_losses, chunked_clipped_sum, clamped_losses

__all__ = [
    "WorstGroupAlgorithm",
    "WorstGroupConfig",
    "exp3_step",
    "group_ids",
    "group_loss_sums",
    "hedge_step",
]

COUNTS = "group-counts"


@dataclass(frozen=True)
class WorstGroupConfig(AlgorithmConfig):
    """Hyper-parameters every worst-group algorithm has.

    Attributes:
        loss_bound: B; per-record losses are clamped to ``[0, B]`` before any loss release.
        group_sizes: ``"private"`` (release the training group histogram with Laplace noise of
            scale ``count_noise`` records, an ``1/count_noise``-DP release accounted in the run)
            or ``"public"`` (read ``public_meta["group_sizes_train"]``, e.g. the synthetic
            generator's sizes; an error for data that does not publish them).
        count_noise: Laplace scale (in records) of the group-size release.
        radius: W = ℓ2 ball of this radius around the initial parameters (``None``: no projection).
        chunk_size: records per chunk of per-sample computations.
        private: ``False`` makes the same updates without noise (a non-private reference).
    """

    loss_bound: float = param(5.0, positive)
    group_sizes: str = param("private", one_of("private", "public"))
    count_noise: float = param(20.0, positive)
    radius: float | None = param(None, optional_positive)
    chunk_size: int = param(16384, positive_int)
    private: bool = param(True, flag)


def group_ids(ctx: RunContext) -> tuple[torch.Tensor, int]:
    """``(group id of every training record, number of groups)`` from the run's dataset.

    The dataset is ``ctx.extra["dataset"]`` (a :class:`privopt.data.Dataset` with ``g_train``);
    tests may pass ``ctx.extra["groups"]`` and ``ctx.extra["num_groups"]`` instead.
    """
    if "groups" in ctx.extra:
        g = torch.as_tensor(ctx.extra["groups"]).long()
        return g, int(ctx.extra.get("num_groups", int(g.max()) + 1))
    data = ctx.extra.get("dataset")
    if data is None or getattr(data, "g_train", None) is None:
        raise DataError(
            "worst-group algorithms need group ids: use a dataset with groups (adult, celeba, synthetic-groups, or "
            "Dataset.from_tensors(..., groups=...))"
        )
    return data.g_train.long(), int(data.num_groups or int(data.g_train.max()) + 1)


@torch.no_grad()
def group_loss_sums(model, loss_fn, x, y, groups, *, num_groups: int, bound: float, params=None, chunk=4096):
    """``s_i = Σ_{records of group i} clamp(ℓ, 0, B)`` as a p-vector with per-record bound B.

    One record moves one coordinate by at most B: its L1 (and L2) contribution is B, the bound a
    Laplace release of the vector or a report-noisy-max over it reads.
    """
    losses = clamped_losses(batch_losses(model, loss_fn, x, y, params=params, chunk=chunk), bound)  # NaN: 0
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, groups, losses)
    return BoundedSum(sums, bound=bound)


def hedge_step(lam: np.ndarray, gains, *, step: float) -> np.ndarray:
    """Multiplicative weights towards high ``gains``: ``λ_i ∝ λ_i·exp(step·gain_i)`` (entropic
    mirror step with gradient ``−gains``).

    Example:
        >>> hedge_step(np.array([0.5, 0.5]), np.array([np.log(3.0), 0.0]), step=1.0).round(3).tolist()
        [0.75, 0.25]
    """
    simplex = get_geometry("simplex", dim=len(lam))
    return simplex.prox_step(lam, -np.asarray(gains, dtype=np.float64), step=step)


def exp3_step(lam: np.ndarray, *, arm: int, loss: float, prob: float, step: float) -> np.ndarray:
    """EXP3: ``λ_arm ← λ_arm·exp(−step·loss/prob)``, then normalise (the importance-weighted
    loss estimate is non-zero for the pulled arm only).

    Example:
        >>> exp3_step(np.array([0.5, 0.5]), arm=0, loss=np.log(2.0) / 2, prob=0.5, step=1.0).round(4).tolist()
        [0.3333, 0.6667]
    """
    g = np.zeros(len(lam))
    g[arm] = loss / prob
    return get_geometry("simplex", dim=len(lam)).prox_step(lam, g, step=step)


class WorstGroupAlgorithm(Algorithm):
    """Base of the worst-group algorithms (see the module docstring).

    Subclasses implement :meth:`_release_phases` (their own phases of the release plan; the
    group-size release is added here), :meth:`steps_for`, :meth:`step` and :meth:`_state` / :meth:`_load_state`.
    """

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._ctx: RunContext | None = None
        self.releases: GroupReleaseRun | None = None
        self._sizes: torch.Tensor | None = None
        self._avg: torch.Tensor | None = None
        self._avg_count = 0

    # -- the plan ------------------------------------------------------------------------------
    def _release_phases(self, n: int) -> tuple[Phase, ...]:
        raise NotImplementedError

    def release_plan(self, n: int) -> ReleasePlan:
        own = self._release_phases(n)
        if self.config.group_sizes == "private":
            counts = Query(COUNTS, Fixed(1.0), batch=DrawnBatch(n), mechanism="laplace", fixed=self.config.count_noise)
            own = (Phase(COUNTS, 1, (counts,)), *own)
        return ReleasePlan(phases=own)

    def inventory(self, *, n: int):
        return self.release_plan(n).inventory() if self.private else None

    # -- binding -------------------------------------------------------------------------------
    def setup(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self.groups, self.num_groups = group_ids(ctx)
        if self.groups.shape[0] != ctx.n:
            raise DataError(f"{self.groups.shape[0]} group ids for {ctx.n} training records")
        if self.config.group_sizes == "public":  # checked now: before the run writes anything
            self._public_sizes()
        self.releases = GroupReleaseRun(self.release_plan(ctx.n), ctx, private=self.private)
        self._w0 = self._w().clone()
        self._avg, self._avg_count = torch.zeros_like(self._w0, dtype=torch.float64), 0

    def num_steps(self) -> int:
        return self.steps_for(n=self._ctx.n)

    def group_sizes(self) -> torch.Tensor:
        """The group sizes the algorithm normalises by (float64, each >= 1); released on first use."""
        if self._sizes is None:
            self._sizes = self._release_sizes()
        return self._sizes

    def _public_sizes(self) -> torch.Tensor:
        data = self._ctx.extra.get("dataset")
        public = None if data is None else data.public_meta.get("group_sizes_train")
        if public is None or len(public) != self.num_groups:
            raise ConfigError(
                "group_sizes='public' needs public_meta['group_sizes_train'] with one size per group "
                "(the synthetic generator publishes it); use group_sizes='private' otherwise"
            )
        return torch.tensor([max(1.0, float(s)) for s in public], dtype=torch.float64)

    def _release_sizes(self) -> torch.Tensor:
        if self.config.group_sizes == "public":
            return self._public_sizes()
        counts = torch.bincount(self.groups, minlength=self.num_groups).to(torch.float64)
        noisy = self.releases.laplace(COUNTS, BoundedSum(counts, bound=1.0))
        return noisy.clamp(min=1.0)

    # -- the model as a flat vector --------------------------------------------------------------
    def _w(self) -> torch.Tensor:
        return parameters_to_vector(trainable_parameters(self._ctx.model)).detach()

    def _set_w(self, w: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(w.to(self._w0.dtype), trainable_parameters(self._ctx.model))

    def _project(self, w: torch.Tensor) -> torch.Tensor:
        """Projection onto W (the ball of ``radius`` around the initial parameters); post-processing."""
        r = self.config.radius
        if r is None:
            return w
        d = w - self._w0
        norm = float(d.norm())
        return w if norm <= r else self._w0 + d * (r / norm)

    def _grad_sum(self, idx: torch.Tensor, *, clip: float, weights=None) -> BoundedSum:
        ctx = self._ctx
        xb, yb = ctx.x_train[idx], ctx.y_train[idx]
        return chunked_clipped_sum(
            ctx.engine, ctx.model, ctx.loss_fn, xb, yb, clip=clip, chunk=self.config.chunk_size, weights=weights
        )

    def _group_loss_sums(self) -> BoundedSum:
        ctx, c = self._ctx, self.config
        return group_loss_sums(
            ctx.model, ctx.loss_fn, ctx.x_train, ctx.y_train, self.groups,
            num_groups=self.num_groups, bound=c.loss_bound, chunk=c.chunk_size,
        )  # fmt: skip

    def _accumulate(self, w: torch.Tensor) -> None:
        self._avg += w.to(torch.float64)
        self._avg_count += 1

    def average_iterate(self) -> torch.Tensor:
        """The average of the accumulated iterates (the current one when none was accumulated)."""
        return (self._avg / self._avg_count).to(self._w0.dtype) if self._avg_count else self._w()

    # -- state ---------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {
            "releases": self.releases.state_dict(),
            "sizes": self._sizes,
            "avg": self._avg.clone(),
            "avg_count": self._avg_count,
            "state": self._state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.releases.load_state_dict(state["releases"])
        self._sizes = state["sizes"]
        self._avg, self._avg_count = state["avg"].clone(), int(state["avg_count"])
        self._load_state(state["state"])
