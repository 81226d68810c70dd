"""Parallel composition over disjoint passes: a ledger for algorithms that use each record once per pass.

An algorithm that splits the data into disjoint parts and releases one noisy statistic per part
(Gauss-PSGD's Ada-DP-SPIDER oracle in its disjoint mode) touches each record in at most ONE release
per pass over the data. Composing every release, as :class:`~privopt.privacy.PrivacyLedger` does,
would charge each record for releases made from other records' data. The guarantee is instead:

* within a pass, a record's privacy loss is that of the one release whose part holds it
  (parallel composition). Which part holds it, and which kind of release that part gets, may
  depend on earlier releases: the loss of every part is bounded by the same *pass step*;
* across passes, the per-pass guarantees compose: the run is ``passes``-fold composition of the
  pass step.

:class:`ParallelLedger` makes this explicit: :meth:`ParallelLedger.begin_pass` charges one pass
step (refused beyond the budget), and :meth:`ParallelLedger.record` accounts every part release,
refusing any that the pass step does not dominate. The pass step and its parts are full-batch
Gaussian releases on their part (a part is not a subsample: no amplification); a Gaussian release
with multiplier ``z`` is dominated by one with multiplier ``z' <= z`` (its privacy-loss
distribution is), so the per-record loss of every part is at most the pass step's whatever the
adaptive choices were. For Gaussian mechanisms this composes under fully adaptive choice of the
parts (each record meets at most ``passes`` Gaussian releases, each dominated by the same pair
of distributions). See docs/accounting.md, "Parallel composition".

Example:
    >>> from privopt.privacy import FullBatch, Gaussian, Step, epsilon_of
    >>> part = Step(FullBatch(), (Gaussian(4.0, name="o1"),))
    >>> ledger = ParallelLedger(delta=1e-5, target_epsilon=2.0, planned={part: 2})
    >>> ledger.begin_pass()
    >>> for _ in range(50):  # 50 disjoint parts of one pass
    ...     ledger.record(part)
    >>> ledger.epsilon() == epsilon_of({part: 1}, delta=1e-5).epsilon
    True
    >>> ledger.begin_pass(); ledger.record(part)
    >>> ledger.epsilon() == epsilon_of({part: 2}, delta=1e-5).epsilon
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy import accountant as _acc
from privopt.privacy.events import ADD_REMOVE, FullBatch, Gaussian, Step, step_from_dict
from privopt.privacy.ledger import LedgerBase, PrivacyLedger, release_counts

__all__ = ["ParallelLedger", "make_ledger", "ledger_from_dict"]


def _effective_multiplier(step: Step) -> float:
    """``(Σ z_j⁻²)^(-1/2)``: several Gaussians on one part are one Gaussian of this multiplier."""
    if not isinstance(step, Step):
        raise ConfigError(f"expected a privopt.privacy.Step, got {type(step).__name__}: {step!r}")
    if not isinstance(step.sampling, FullBatch) or not all(isinstance(m, Gaussian) for m in step.mechanisms):
        raise ConfigError(
            f"parallel composition covers full-batch Gaussian releases on disjoint parts; got {step} "
            "(a part is not a subsample and gets no amplification)"
        )
    return math.fsum(m.noise_multiplier**-2 for m in step.mechanisms) ** -0.5


def _pass_step(planned: Mapping[Step, int] | None) -> tuple[Step, int]:
    counts = _acc.normalize_counts(planned or {})
    if len(counts) != 1:
        raise ConfigError(
            f"a parallel ledger needs exactly one planned pass step (the release every part is bounded by) with its "
            f"number of passes, got {len(counts)} planned steps"
        )
    ((step, passes),) = counts.items()
    _effective_multiplier(step)
    return step, passes


class ParallelLedger(LedgerBase):
    """Certifies ``passes``-fold composition of one pass step; each pass holds disjoint part releases.

    Args:
        delta: The run's delta in (0, 1).
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``; the part releases must be
            made on a partition that the relation changes in one part only (see the oracle's
            disjoint windows, docs/algorithms/sosp.md).
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``.
        target_epsilon: If set, a pass that would take epsilon above it is refused.
        planned: ``{pass_step: passes}``: the step every part is bounded by, and the number of
            passes the calibration covers (with a target, no more passes are admitted).

    Raises:
        ConfigError: no single full-batch Gaussian pass step, or the plan alone exceeds the target.
    """

    mode = "parallel"

    def __init__(
        self,
        *,
        delta: float,
        neighbouring: str = ADD_REMOVE,
        accountant: str = "auto",
        target_epsilon: float | None = None,
        planned: Mapping[Step, int] | None = None,
    ):
        self._set_settings(delta=delta, neighbouring=neighbouring, accountant=accountant, target_epsilon=target_epsilon)
        self._pass, self._planned_passes = _pass_step(planned)
        self._z_pass = _effective_multiplier(self._pass)
        self._passes = 0
        self._parts: dict[Step, int] = {}
        self._cache: dict[int, _acc.EpsilonResult] = {}
        if self._target is not None:
            planned_eps = self._eps(self._planned_passes).epsilon
            if planned_eps > self._target:
                raise ConfigError(
                    f"{self._planned_passes} passes already spend epsilon={planned_eps:.6g} > target_epsilon="
                    f"{self._target:.6g}; recalibrate the noise with the same accountant"
                )

    # ---------------------------------------------------------------- properties
    @property
    def filter(self) -> None:
        return None

    @property
    def pass_step(self) -> Step:
        """The step each part release is bounded by (one per pass per record)."""
        return self._pass

    @property
    def planned(self) -> dict[Step, int]:
        return {self._pass: self._planned_passes}

    @property
    def passes(self) -> int:
        """Passes begun so far."""
        return self._passes

    @property
    def counts(self) -> dict[Step, int]:
        """What the guarantee composes: the pass step, once per pass begun."""
        return {self._pass: self._passes} if self._passes else {}

    @property
    def parts(self) -> dict[Step, int]:
        """Every part release recorded, by step (a copy)."""
        return dict(self._parts)

    @property
    def num_steps(self) -> int:
        """Total number of part releases recorded."""
        return sum(self._parts.values())

    # ---------------------------------------------------------------- accounting
    def _eps(self, passes: int) -> _acc.EpsilonResult:
        if passes not in self._cache:
            if passes == 0:
                self._cache[0] = _acc.EpsilonResult(0.0, self._delta, self._accountant)
            else:
                self._cache[passes] = _acc.epsilon_of(
                    {self._pass: passes},
                    delta=self._delta,
                    neighbouring=self._neighbouring,
                    accountant=self._accountant,
                )
        return self._cache[passes]

    def fits_pass(self) -> bool:
        """Whether another pass can begin within the target (and the plan, when a target is set)."""
        if self._target is None:
            return True
        return self._passes < self._planned_passes and self._eps(self._passes + 1).epsilon <= self._target

    def begin_pass(self) -> None:
        """Start a new pass over the data; call it BEFORE the pass's first release.

        Raises:
            PrivacyBudgetExceeded: the pass would exceed the target or the planned passes;
                nothing is recorded.
        """
        if not self.fits_pass():
            would_be = self._eps(self._passes + 1).epsilon
            err = PrivacyBudgetExceeded(
                f"privacy budget exhausted: pass {self._passes + 1} would make epsilon={would_be:.6g} (the plan covers "
                f"{self._planned_passes} passes, target {self._target:.6g}, delta={self._delta:g}); not begun"
            )
            err.spent, err.would_be, err.target = self.epsilon(), would_be, self._target
            raise err
        self._passes += 1

    def record(self, step: Step) -> None:
        """Account one part release of the current pass; call it BEFORE releasing its output.

        Raises:
            ConfigError: no pass begun, or ``step`` is not dominated by the pass step (it could
                cost a record more than the pass charges); nothing is recorded.
        """
        if self._passes == 0:
            raise ConfigError("parallel ledger: begin_pass() before the first release of a pass")
        z = _effective_multiplier(step)
        if z < self._z_pass * (1 - 1e-12):
            raise ConfigError(
                f"release {step} has noise multiplier {z:.6g} below the pass step's {self._z_pass:.6g}: the pass "
                "does not bound it; nothing was recorded"
            )
        self._parts[step] = self._parts.get(step, 0) + 1

    def spent(self) -> _acc.EpsilonResult:
        """The guarantee of everything recorded so far: ``passes``-fold composition of the pass step."""
        return self._eps(self._passes)

    def guarantee(self) -> _acc.EpsilonResult:
        """The ε of the planned passes (or of the passes begun, if more): see :meth:`LedgerBase.guarantee`."""
        return self._eps(max(self._passes, self._planned_passes))

    # ---------------------------------------------------------------- records
    def summary(self) -> dict:
        """JSON-safe summary: epsilon, passes, and part releases per mechanism name."""
        return {
            **self._summary_head(),
            "mode": self.mode,
            "passes": self._passes,
            "num_steps": self.num_steps,
            "releases": release_counts(self._parts),
        }

    def to_dict(self) -> dict:
        """JSON-safe state; :meth:`from_dict` restores an identical ledger."""
        return {
            **self._settings_record(),
            "mode": self.mode,
            "planned": [{"step": self._pass.to_dict(), "count": self._planned_passes}],
            "passes": self._passes,
            "parts": [{"step": s.to_dict(), "count": int(c)} for s, c in self._parts.items()],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> ParallelLedger:
        """Restore a ledger saved with :meth:`to_dict`.

        Raises:
            ConfigError: malformed record, or more passes than the target admits.
        """
        if not isinstance(d, Mapping) or d.get("mode") != cls.mode:
            raise ConfigError("not a parallel-ledger record")
        try:
            planned = {step_from_dict(it["step"]): it["count"] for it in d["planned"]}
            ledger = cls(**cls._settings_from_record(d), planned=planned)
            passes = int(d["passes"])
            parts = [(step_from_dict(it["step"]), int(it["count"])) for it in d["parts"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"malformed parallel-ledger record: {e}") from None
        if ledger._target is not None and passes > 0 and ledger._eps(passes).epsilon > ledger._target:
            raise ConfigError(f"restored ledger already spends more than target {ledger._target:.6g}")
        ledger._passes = passes
        for step, count in parts:
            _effective_multiplier(step)
            ledger._parts[step] = ledger._parts.get(step, 0) + count
        return ledger

    def __repr__(self) -> str:
        return (
            f"ParallelLedger(passes={self._passes}, parts={self.num_steps}, pass_step={self._pass}, "
            f"delta={self._delta}, target_epsilon={self._target})"
        )


def make_ledger(
    inventory,
    noise: Mapping[str, float],
    *,
    delta: float,
    neighbouring: str = ADD_REMOVE,
    accountant: str = "auto",
    target_epsilon: float | None = None,
):
    """The ledger an inventory's composition calls for, certifying its planned schedule at ``noise``:
    a plan-mode or filter-mode :class:`~privopt.privacy.PrivacyLedger`, or a :class:`ParallelLedger`.

    Example:
        >>> from privopt.privacy import FullBatch, Inventory, PlannedStep
        >>> inv = Inventory((PlannedStep(FullBatch(), (("pass", 1.0),), 3),), composition="parallel")
        >>> make_ledger(inv, {"pass": 10.0}, delta=1e-5, target_epsilon=2.0).mode
        'parallel'
    """
    planned = inventory.steps_for(dict(noise))
    kw = dict(delta=delta, neighbouring=neighbouring, accountant=accountant, target_epsilon=target_epsilon)
    if inventory.composition == "parallel":
        return ParallelLedger(planned=planned, **kw)
    return PrivacyLedger(planned=planned, mode=inventory.composition, **kw)


def ledger_from_dict(d: Mapping):
    """Restore a ledger of either kind from its ``to_dict()`` record (e.g. from a checkpoint)."""
    if isinstance(d, Mapping) and d.get("mode") == ParallelLedger.mode:
        return ParallelLedger.from_dict(d)
    return PrivacyLedger.from_dict(d)
