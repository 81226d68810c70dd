"""A privacy filter for fully adaptive composition (Feldman & Zrnic 2021, "Individual privacy
accounting via a Renyi filter").

:func:`~privopt.privacy.epsilon_of` is valid when the steps to run are fixed in advance (their
order and parameters may depend on earlier releases only through a plan fixed beforehand). An
algorithm that decides *how many* steps of *which kind* to run from the values it released (e.g.
Ada-DP-SPIDER's drift-triggered refreshes) needs a filter: fix a Renyi order ``alpha`` and an RDP
budget ``B`` in advance, charge each step's RDP at ``alpha`` before running it, and refuse any
step that would take the running sum above ``B``. Whatever the sequence, the interaction is then
``(alpha, B)``-RDP, which converts to the certified ``(epsilon, delta)``. See docs/accounting.md,
"Adaptive composition: the RDP filter".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy.accountant import DEFAULT_ORDERS, EpsilonResult, normalize_counts, rdp_curve
from privopt.privacy.checks import check_delta, check_epsilon, is_real
from privopt.privacy.events import ADD_REMOVE, Step, check_neighbouring

__all__ = ["RdpFilter"]


def _budget(epsilon: float, delta: float, order: float) -> float:
    """Largest RDP at ``order`` that dp_accounting converts to at most ``epsilon`` at ``delta``."""
    # For one order the conversion is epsilon = rdp + c(order, delta) (Canonne, Kamath & Steinke
    # 2020, as in dp_accounting's compute_epsilon): read c off the converter itself.
    offset = float(rdp_lib.compute_epsilon([order], [1.0], delta)[0]) - 1.0
    budget = epsilon - offset
    while budget > 0 and rdp_lib.compute_epsilon([order], [budget], delta)[0] > epsilon:
        budget = math.nextafter(budget, 0.0)  # guard against rounding in the conversion
    if not budget > 0:
        raise ConfigError(
            f"Renyi order {order:g} cannot certify epsilon={epsilon:g} at delta={delta:g} (conversion alone costs "
            f"{offset:.4g}); use a larger order or a larger epsilon/delta"
        )
    return budget


class RdpFilter:
    """Admit an adaptively chosen sequence of steps while a fixed-order RDP budget holds.

    Args:
        epsilon: The epsilon to certify (finite, > 0).
        delta: The delta to certify, in (0, 1).
        order: Renyi order alpha > 1.01, fixed before any data is seen (e.g. from a nominal plan
            with :meth:`for_plan`).
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``.

    Example:
        >>> from privopt.privacy import Gaussian, Poisson, RdpFilter, Step
        >>> refresh = Step(Poisson(0.1), (Gaussian(4.0, name="refresh"),))
        >>> increment = Step(Poisson(0.01), (Gaussian(2.0, name="increment"),))
        >>> filt = RdpFilter.for_plan({refresh: 20, increment: 200}, epsilon=2.0, delta=1e-5)
        >>> for released in [0.3, 1.7, 0.2, 2.5] * 5:  # the algorithm's own noisy statistics
        ...     filt.record(refresh if released > 1.0 else increment)
        >>> filt.certified().epsilon <= 2.0, filt.fits(refresh), round(filt.spent / filt.budget, 3)
        (True, True, 0.062)
    """

    def __init__(self, *, epsilon: float, delta: float, order: float, neighbouring: str = ADD_REMOVE):
        self._epsilon = check_epsilon(epsilon)
        self._delta = check_delta(delta)
        if not is_real(order) or not (1.01 < float(order) < math.inf):
            raise ConfigError(f"the filter's Renyi order must be a finite number > 1.01, got {order!r}")
        self._order = float(order)
        self._neighbouring = check_neighbouring(neighbouring)
        self._budget = _budget(self._epsilon, self._delta, self._order)
        self._counts: dict[Step, int] = {}
        self._spent = 0.0

    @classmethod
    def for_plan(
        cls, planned: Mapping[Step, int], *, epsilon: float, delta: float, neighbouring: str = ADD_REMOVE
    ) -> RdpFilter:
        """A filter whose order is the best one for a nominal schedule fixed in advance.

        The plan must fit (its RDP epsilon at ``delta`` is at most ``epsilon``; calibrate its noise
        with ``accountant="rdp"``); the run may then deviate from it adaptively.

        Raises:
            ConfigError: the plan itself exceeds the target, or is empty.
        """
        counts = normalize_counts(planned)
        if not counts:
            raise ConfigError("RdpFilter.for_plan needs a non-empty plan to choose its Renyi order")
        delta, epsilon = check_delta(delta), check_epsilon(epsilon)
        orders = tuple(a for a in DEFAULT_ORDERS if a > 1.01)
        curve = rdp_curve(counts, neighbouring=neighbouring, orders=orders)
        plan_eps, order = rdp_lib.compute_epsilon(orders, curve, delta)
        if plan_eps > epsilon:
            raise ConfigError(
                f"the plan alone needs epsilon={plan_eps:.6g} > {epsilon:g} at delta={delta:g} (RDP); recalibrate "
                "its noise with accountant='rdp'"
            )
        return cls(epsilon=epsilon, delta=delta, order=float(order), neighbouring=neighbouring)

    # ---------------------------------------------------------------- state

    @property
    def order(self) -> float:
        return self._order

    @property
    def budget(self) -> float:
        """The RDP budget B at :attr:`order`."""
        return self._budget

    @property
    def spent(self) -> float:
        """RDP at :attr:`order` of the steps recorded so far (never above :attr:`budget`)."""
        return self._spent

    @property
    def counts(self) -> dict[Step, int]:
        return dict(self._counts)

    @property
    def neighbouring(self) -> str:
        return self._neighbouring

    def cost(self, step: Step) -> float:
        """RDP at :attr:`order` of one execution of ``step``."""
        return float(rdp_curve({step: 1}, neighbouring=self._neighbouring, orders=(self._order,))[0])

    def fits(self, step: Step) -> bool:
        """Whether ``step`` can be recorded now."""
        return self._spent + self.cost(step) <= self._budget

    def record(self, step: Step) -> None:
        """Charge one execution of ``step``; call it BEFORE releasing the step's noisy output.

        Raises:
            PrivacyBudgetExceeded: the step would take the RDP above the budget; nothing is
                recorded and the output must not be released. A cheaper step may still fit.
            ConfigError: ``step`` is not a Step or cannot be accounted.
        """
        if not isinstance(step, Step):
            raise ConfigError(f"record() needs a privopt.privacy.Step, got {type(step).__name__}: {step!r}")
        cost = self.cost(step)
        if self._spent + cost > self._budget:
            err = PrivacyBudgetExceeded(
                f"RDP filter: step {step} costs {cost:.6g} at order {self._order:g}, {self._budget - self._spent:.6g} "
                f"of the budget {self._budget:.6g} remain (certifying epsilon={self._epsilon:g}, "
                f"delta={self._delta:g}); it was not recorded"
            )
            err.spent, err.would_be, err.target = self._spent, self._spent + cost, self._budget
            raise err
        self._spent += cost
        self._counts[step] = self._counts.get(step, 0) + 1

    def restore(self, counts: Mapping[Step, int]) -> None:
        """Charge steps recorded earlier (e.g. read back from a checkpoint) in one go.

        Raises:
            ConfigError: they exceed the budget (the record cannot come from this filter).
        """
        counts = normalize_counts(counts)
        total = self._spent + math.fsum(c * self.cost(s) for s, c in counts.items())
        if total > self._budget:
            raise ConfigError(f"restored steps spend RDP {total:.6g} > the filter's budget {self._budget:.6g}")
        self._spent = total
        for s, c in counts.items():
            self._counts[s] = self._counts.get(s, 0) + c

    def certified(self) -> EpsilonResult:
        """The guarantee of the whole interaction, however it went on or stopped: the budget's
        conversion (at most the requested epsilon)."""
        eps = float(rdp_lib.compute_epsilon([self._order], [self._budget], self._delta)[0])
        return EpsilonResult(eps, self._delta, "rdp_filter")

    def to_dict(self) -> dict:
        return {"order": self._order, "budget": self._budget, "spent": self._spent}

    def __repr__(self) -> str:
        return (
            f"RdpFilter(order={self._order:g}, spent={self._spent:.6g}/{self._budget:.6g}, "
            f"epsilon={self._epsilon:g}, delta={self._delta:g}, neighbouring={self._neighbouring!r})"
        )
