"""Replace-one neighbours across groups for the worst-group algorithms (``tests/test_cross_group_neighbours.py``).

A record of group A replaced by a record of group B changes two groups at once. To measure what
that does to each noisy release *conditionally on everything released before it* (the quantity
adaptive composition charges), the neighbour is replayed on the first world's transcript:
:func:`run_world` records, release by release, the pre-noise statistic each mechanism noises (for
DP-FTRL's tree: the node that closes), the per-record bound and noise spread it was given and
what the algorithm received; given another world's releases it hands those to the algorithm
instead of its own, so both worlds take the same path and only the statistics differ.

:func:`spent` and :func:`charged` then compare, family by family, what the pair of worlds costs
with the noise actually drawn (Gaussian and tree: Σ (movement / std)², the Rényi divergence per
unit of order; Laplace: Σ ‖movement‖₁ / scale, the pure ε) with what the run's ledger charged for
the family, read from its recorded dp_accounting event (the neighbouring relation's factor
included), nothing hard-coded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import torch

from privopt.algorithms import get_algorithm
from privopt.algorithms.worst_group_plan import GroupReleaseRun, TreeAggregator
from privopt.grads.release import observe_releases
from privopt.grads.sums import as_bounded
from privopt.privacy import PrivacyLedger, calibrate, to_dp_event
from wg_helpers import make_ctx


@dataclass
class Release:
    """One noisy release as a mechanism saw it."""

    name: str
    value: torch.Tensor  # the pre-noise statistic (float64, flat)
    bound: float  # the per-record bound the noise was scaled with
    spread: float  # the noise's std (Gaussian, tree node) or scale (Laplace)
    out: torch.Tensor  # what the algorithm received


def _flat(value) -> torch.Tensor:
    return torch.as_tensor(value).detach().to(torch.float64).reshape(-1).clone()


def run_world(monkeypatch, algo, *, forced: list[Release] | None = None) -> list[Release]:
    """Run ``algo`` (set up) to its end, recording every release (its bound and noise spread as the
    runtime reported them); with ``forced``, the algorithm receives ``forced[k].out`` for its k-th
    release (which must be of the same family)."""
    seen: list[Release] = []
    events: list = []

    def give(rel: Release):
        k = len(seen)
        seen.append(rel)
        if forced is None:
            return rel.out
        assert forced[k].name == rel.name, "the same transcript must lead to the same releases"
        return forced[k].out.clone().reshape(rel.out.shape).to(rel.out.dtype)

    def wrap(real):
        def release(self, name, stat, **kw):
            before = len(events)
            out = real(self, name, stat, **kw)
            (event,) = events[before:]  # what the runtime noised it with
            return give(Release(name, _flat(as_bounded(stat).value), event.bound, event.noise_std, out))

        return release

    real_add = TreeAggregator.add

    def add(self, leaf, *, indices=None):
        out = real_add(self, leaf, indices=indices)
        level = (self.t & -self.t).bit_length() - 1  # the node that closed with this leaf
        return give(Release("ftrl-tree", _flat(self._exact[level]), self.bound, self.std, out))

    with monkeypatch.context() as mp, observe_releases(events.append):
        mp.setattr(GroupReleaseRun, "gaussian", wrap(GroupReleaseRun.gaussian))
        mp.setattr(GroupReleaseRun, "laplace", wrap(GroupReleaseRun.laplace))
        mp.setattr(TreeAggregator, "add", add)
        for t in range(algo.num_steps()):
            algo.step(t)
    return seen


def private_algo(name, data, x, y, groups, *, epsilon, delta=1e-3, neighbouring="replace_one", **params):
    """``name`` set up for a private run on ``(x, y, groups)`` with noise calibrated for ``neighbouring``
    (RDP), a ledger of that relation and fixed seeds (the same keys and noise in every world)."""
    algo = get_algorithm(name, **params)
    ctx, _ = make_ctx(data, x=x, y=y, groups=groups, model="logreg")
    ctx.extra["dataset"] = data  # for group_sizes="public"; the group ids are the ones given
    inv = algo.inventory(n=len(y))
    cal = calibrate(inv, epsilon=epsilon, delta=delta, neighbouring=neighbouring, accountant="rdp")
    ctx.noise = dict(cal.noise)
    ctx.ledger = PrivacyLedger(
        delta=delta, neighbouring=neighbouring, accountant="rdp", target_epsilon=epsilon,
        planned=inv.steps_for(cal.noise),
    )  # fmt: skip
    algo.setup(ctx)
    return algo, ctx


def charged(ledger, family: str) -> float:
    """What the ledger charged for ``family``: Gaussian and tree in Σ (sensitivity / std)² (a tree:
    over the nodes one record may touch), Laplace in Σ sensitivity / scale, times its count."""
    steps = [(s, k) for s, k in ledger.counts.items() if any(m.name == family for m in s.mechanisms)]
    assert len(steps) == 1 and len(steps[0][0].mechanisms) == 1, (family, steps)
    step, count = steps[0]
    event = to_dp_event(step, neighbouring=ledger.neighbouring)
    if isinstance(event, dpa.GaussianDpEvent):
        return count / event.noise_multiplier**2
    if isinstance(event, dpa.LaplaceDpEvent):
        return count / event.noise_multiplier
    assert isinstance(event, dpa.SingleEpochTreeAggregationDpEvent), event
    depth = math.ceil(math.log2(max(event.step_counts) + 1))
    return count * depth / event.noise_multiplier**2


def spent(world: list[Release], other: list[Release], family: str) -> float:
    """What the pair of worlds costs ``family`` with the noise drawn (the units of :func:`charged`)."""
    pairs = [(a, b) for a, b in zip(world, other, strict=True) if a.name == family]
    assert pairs and all(a.spread == b.spread > 0 for a, b in pairs), family  # data-independent noise
    if family in ("group-counts", "bandit-loss"):  # Laplace
        return sum(float((a.value - b.value).abs().sum()) / a.spread for a, b in pairs)
    return sum((float((a.value - b.value).norm()) / a.spread) ** 2 for a, b in pairs)


def moved(world: list[Release], other: list[Release], family: str) -> list[float]:
    """Per release of ``family``: how far its statistic moved, in units of its per-record bound
    (L1 for the Laplace families, L2 otherwise)."""
    out = []
    for a, b in zip(world, other, strict=True):
        if a.name == family:
            d = a.value - b.value
            norm = d.abs().sum() if family in ("group-counts", "bandit-loss") else d.norm()
            out.append(float(norm) / a.bound)
    return out
