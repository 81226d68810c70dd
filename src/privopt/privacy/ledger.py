"""The privacy ledger: counts every executed step and refuses any step that would exceed the budget.

Every data-dependent release must go through :meth:`PrivacyLedger.record` BEFORE the noisy value
is used, so the ledger is the single budget guard of a run (docs/accounting.md, "The ledger").

Two modes:

* ``"plan"`` (default): epsilon of the executed counts by :func:`~privopt.privacy.epsilon_of`. Valid
  when the schedule (which steps, how many) is fixed in advance; the order of steps and values
  such as clip thresholds may depend on released values.
* ``"filter"``: an :class:`~privopt.privacy.RdpFilter` at a fixed Renyi order, valid under fully
  adaptive composition: the number and kind of steps may depend on released values.

Cost: epsilon is monotone in the step counts (composing more releases can only add privacy
loss), so any counts dominated by a schedule already certified within budget are safe without
calling an accountant. The certificate starts as the ``planned`` schedule (checked once at
construction) and is extended geometrically when a run goes beyond it, so a run of ``T`` steps
costs O(log T) accountant calls, not ``T``.
"""

from __future__ import annotations

from collections.abc import Mapping

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy import accountant as _acc
from privopt.privacy.checks import check_accountant, check_delta, check_epsilon
from privopt.privacy.events import ADD_REMOVE, Step, check_neighbouring, step_from_dict
from privopt.privacy.filter import RdpFilter
from privopt.privacy.translate import rdp_parts

__all__ = ["MODES", "LedgerBase", "PrivacyLedger", "release_counts"]

_FORMAT_VERSION = 1
MODES = ("plan", "filter")


def release_counts(counts: Mapping[Step, int]) -> dict[str, int]:
    """How many times each named release was made, from executed step counts."""
    releases: dict[str, int] = {}
    for step, count in counts.items():
        for name in step.names:
            releases[name] = releases.get(name, 0) + count
    return releases


def _counts_to_list(counts: Mapping[Step, int]) -> list[dict]:
    return [{"step": s.to_dict(), "count": int(c)} for s, c in counts.items()]


def _counts_from_list(items) -> dict[Step, int]:
    if not isinstance(items, list):
        raise ConfigError(f"ledger counts must be a list of {{'step', 'count'}} records, got {type(items).__name__}")
    pairs = []
    for it in items:
        try:
            pairs.append((step_from_dict(it["step"]), it["count"]))
        except (KeyError, TypeError):
            raise ConfigError(f"malformed ledger entry {it!r}") from None
    return _acc.normalize_counts(pairs)


class LedgerBase:
    """What every ledger kind shares: the run's (delta, neighbouring, accountant, target) settings,
    their validation, and the common fields of :meth:`summary` and :meth:`to_dict` records.

    Subclasses define :meth:`spent` (the guarantee of everything recorded so far).
    """

    def _set_settings(self, *, delta: float, neighbouring: str, accountant: str, target_epsilon: float | None) -> None:
        self._delta = check_delta(delta)
        self._neighbouring = check_neighbouring(neighbouring)
        self._accountant = check_accountant(accountant)
        self._target = None if target_epsilon is None else check_epsilon(target_epsilon, name="target_epsilon")

    @property
    def delta(self) -> float:
        return self._delta

    @property
    def neighbouring(self) -> str:
        return self._neighbouring

    @property
    def accountant(self) -> str:
        return self._accountant

    @property
    def target_epsilon(self) -> float | None:
        return self._target

    def spent(self) -> _acc.EpsilonResult:
        raise NotImplementedError

    def epsilon(self) -> float:
        """Epsilon spent so far at the ledger's delta."""
        return self.spent().epsilon

    def guarantee(self) -> _acc.EpsilonResult:
        """The run's (ε, δ)-DP guarantee: the ε of its whole plan (or of what it spent, if more).

        A run that stops before the end of its plan on a decision read from its own releases (a
        certified stop, a divergence guard) is a truncation of the planned run, i.e. post-processing
        of it: it is DP with the plan's ε, not with the smaller :meth:`spent`, which is then only the
        ex-post ε of the releases made (``docs/accounting.md``, "Early stops"). Without a plan, and in
        filter mode (whose certificate already covers any adaptive stop), this is :meth:`spent`.
        """
        raise NotImplementedError

    def _summary_head(self) -> dict:
        spent = self.spent()
        return {
            "epsilon": spent.epsilon,
            "delta": self._delta,
            "accountant": spent.accountant,
            "neighbouring": self._neighbouring,
            "target_epsilon": self._target,
        }

    def _settings_record(self) -> dict:
        return {
            "version": _FORMAT_VERSION,
            "delta": self._delta,
            "neighbouring": self._neighbouring,
            "accountant": self._accountant,
            "target_epsilon": self._target,
        }

    @staticmethod
    def _settings_from_record(d: Mapping) -> dict:
        """The constructor's settings from a :meth:`to_dict` record (after its format check)."""
        if d.get("version", _FORMAT_VERSION) != _FORMAT_VERSION:
            raise ConfigError(f"unsupported ledger format version {d.get('version')!r}")
        return {
            "delta": d["delta"],
            "neighbouring": d.get("neighbouring", ADD_REMOVE),
            "accountant": d.get("accountant", "auto"),
            "target_epsilon": d.get("target_epsilon"),
        }


class PrivacyLedger(LedgerBase):
    """Counts executed :class:`~privopt.privacy.events.Step` objects and enforces a target epsilon.

    Args:
        delta: The run's delta in (0, 1).
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``.
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``.
        target_epsilon: If set, :meth:`record` refuses any step that would push epsilon above it.
        planned: The calibrated schedule (``{Step: max count}``). With a target, it is verified
            once (``ConfigError`` if it already exceeds the target) and then lets every step
            within the plan be recorded without an accountant call. In filter mode it is the
            nominal schedule that fixes the filter's Renyi order.
        mode: ``"plan"`` (default) or ``"filter"`` (fully adaptive; needs ``target_epsilon`` and
            ``planned`` or ``filter_order``; epsilon() is then the filter's certified epsilon).
        filter_order: The filter's Renyi order (default: the best order for ``planned``).

    Example:
        >>> from privopt.privacy import Gaussian, Poisson, PrivacyLedger, Step
        >>> step = Step(Poisson(0.1), (Gaussian(3.0, name="grad"),))
        >>> ledger = PrivacyLedger(delta=1e-6, target_epsilon=4.0, planned={step: 512})
        >>> for _ in range(512):
        ...     ledger.record(step)
        >>> ledger.num_steps, round(ledger.epsilon(), 2)
        (512, 3.77)
    """

    def __init__(
        self,
        *,
        delta: float,
        neighbouring: str = ADD_REMOVE,
        accountant: str = "auto",
        target_epsilon: float | None = None,
        planned: Mapping[Step, int] | None = None,
        mode: str = "plan",
        filter_order: float | None = None,
    ):
        if mode not in MODES:
            raise ConfigError(f"unknown ledger mode {mode!r}; use one of {MODES}")
        self._set_settings(delta=delta, neighbouring=neighbouring, accountant=accountant, target_epsilon=target_epsilon)
        self._planned = None if planned is None else _acc.normalize_counts(planned)
        self._counts: dict[Step, int] = {}
        self._spent_cache: tuple[int, _acc.EpsilonResult] | None = None
        self._version = 0  # bumps on every change of _counts; keys the spent() cache
        # _cert: counts known to be within budget (dominates _counts whenever a target is set).
        self._cert: dict[Step, int] = {}
        # Per-step lookahead used to extend the certificate geometrically.
        self._lookahead: dict[Step, int] = {}
        if self._planned is not None:
            for step in self._planned:  # fail fast on steps the accountant cannot handle
                rdp_parts(step, neighbouring=self._neighbouring)
        self._filter = None if mode == "plan" else self._make_filter(filter_order)
        if self._target is not None and self._planned and self._filter is None:
            planned_eps = self._eps(self._planned).epsilon
            if planned_eps > self._target:
                raise ConfigError(
                    f"the planned schedule already spends epsilon={planned_eps:.6g} "
                    f"> target_epsilon={self._target:.6g} "
                    f"(delta={self._delta:g}, {self._accountant}); recalibrate the noise with the same accountant"
                )
            self._cert = dict(self._planned)

    def _make_filter(self, order: float | None) -> RdpFilter:
        if self._target is None:
            raise ConfigError("a ledger in filter mode needs target_epsilon (the epsilon the filter certifies)")
        if order is not None:
            return RdpFilter(epsilon=self._target, delta=self._delta, order=order, neighbouring=self._neighbouring)
        if not self._planned:
            raise ConfigError("a ledger in filter mode needs planned (a nominal schedule) or filter_order")
        return RdpFilter.for_plan(
            self._planned, epsilon=self._target, delta=self._delta, neighbouring=self._neighbouring
        )

    # ---------------------------------------------------------------- properties

    @property
    def mode(self) -> str:
        return "plan" if self._filter is None else "filter"

    @property
    def filter(self) -> RdpFilter | None:
        """The RDP filter in filter mode (``None`` otherwise)."""
        return self._filter

    @property
    def planned(self) -> dict[Step, int] | None:
        return None if self._planned is None else dict(self._planned)

    @property
    def counts(self) -> dict[Step, int]:
        """Executed count per step, in first-execution order (a copy)."""
        return dict(self._counts)

    @property
    def num_steps(self) -> int:
        """Total number of recorded steps."""
        return sum(self._counts.values())

    # ---------------------------------------------------------------- accounting

    def _eps(self, counts: Mapping[Step, int]) -> _acc.EpsilonResult:
        return _acc.epsilon_of(counts, delta=self._delta, neighbouring=self._neighbouring, accountant=self._accountant)

    def spent(self) -> _acc.EpsilonResult:
        """The guarantee of everything recorded so far (in filter mode: of the whole run)."""
        if self._filter is not None:
            return self._filter.certified()
        if self._spent_cache is None or self._spent_cache[0] != self._version:
            self._spent_cache = (self._version, self._eps(self._counts))
        return self._spent_cache[1]

    def guarantee(self) -> _acc.EpsilonResult:
        if self._filter is not None or not self._planned:
            return self.spent()
        covered = dict(self._planned)
        for step, k in self._counts.items():
            covered[step] = max(k, covered.get(step, 0))
        return self._eps(covered)

    def record(self, step: Step) -> None:
        """Account one execution of ``step``; call it BEFORE releasing the step's noisy output.

        Raises:
            PrivacyBudgetExceeded: the step would push epsilon above ``target_epsilon``; nothing is
                recorded and the caller must not release the output. The exception carries
                ``spent``, ``would_be`` and ``target`` attributes.
            ConfigError: ``step`` is not a Step or cannot be accounted.
        """
        if not isinstance(step, Step):
            raise ConfigError(f"record() needs a privopt.privacy.Step, got {type(step).__name__}: {step!r}")
        new_count = self._counts.get(step, 0) + 1
        if self._filter is not None:
            self._filter.record(step)
        elif self._target is not None and new_count > self._cert.get(step, 0):
            self._extend_certificate(step, new_count)
        elif step not in self._counts and step not in self._cert:
            rdp_parts(step, neighbouring=self._neighbouring)  # validate unseen steps without a target
        self._counts[step] = new_count
        self._version += 1

    def _extend_certificate(self, step: Step, new_count: int) -> None:
        # Invariant: _counts <= _cert (pointwise) and eps(_cert) <= target. First try a generous
        # extension (doubling lookahead), then the exact next state; refuse if even that fails.
        base = dict(self._cert)
        for s, c in self._counts.items():
            base[s] = max(base.get(s, 0), c)
        ahead = self._lookahead.get(step, new_count)
        next_ahead = 2
        if ahead > 1:
            candidate = dict(base)
            candidate[step] = new_count + ahead - 1
            if self._eps(candidate).epsilon <= self._target:
                self._cert = candidate
                self._lookahead[step] = 2 * ahead
                return
            next_ahead = max(1, ahead // 2)  # the budget ends within `ahead` steps: look closer
        exact = dict(base)
        exact[step] = new_count
        would_be = self._eps(exact).epsilon
        if would_be <= self._target:
            self._cert = exact
            self._lookahead[step] = next_ahead
            return
        spent = self.epsilon()
        err = PrivacyBudgetExceeded(
            f"privacy budget exhausted: spent epsilon={spent:.6g}, this step would make it {would_be:.6g} "
            f"> target {self._target:.6g} (delta={self._delta:g}, {self.spent().accountant}); "
            f"step {step} was not recorded"
        )
        err.spent, err.would_be, err.target = spent, would_be, self._target
        raise err

    # ---------------------------------------------------------------- records

    def summary(self) -> dict:
        """JSON-safe summary for run records: spent epsilon and release counts per mechanism name."""
        return {
            **self._summary_head(),
            "num_steps": self.num_steps,
            "releases": release_counts(self._counts),
            **({"mode": "filter", "filter": self._filter.to_dict()} if self._filter is not None else {}),
        }

    def to_dict(self) -> dict:
        """JSON-safe state; :meth:`from_dict` restores an identical ledger."""
        return {
            **self._settings_record(),
            "planned": None if self._planned is None else _counts_to_list(self._planned),
            "counts": _counts_to_list(self._counts),
            **({"mode": "filter", "filter_order": self._filter.order} if self._filter is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> PrivacyLedger:
        """Restore a ledger saved with :meth:`to_dict` (e.g. from a checkpoint).

        Raises:
            ConfigError: malformed record, or restored counts already above the target.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"ledger record must be a mapping, got {type(d).__name__}")
        try:
            planned = None if d.get("planned") is None else _counts_from_list(d["planned"])
            ledger = cls(
                **cls._settings_from_record(d),
                planned=planned,
                mode=d.get("mode", "plan"),
                filter_order=d.get("filter_order"),
            )
            counts = _counts_from_list(d["counts"])
        except KeyError as e:
            raise ConfigError(f"ledger record is missing {e}") from None
        ledger._counts = counts
        ledger._version += 1
        if ledger._filter is not None:
            ledger._filter.restore(counts)
        elif ledger._target is not None and any(c > ledger._cert.get(s, 0) for s, c in counts.items()):
            # The run went beyond its plan: re-certify the restored state (keeping the plan if the
            # union still fits, otherwise just the executed counts).
            union = dict(ledger._cert)
            for s, c in counts.items():
                union[s] = max(union.get(s, 0), c)
            if ledger._eps(union).epsilon <= ledger._target:
                ledger._cert = union
            else:
                spent = ledger.epsilon()
                if not spent <= ledger._target:
                    raise ConfigError(
                        f"restored ledger already spends epsilon={spent:.6g} > target {ledger._target:.6g}"
                    )
                ledger._cert = dict(counts)
        return ledger

    def __repr__(self) -> str:
        target = "" if self._target is None else f", target_epsilon={self._target}"
        target += "" if self._filter is None else f", mode='filter', filter_order={self._filter.order:g}"
        return (
            f"PrivacyLedger(num_steps={self.num_steps}, distinct_steps={len(self._counts)}, "
            f"delta={self._delta}, neighbouring={self._neighbouring!r}, accountant={self._accountant!r}{target})"
        )
