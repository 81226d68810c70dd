"""The runtime of the worst-group algorithms' release plans (``docs/algorithms/worst_group.md``,
"Privacy inventory").

Each worst-group algorithm declares its releases as a :class:`~privopt.algorithms.releases.ReleasePlan`
(the project's one declaration type), whose queries use the kinds of
:mod:`privopt.algorithms.release_kinds`: Laplace-privatised losses, report-noisy-max choices,
DP-FTRL's tree of noisy prefix sums, Gaussian output perturbations on disjoint parts of the data,
and batches the algorithm draws itself with its group oracles. :class:`GroupReleaseRun` makes those
releases: it records each in the ledger before drawing its noise, refuses a family beyond its planned
count, a record reused by a disjoint family, and a statistic whose per-record bound exceeds a fixed
declared one.

Multipliers are per unit of the release's per-record bound ``C``: Gaussian std ``z·C`` (L2),
Laplace scale ``b·C`` (L1), report-noisy-max Laplace scale ``b·Δ`` (an ``1/b``-DP choice), tree
node std ``z·C``.

Example:
    >>> from privopt.algorithms.releases import DrawnBatch, Fixed, Phase, PublicBound, Query, ReleasePlan
    >>> from privopt.privacy import Poisson
    >>> n = 1000
    >>> plan = ReleasePlan(phases=(
    ...     Phase("step", 100, (
    ...         Query("grad", Fixed(1.0), batch=DrawnBatch(n, Poisson(0.1))),
    ...         Query("losses", Fixed(5.0), batch=DrawnBatch(n), mechanism="laplace", ratio=2.0))),
    ...     Phase("phase", 5, (Query("out", PublicBound(), batch=DrawnBatch(n), disjoint=True),)),
    ... ))
    >>> [(s.mechanisms[0][0], s.count) for s in plan.inventory().steps]
    [('grad', 100), ('losses', 100), ('out', 1)]
"""

from __future__ import annotations

from typing import Any

import torch

from privopt.algorithms.release_kinds import mechanism_of
from privopt.algorithms.releases import Fixed, Query, ReleasePlan, ReleasePlanExceeded
from privopt.errors import ConfigError
from privopt.grads.release import ReleaseEvent, draw_gaussian_noise, draw_laplace_noise, notify_release
from privopt.grads.sums import BoundedSum, as_bounded
from privopt.privacy import Step

__all__ = ["GroupReleaseRun", "TreeAggregator"]


class GroupReleaseRun:
    """A plan bound to a run: records every release in the ledger BEFORE drawing its noise.

    Args:
        plan: the algorithm's :class:`~privopt.algorithms.releases.ReleasePlan`.
        ctx: the run context (``ledger``, ``noise``, ``noise_rng``).
        private: ``False`` releases the exact statistics (no noise, no ledger): reference runs.
    """

    def __init__(self, plan: ReleasePlan, ctx, *, private: bool):
        self.plan, self._ctx, self._private = plan, ctx, private
        self._planned = plan.family_counts()
        self._released: dict[str, int] = {}
        self._used: dict[str, torch.Tensor] = {}

    @property
    def private(self) -> bool:
        return self._private

    def multiplier(self, name: str) -> float:
        """The family's noise multiplier (calibrated, or the plan's fixed value)."""
        rel = self.plan.query(name)
        if rel.fixed is not None:
            return float(rel.fixed)
        if name not in self._ctx.noise:
            raise ConfigError(f"no calibrated noise for release {name!r}: was the run built from this plan?")
        return float(self._ctx.noise[name])

    def _begin(self, name: str, indices: torch.Tensor | None, bound: float | None = None) -> Query:
        """Count one release of ``name`` (refused beyond the plan), check its bound and disjointness,
        record it."""
        rel = self.plan.query(name)
        k = self._released.get(name, 0) + 1
        if k > self._planned[name]:
            raise ReleasePlanExceeded(
                f"release {name!r} would be made {k} times, but the plan declares at most {self._planned[name]}: "
                "nothing was recorded or released"
            )
        declared = rel.sensitivity.clip * rel.sensitivity.factor if isinstance(rel.sensitivity, Fixed) else None
        if bound is not None and declared is not None and bound > declared * (1 + 1e-12):
            raise ConfigError(
                f"release {name!r}: the statistic's per-record bound {bound:g} exceeds the plan's {declared:g}"
            )
        if rel.disjoint:
            self.claim(name, indices)
        self._released[name] = k
        ledger = self._ctx.ledger if self._private else None
        if ledger is not None and (not rel.disjoint or k == 1):
            ledger.record(Step(rel.batch.sampling, (mechanism_of(rel, self.multiplier(name)),)))
        return rel

    def claim(self, name: str, indices: torch.Tensor | None) -> None:
        """Mark records as used by family ``name``; refuse any it used before (parallel composition)."""
        if indices is None:
            raise ConfigError(f"release {name!r} is declared disjoint: pass the indices of the records it uses")
        used = self._used.get(name)
        if used is None:
            used = self._used[name] = torch.zeros(self._ctx.n, dtype=torch.bool)
        if bool(used[indices].any()) or indices.unique().numel() != indices.numel():
            raise ConfigError(f"release {name!r} would reuse a record: its releases must use disjoint records")
        used[indices] = True

    def _notify(self, name: str, value: torch.Tensor, std: float, bound: float, rel: Query, norm: float):
        notify_release(ReleaseEvent(name, value.detach().clone(), std, bound, rel.batch.sampling, norm))

    def gaussian(self, name: str, stat, *, normalizer: float = 1.0, indices: torch.Tensor | None = None):
        """``(value + N(0, (z·bound)²)) / normalizer`` of a bounded sum (L2 bound)."""
        stat = as_bounded(stat)
        rel = self._begin(name, indices, stat.bound)
        out, std = stat.value, 0.0
        if self._private:
            std = self.multiplier(name) * stat.bound
            out = out + draw_gaussian_noise(out.shape, std=std, rng=self._ctx.noise_rng, dtype=out.dtype)
        out = out / normalizer
        self._notify(name, out, std, stat.bound, rel, normalizer)
        return out

    def laplace(self, name: str, stat, *, normalizer: float = 1.0, indices: torch.Tensor | None = None):
        """``(value + Lap(b·bound)) / normalizer`` per coordinate; ``bound`` is the L1 bound of one record."""
        stat = as_bounded(stat)
        rel = self._begin(name, indices, stat.bound)
        out, scale = stat.value.to(torch.float64), 0.0
        if self._private:
            scale = self.multiplier(name) * stat.bound
            out = out + draw_laplace_noise(out.shape, scale=scale, rng=self._ctx.noise_rng)
        out = out / normalizer
        self._notify(name, out, scale, stat.bound, rel, normalizer)
        return out

    def noisy_max(self, name: str, values: BoundedSum, *, indices: torch.Tensor | None = None) -> int:
        """Index of the largest ``value_i + Lap(b·Δ)`` (``values.bound`` = Δ, the most one record moves
        any coordinate, in one direction); only the index is released."""
        stat = as_bounded(values)
        if self._private and self._ctx.ledger.neighbouring != "add_remove":
            # Its PureDP(1/b) charge needs one coordinate moving one way (add/remove); a replaced
            # record can lower one coordinate and raise another, which costs 2/b.
            raise ConfigError(f"report-noisy-max {name!r} is charged for add/remove neighbours only")
        rel = self._begin(name, indices, stat.bound)
        v = stat.value.to(torch.float64).reshape(-1)
        if self._private:
            v = v + draw_laplace_noise(v.shape, scale=self.multiplier(name) * stat.bound, rng=self._ctx.noise_rng)
        choice = int(torch.argmax(v))
        self._notify(name, torch.tensor([float(choice)]), 0.0, stat.bound, rel, 1.0)
        return choice

    def tree(self, name: str, *, bound: float, dim: int, state: dict | None = None) -> TreeAggregator:
        """Open the family's tree of noisy prefix sums (recorded once, before any noise); with
        ``state``, reopen a checkpointed tree that was recorded before (nothing is recorded again)."""
        if state is None:
            rel = self._begin(name, None, bound)
        elif self._released.get(name, 0) < 1:
            raise ConfigError(f"tree {name!r} cannot be reopened: it was never opened in this run")
        else:
            rel = self.plan.query(name)
        std = self.multiplier(name) * bound if self._private else 0.0
        claim = lambda idx: self.claim(name, idx)  # every record in at most one leaf
        agg = TreeAggregator(leaves=rel.tree_steps, dim=dim, bound=bound, std=std, rng=self._ctx.noise_rng, claim=claim)
        if state is not None:
            agg.load_state_dict(state)
        return agg

    def state_dict(self) -> dict[str, Any]:
        return {"released": dict(self._released), "used": {k: v.clone() for k, v in self._used.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._released = dict(state.get("released", {}))
        self._used = {k: v.clone() for k, v in state.get("used", {}).items()}


class TreeAggregator:
    """DP-FTRL's noisy prefix sums over a stream of bounded leaves (the binary mechanism).

    Node ``(level k, block j)`` holds the sum of leaves ``j·2^k+1 .. (j+1)·2^k`` plus its own
    N(0, std²) noise, drawn once when the node closes; the prefix sum of leaves ``1..t`` is the
    sum of the nodes of ``t``'s binary decomposition. One leaf is in at most
    ``ceil(log2(T+1))`` nodes: the ``TreeAggregation`` event the plan records.

    Example:
        >>> from privopt.rng import TorchSource
        >>> agg = TreeAggregator(leaves=4, dim=1, bound=1.0, std=0.0, rng=TorchSource(seed=0))
        >>> [agg.add(BoundedSum(torch.tensor([1.0]), bound=1.0)).item() for _ in range(3)]
        [1.0, 2.0, 3.0]
    """

    def __init__(self, *, leaves: int, dim: int, bound: float, std: float, rng, claim=None):
        self.leaves, self.bound, self.std, self._rng, self._claim = leaves, float(bound), float(std), rng, claim
        depth = max(1, int(leaves).bit_length())
        self._exact = torch.zeros(depth + 1, dim, dtype=torch.float64)
        self._noisy = torch.zeros(depth + 1, dim, dtype=torch.float64)
        self.t = 0

    def add(self, leaf, *, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Append one leaf (a bounded sum whose bound is at most the tree's) computed from the records
        ``indices`` (required when the tree belongs to a run: no record may be in two leaves);
        return the noisy prefix sum."""
        leaf = as_bounded(leaf)
        if leaf.bound > self.bound * (1 + 1e-12):
            raise ConfigError(f"tree leaf bound {leaf.bound:g} exceeds the tree's {self.bound:g}")
        if self.t >= self.leaves:
            raise ReleasePlanExceeded(f"the tree has {self.leaves} leaves; a leaf beyond them was refused")
        if self._claim is not None:
            self._claim(indices)
        self.t += 1
        level = (self.t & -self.t).bit_length() - 1  # the node closing now
        self._exact[level] = self._exact[:level].sum(0) + leaf.value.to(torch.float64).reshape(-1)
        self._exact[:level] = 0.0
        self._noisy[:level] = 0.0
        noise = 0.0
        if self.std > 0:
            noise = draw_gaussian_noise(self._exact.shape[1:], std=self.std, rng=self._rng, dtype=torch.float64)
        self._noisy[level] = self._exact[level] + noise
        bits = [k for k in range(self._noisy.shape[0]) if (self.t >> k) & 1]
        return self._noisy[bits].sum(0)

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "exact": self._exact.clone(), "noisy": self._noisy.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t, self._exact, self._noisy = int(state["t"]), state["exact"].clone(), state["noisy"].clone()
