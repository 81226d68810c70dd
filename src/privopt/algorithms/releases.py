"""Release plans: one declaration of an algorithm's noisy releases, for accounting AND for running.

An algorithm declares, for a dataset of ``n`` records, a :class:`ReleasePlan`: the *phases* of
an iteration (e.g. a SPIDER "refresh" and "diff"), how many times each runs, and the named
releases (:class:`Query`) each makes — their batch, per-record sensitivity (a fixed threshold or
a step-proportional one), and whether they ride on another release's batch. From that one
declaration come

* the accounting inventory (:meth:`ReleasePlan.inventory`), from which the noise is calibrated;
* the runtime (:class:`PlanRun`): it samples each batch, opens its
  :class:`~privopt.grads.release.PrivateBatch` with exactly the releases the plan groups on it,
  computes each release's threshold, checks that the statistic's per-record bound is the
  declared one, and refuses any release the plan does not declare or any family beyond its
  planned count.

Batch sharing: with ``share=True``, releases of one phase whose batches have the same sampling
and normaliser are made from ONE sampled batch (one accounting step with several Gaussians).

Example:
    >>> plan = ReleasePlan(share=True, phases=(
    ...     Phase("refresh", count=4, queries=(
    ...         Query("eta-refresh", batch=BatchPlan(500, 1000), sensitivity=Fixed(1.0)),
    ...         Query("x-refresh", batch=BatchPlan(500, 1000), sensitivity=Fixed(1.0)))),
    ...     Phase("diff", count=60, queries=(
    ...         Query("eta-diff", batch=BatchPlan(50, 1000), sensitivity=StepProportional(10.0, None)),
    ...         Query("x-diff", batch=BatchPlan(50, 1000), sensitivity=StepProportional(10.0, None))))))
    >>> [(s.mechanisms, s.count) for s in plan.inventory().steps]
    [((('eta-refresh', 1.0), ('x-refresh', 1.0)), 4), ((('eta-diff', 1.0), ('x-diff', 1.0)), 60)]
    >>> plan.family_counts()["x-diff"]
    60
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import torch

from privopt.algorithms.release_batches import BatchPlan, FullSampler, PoissonBatch, SingleRecordBatch
from privopt.algorithms.release_kinds import DrawnBatch, PublicBound, check_kind, gaussian_only, planned_entry
from privopt.errors import ConfigError, PrivacyBudgetExceeded, RunDiverged
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import as_bounded
from privopt.privacy import COMPOSITIONS, Gaussian, Inventory, PlannedStep, Step

__all__ = [
    "BatchPlan",
    "PoissonBatch",
    "SingleRecordBatch",
    "DrawnBatch",
    "FullSampler",
    "Fixed",
    "StepProportional",
    "PublicBound",
    "Query",
    "Phase",
    "ReleasePlan",
    "PlanRun",
    "PhaseRun",
    "ReleasePlanExceeded",
    "step_clip",
]

StatFn = Callable[[torch.Tensor, float], Any]  # (batch indices, threshold) -> BoundedSum


def step_clip(distance: float, *, gamma: float | None, cap: float | None) -> float:
    """Clip threshold of a difference query.

    ``gamma`` set: ``C_t = γ·distance`` (capped at ``cap`` when given) — step-proportional, a
    function of released iterates only. ``gamma`` None: the fixed threshold ``cap``.
    """
    if gamma is None:
        return float(cap)
    c = gamma * float(distance)
    return min(c, cap) if cap is not None else c


@dataclass(frozen=True)
class Fixed:
    """A fixed clip threshold ``clip``; the released sum's per-record bound is ``factor·clip``
    (``factor`` > 1 only for statistics that combine several clipped terms per record, e.g.
    STORM's ``Clip(h(w)) − (1−β)·Clip(h(w'))``: ``factor = 2 − β``)."""

    clip: float
    factor: float = 1.0

    def threshold(self, distance: float | None = None) -> float:
        return float(self.clip)


@dataclass(frozen=True)
class StepProportional:
    """The threshold of a difference at two points: ``min(cap, γ·distance)`` (or the fixed ``cap``
    when ``gamma`` is None). The noise multiplier stays the same, so every execution has the
    privacy loss of one Gaussian query with that multiplier whatever the threshold."""

    gamma: float | None
    cap: float | None
    factor: float = 1.0

    def __post_init__(self):
        if self.gamma is None and self.cap is None:
            raise ConfigError("a step-proportional threshold needs gamma or a cap")

    def threshold(self, distance: float | None = None) -> float:
        if distance is None:
            raise ConfigError("a step-proportional threshold needs the distance between the two points")
        return step_clip(distance, gamma=self.gamma, cap=self.cap)


Sensitivity = Union[Fixed, StepProportional, PublicBound]


# ----------------------------------------------------------------------------- the declaration
@dataclass(frozen=True)
class Query:
    """One named noisy release (a *family*: the name the noise multiplier is calibrated for).

    Args:
        name: family name.
        sensitivity: :class:`Fixed` or :class:`StepProportional`.
        batch: its batch (:class:`BatchPlan`, :class:`PoissonBatch`, or anything with
            ``sampling``, ``normalizer``, ``n`` and ``sampler(rng)``); omitted with ``on``.
        on: release from the batch of this other query of the same phase (always shared).
        estimate: ``"mean"`` (divide the noisy sum by the expected batch size) or ``"total"``
            (divide by the sampling rate: an unbiased estimate of the full-data sum).
        ratio: noise-multiplier ratio of the family for calibration (default 1: uniform).
        mechanism, fixed, tree_steps, disjoint: other mechanisms than a calibrated Gaussian, and
            families on disjoint records (:mod:`privopt.algorithms.release_kinds`).
    """

    name: str
    sensitivity: Sensitivity
    batch: Any = None
    on: str | None = None
    estimate: str = "mean"
    ratio: float = 1.0
    mechanism: str = "gaussian"
    fixed: float | None = None
    tree_steps: int | None = None
    disjoint: bool = False

    def __post_init__(self):
        check_kind(self)
        if (self.batch is None) == (self.on is None):
            raise ConfigError(f"query {self.name!r} needs exactly one of batch= and on=")
        if self.estimate not in ("mean", "total"):
            raise ConfigError(f"query {self.name!r}: estimate must be 'mean' or 'total', got {self.estimate!r}")


@dataclass(frozen=True)
class Phase:
    """A kind of iteration (or part of one) that makes ``queries`` and runs at most ``count`` times."""

    name: str
    count: int
    queries: tuple[Query, ...]

    def query(self, name: str) -> Query:
        for q in self.queries:
            if q.name == name:
                return q
        raise ConfigError(
            f"release {name!r} is not declared in phase {self.name!r} of the release plan "
            f"(declared: {[q.name for q in self.queries]})"
        )


def _batch_key(batch) -> tuple:
    return (batch.sampling, batch.normalizer)


@dataclass(frozen=True)
class ReleasePlan:
    """All noisy releases of a run (see the module docstring).

    Args:
        phases: the phases, in the order they are declared (this order fixes the inventory's).
        share: releases of a phase on equal batches share one sampled batch.
        composition: how the planned steps compose, i.e. which ledger certifies the run
            (:class:`~privopt.privacy.Inventory`): ``"plan"`` (a fixed schedule), ``"filter"``
            (phase counts are a nominal schedule, the run is chosen adaptively and certified by an
            RDP filter) or ``"parallel"`` (one execution of a phase is a pass over disjoint parts).
    """

    phases: tuple[Phase, ...]
    share: bool = False
    composition: str = "plan"

    def __post_init__(self):
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ConfigError(f"phase names must be unique, got {names}")
        if self.composition not in COMPOSITIONS:
            raise ConfigError(f"unknown composition {self.composition!r}; use one of {COMPOSITIONS}")

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise ConfigError(f"phase {name!r} is not in the release plan (phases: {[p.name for p in self.phases]})")

    def query(self, name: str) -> Query:
        """The declaration of family ``name`` (the first phase's, if several declare it)."""
        found = [q for p in self.phases for q in p.queries if q.name == name]
        if not found:
            raise ConfigError(f"release {name!r} is not declared in the release plan")
        return found[0]

    def groups(self, phase: Phase) -> tuple[tuple[Query, ...], ...]:
        """The sampled batches of one execution of ``phase``: each a tuple of queries, leader first."""
        groups: list[list[Query]] = []
        for q in phase.queries:
            if q.on is not None:
                host = next((g for g in groups if any(m.name == q.on for m in g)), None)
                if host is None:
                    raise ConfigError(f"query {q.name!r} rides on {q.on!r}, which is not declared before it")
                host.append(q)
                continue
            host = next((g for g in groups if self.share and _batch_key(g[0].batch) == _batch_key(q.batch)), None)
            if host is None:
                groups.append([q])
            else:
                host.append(q)
        return tuple(tuple(g) for g in groups)

    def planned_steps(self) -> list[PlannedStep]:
        """One planned step per sampled batch, listed by leading family (first lead order), then phase."""
        leaders: list[str] = []
        by_leader: dict[str, list[PlannedStep]] = {}
        for phase in self.phases:
            for g in self.groups(phase):
                lead = g[0].name
                if lead not in by_leader:
                    leaders.append(lead)
                    by_leader[lead] = []
                if phase.count > 0:
                    mechs = tuple(planned_entry(q) for q in g)
                    count = 1 if all(q.disjoint for q in g) else phase.count  # parallel composition
                    by_leader[lead].append(PlannedStep(g[0].batch.sampling, mechs, count))
        merged: dict[tuple, int] = {}
        for lead in leaders:
            for s in by_leader[lead]:
                merged[(s.sampling, s.mechanisms)] = merged.get((s.sampling, s.mechanisms), 0) + s.count
        return [PlannedStep(sampling, mechs, count) for (sampling, mechs), count in merged.items()]

    def inventory(self) -> Inventory:
        """The accounting inventory the noise is calibrated from."""
        return Inventory(tuple(self.planned_steps()), composition=self.composition)

    def family_counts(self) -> dict[str, int]:
        """Largest number of releases of each family over the run."""
        out: dict[str, int] = {}
        for phase in self.phases:
            for q in phase.queries:
                out[q.name] = out.get(q.name, 0) + phase.count
        return out

    def steps(self, phase: str, noise: dict[str, float]) -> tuple[Step, ...]:
        """The accounting steps one execution of ``phase`` records, with multipliers ``noise``."""
        return tuple(
            Step(g[0].batch.sampling, tuple(Gaussian(float(noise[q.name]), name=q.name) for q in g))
            for g in self.groups(self.phase(phase))
        )


# ----------------------------------------------------------------------------- the runtime
class ReleasePlanExceeded(PrivacyBudgetExceeded):
    """A release family would be made more often than the plan (hence the calibration) allows.
    Refused before anything is recorded or drawn; a training loop treats it as an exhausted budget."""


class PlanRun:
    """A release plan bound to a run: opens batches, releases, and counts against the plan.

    Args:
        plan: the run's :class:`ReleasePlan`.
        ctx: the :class:`~privopt.algorithms.base.RunContext` (data rng, noise, ledger).
        private: ``False`` releases without noise or ledger records (reference runs).
    """

    def __init__(self, plan: ReleasePlan, ctx, *, private: bool):
        if plan.composition != "plan":  # adaptive counts or pass-wise batches: the algorithm runs its own
            raise ConfigError(f"PlanRun runs fixed schedules; a {plan.composition!r} plan needs its own runtime")
        gaussian_only(plan)
        self.plan = plan
        self._ctx = ctx
        self._private = private
        self._planned = plan.family_counts()
        self._released: dict[str, int] = {}
        self._executed: dict[str, int] = {}
        self._samplers: dict[tuple, Any] = {}
        self.last_indices: dict[str, torch.Tensor] = {}  # diagnostics for tests; never released

    @property
    def _ledger(self):
        # Read at every use: the loop may swap the context's ledger (resume from a checkpoint).
        return self._ctx.ledger if self._private else None

    def phase(self, name: str) -> PhaseRun:
        """Start one execution of phase ``name`` (refused beyond the phase's planned count)."""
        phase = self.plan.phase(name)
        k = self._executed.get(name, 0) + 1
        if k > phase.count:
            raise ReleasePlanExceeded(
                f"phase {name!r} would run {k} times, but the release plan declares at most {phase.count}: "
                "the inventory the noise was calibrated for does not cover it; nothing was recorded or released"
            )
        self._executed[name] = k
        return PhaseRun(self, phase)

    def noise_for(self, names) -> dict[str, float]:
        if self._ledger is None:
            return dict.fromkeys(names, 1.0)  # placeholders: a non-private batch adds no noise
        return {nm: self._ctx.noise[nm] for nm in names}

    def count(self, names) -> None:
        """Count one release of each family in ``names``; refuse any beyond its planned count."""
        for nm in names:
            k = self._released.get(nm, 0) + 1
            if k > self._planned.get(nm, 0):
                raise ReleasePlanExceeded(
                    f"release {nm!r} would be made {k} times, but the release plan declares at most "
                    f"{self._planned.get(nm, 0)}: the inventory the noise was calibrated for does not cover it; "
                    "nothing was recorded or released"
                )
        for nm in names:
            self._released[nm] = self._released.get(nm, 0) + 1

    def record_phase(self, phase: str, times: int) -> tuple[Step, ...]:
        """Count and record ``times`` executions of ``phase`` without PrivateBatch (for vectorised
        loops that draw their own noise afterwards); returns the phase's steps."""
        steps = self.plan.steps(phase, self.noise_for(self._planned))
        for _ in range(times):
            self.phase(phase)
            for st in steps:
                self.count(st.names)
                if self._ledger is not None:
                    self._ledger.record(st)
        return steps

    def open(self, group: tuple[Query, ...], names: list[str]) -> tuple[torch.Tensor, PrivateBatch]:
        lead = group[0].batch
        key = _batch_key(lead)
        if key not in self._samplers:
            self._samplers[key] = lead.sampler(self._ctx.sampler_rng)
        idx = self._samplers[key].sample()
        self.count(names)
        batch = PrivateBatch(self._ledger, lead.sampling, self.noise_for(names), rng=self._ctx.noise_rng)
        return idx, batch

    def state_dict(self) -> dict[str, dict[str, int]]:
        return {"releases": dict(self._released), "phases": dict(self._executed)}

    def load_state_dict(self, state: dict[str, dict[str, int]]) -> None:
        self._released = dict(state.get("releases", {}))
        self._executed = dict(state.get("phases", {}))


class PhaseRun:
    """One execution of a phase: each declared release is made (or skipped) at most once."""

    def __init__(self, run: PlanRun, phase: Phase):
        self._run = run
        self.phase = phase
        self._groups = run.plan.groups(phase)
        self._open: dict[int, tuple[torch.Tensor, PrivateBatch]] = {}
        self._done: set[str] = set()
        self._skipped: set[str] = set()
        self.thresholds: dict[str, float] = {}

    def _group_of(self, name: str) -> int:
        for i, g in enumerate(self._groups):
            if any(q.name == name for q in g):
                return i
        self.phase.query(name)  # raises: undeclared
        raise AssertionError

    def _mark(self, name: str) -> Query:
        q = self.phase.query(name)
        if name in self._done:
            raise ConfigError(f"release {name!r} already made or skipped in this execution of {self.phase.name!r}")
        self._done.add(name)
        return q

    def skip(self, name: str) -> None:
        """Declare that ``name`` is not made this time (e.g. a correction at zero distance)."""
        self._mark(name)
        self._skipped.add(name)

    def _ensure_open(self, i: int) -> tuple[torch.Tensor, PrivateBatch]:
        # The batch declares every release of its group not yet skipped: those that may follow.
        if i not in self._open:
            names = [q.name for q in self._groups[i] if q.name not in self._skipped]
            self._open[i] = self._run.open(self._groups[i], names)
        return self._open[i]

    def release(self, name: str, stat: StatFn, *, distance: float | None = None) -> torch.Tensor:
        """Make release ``name``: ``stat(indices, threshold)`` must return a bounded sum whose
        per-record bound is at most the plan's; returns the noisy estimate."""
        q = self._mark(name)
        if distance is not None and not math.isfinite(float(distance)):  # before the batch is opened and charged
            raise RunDiverged(
                f"diverged: release {name!r} at a non-finite distance ({distance}) between its two points "
                "(the iterates are NaN/inf; try a smaller lr)"
            )
        clip = q.sensitivity.threshold(distance)
        if not clip > 0:
            raise ConfigError(f"release {name!r}: threshold {clip} is not > 0 (skip zero-distance corrections)")
        self.thresholds[name] = clip
        i = self._group_of(name)
        idx, batch = self._ensure_open(i)
        self._run.last_indices[name] = idx
        value = as_bounded(stat(idx, clip))
        declared = clip * q.sensitivity.factor
        if value.bound > declared * (1 + 1e-12):
            raise ConfigError(
                f"release {name!r}: the statistic's per-record bound {value.bound:g} exceeds the plan's {declared:g}"
            )
        lead = self._groups[i][0].batch
        normalizer = lead.normalizer if q.estimate == "mean" else lead.normalizer / lead.n
        return batch.gaussian(name, value, normalizer=normalizer)
