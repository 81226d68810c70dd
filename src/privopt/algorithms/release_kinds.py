"""Release kinds a :class:`~privopt.algorithms.releases.Query` may declare beyond a calibrated Gaussian
on a batch the plan samples (``docs/algorithms/README.md``, "Other mechanisms and disjoint families"):

* ``mechanism``: ``"gaussian"`` (std ``z·C``, L2 bound C), ``"laplace"`` (scale ``b·C`` per
  coordinate, L1 bound C), ``"noisy-max"`` (report-noisy-max with Laplace scale ``b·Δ``: an
  ``1/b``-DP choice) or ``"tree"`` (DP-FTRL's tree of noisy prefix sums over ``tree_steps`` leaves,
  node std ``z·C``);
* ``fixed``: a fixed multiplier, accounted but not calibrated;
* ``disjoint``: every release of the family uses records no other release of it used (parallel
  composition): the family is accounted once per phase that declares it;
* :class:`DrawnBatch`: records the algorithm draws itself (group oracles, a Poisson batch inside one
  group), with the sampling the accountant reads;
* :class:`PublicBound`: the per-record bound is computed at each release from public quantities
  (a phase index, released group sizes) and carried by the statistic.

Example:
    >>> from privopt.algorithms.releases import Fixed, Query
    >>> q = Query("losses", Fixed(1.0), batch=DrawnBatch(n=100), mechanism="laplace", ratio=2.0)
    >>> planned_entry(q)[:2], mechanism_of(q, 3.0)
    (('losses', 2.0), Laplace(scale_multiplier=3.0, name='losses', kind='laplace'))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from privopt.errors import ConfigError
from privopt.privacy import (
    FullBatch,
    Gaussian,
    Laplace,
    PureDP,
    TreeAggregation,
    laplace_family,
    noisy_max_family,
    tree_family,
)

__all__ = ["MECHANISMS", "DrawnBatch", "PublicBound", "check_kind", "gaussian_only", "planned_entry", "mechanism_of"]

MECHANISMS = ("gaussian", "laplace", "noisy-max", "tree")


@dataclass(frozen=True)
class DrawnBatch:
    """Records the algorithm draws itself; ``sampling`` (``FullBatch()`` or ``Poisson(q)``) is what
    the accountant reads. The algorithm normalises its own statistic (``normalizer`` 1)."""

    n: int
    sampling: Any = field(default_factory=FullBatch)
    normalizer: float = 1.0

    def sampler(self, rng):
        raise ConfigError("a drawn batch is sampled by the algorithm (group oracles), not by the plan")


@dataclass(frozen=True)
class PublicBound:
    """The per-record bound is computed at each release from public quantities and carried by the
    statistic (e.g. a phase's output-perturbation sensitivity); there is no clip threshold."""

    factor: float = 1.0

    def threshold(self, distance: float | None = None) -> float:
        raise ConfigError("a release with a public, per-release bound has no clip threshold: the statistic carries it")


def check_kind(q) -> None:
    """Refuse an inconsistent declaration early (called by ``Query``)."""
    if q.mechanism not in MECHANISMS:
        raise ConfigError(f"query {q.name!r}: mechanism must be one of {MECHANISMS}, got {q.mechanism!r}")
    if q.mechanism == "tree" and not (isinstance(q.tree_steps, int) and q.tree_steps >= 1):
        raise ConfigError(f"tree query {q.name!r} needs tree_steps (leaves) >= 1")
    if q.fixed is not None and not q.fixed > 0:
        raise ConfigError(f"query {q.name!r}: a fixed multiplier must be > 0, got {q.fixed!r}")


def planned_entry(q):
    """The inventory entry of ``q``: a fixed mechanism object or a calibrated family."""
    if q.fixed is not None:
        return mechanism_of(q, q.fixed)
    if q.mechanism == "gaussian":
        return (q.name, q.ratio)
    if q.mechanism == "laplace":
        return laplace_family(q.name, ratio=q.ratio)
    if q.mechanism == "noisy-max":
        return noisy_max_family(q.name, ratio=q.ratio)
    return tree_family(q.name, steps=q.tree_steps, ratio=q.ratio)


def mechanism_of(q, multiplier: float):
    """The accounting mechanism of one release of ``q`` with ``multiplier``."""
    m = float(multiplier)
    if q.mechanism == "gaussian":
        return Gaussian(m, name=q.name)
    if q.mechanism == "laplace":
        return Laplace(m, name=q.name)
    if q.mechanism == "noisy-max":
        return PureDP(1.0 / m, name=q.name)
    return TreeAggregation(m, steps=q.tree_steps, name=q.name)


def gaussian_only(plan) -> None:
    """Refuse a plan :class:`~privopt.algorithms.releases.PlanRun` cannot run: it makes calibrated
    Gaussian releases on batches it samples; other kinds need their algorithm's runtime."""
    other = [
        q.name
        for p in plan.phases
        for q in p.queries
        if (q.mechanism, q.fixed, q.disjoint) != ("gaussian", None, False)
    ]
    if other:
        raise ConfigError(f"PlanRun makes calibrated Gaussian releases only; {other} need their algorithm's runtime")
