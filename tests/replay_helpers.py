"""Replaying a neighbouring dataset on the first world's transcript (shared by
``tests/test_cross_group_neighbours.py`` and ``tests/test_selection_neighbours.py``).

Adaptive composition charges each noisy release for what one record can do to it *conditionally on
everything released before it*. To measure that, a run on D records, release by release, the
pre-noise statistic each mechanism noised, the per-record bound and noise spread the runtime used
and what the algorithm received (:class:`Transcript`); the neighbour D' is then replayed with every
release handing the algorithm D's value instead of its own, so both worlds see the same public
history and take the same path, and only the statistics differ.

:func:`spent` and :func:`charged` then compare, family by family, what the pair of worlds costs
with the noise actually drawn (Gaussian and tree: Σ (movement / std)², the Rényi divergence per
unit of order; Laplace: Σ ‖movement‖₁ / scale, the pure ε) with what the run's ledger charged for
the family, read from its recorded dp_accounting event (the neighbouring relation's factor
included), nothing hard-coded; :func:`accounted_sensitivity` is the same reading for one Gaussian
release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import torch

from privopt.privacy import to_dp_event

LAPLACE_FAMILIES = ("group-counts", "bandit-loss")


@dataclass
class Release:
    """One noisy release as a mechanism saw it."""

    name: str
    value: torch.Tensor  # the pre-noise statistic (float64, flat)
    bound: float  # the per-record bound the noise was scaled with
    spread: float  # the noise's std (Gaussian, tree node) or scale (Laplace)
    out: torch.Tensor  # what the algorithm received
    source: int = 0  # who released it (a client's index; 0 where there is one releaser)


def flat(value) -> torch.Tensor:
    """``value`` as a detached flat float64 copy."""
    return torch.as_tensor(value).detach().to(torch.float64).reshape(-1).clone()


class Transcript:
    """A world's releases, in order. Replaying ``forced`` (another world's transcript), the k-th
    release hands the algorithm ``forced[k].out`` (it must be of the same family and releaser)."""

    def __init__(self, forced: list[Release] | None = None):
        self.seen: list[Release] = []
        self.forced = forced

    def give(self, rel: Release) -> torch.Tensor:
        """Record ``rel``; return what the algorithm receives."""
        k = len(self.seen)
        self.seen.append(rel)
        if self.forced is None:
            return rel.out
        assert k < len(self.forced), "the replay made more releases than the transcript holds"
        want = self.forced[k]
        assert (want.name, want.source) == (rel.name, rel.source), "the same transcript must lead to the same releases"
        return want.out.clone().reshape(rel.out.shape).to(rel.out.dtype)


def accounting_event(ledger, family: str):
    """``(event, count)``: the dp_accounting event of the ledger's one step releasing ``family``
    (under the ledger's neighbouring relation) and how often it was recorded."""
    steps = [(s, k) for s, k in ledger.counts.items() if any(m.name == family for m in s.mechanisms)]
    assert len(steps) == 1 and len(steps[0][0].mechanisms) == 1, (family, steps)
    step, count = steps[0]
    return to_dp_event(step, neighbouring=ledger.neighbouring), count


def accounted_sensitivity(ledger, family: str, spread: float) -> float:
    """The L2 movement a Gaussian release of ``family`` with noise std ``spread`` is charged for:
    ``spread / z_event``, the event's multiplier having the relation's factor folded in."""
    event, _ = accounting_event(ledger, family)
    assert isinstance(event, dpa.GaussianDpEvent), event
    return spread / event.noise_multiplier


def charged(ledger, family: str) -> float:
    """What the ledger charged for ``family``: Gaussian and tree in Σ (sensitivity / std)² (a tree:
    over the nodes one record may touch), Laplace in Σ sensitivity / scale, times its count."""
    event, count = accounting_event(ledger, family)
    if isinstance(event, dpa.GaussianDpEvent):
        return count / event.noise_multiplier**2
    if isinstance(event, dpa.LaplaceDpEvent):
        return count / event.noise_multiplier
    assert isinstance(event, dpa.SingleEpochTreeAggregationDpEvent), event
    depth = math.ceil(math.log2(max(event.step_counts) + 1))
    return count * depth / event.noise_multiplier**2


def _pairs(world, other, family, source):
    return [
        (a, b) for a, b in zip(world, other, strict=True) if a.name == family and (source is None or a.source == source)
    ]


def spent(world: list[Release], other: list[Release], family: str, *, source: int | None = None) -> float:
    """What the pair of worlds costs ``family`` (of releaser ``source``; None: all) with the noise
    drawn (the units of :func:`charged`)."""
    pairs = _pairs(world, other, family, source)
    assert pairs and all(a.spread == b.spread > 0 for a, b in pairs), family  # data-independent noise
    if family in LAPLACE_FAMILIES:
        return sum(float((a.value - b.value).abs().sum()) / a.spread for a, b in pairs)
    return sum((float((a.value - b.value).norm()) / a.spread) ** 2 for a, b in pairs)


def moved(world: list[Release], other: list[Release], family: str, *, source: int | None = None) -> list[float]:
    """Per release of ``family`` (of releaser ``source``; None: all): how far its statistic moved,
    in units of its per-record bound (L1 for the Laplace families, L2 otherwise)."""
    out = []
    for a, b in _pairs(world, other, family, source):
        d = a.value - b.value
        norm = d.abs().sum() if family in LAPLACE_FAMILIES else d.norm()
        out.append(float(norm) / a.bound)
    return out
