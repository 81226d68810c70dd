"""Reusable private estimators: SPIDER (fixed-period or drift-triggered refresh) and STORM.

Both make their noisy releases through one execution of a release-plan phase
(:class:`~privopt.algorithms.releases.PhaseRun`), so the accounting of what they release is the
plan's, not theirs.

:class:`SpiderEstimator` keeps ``v_t`` ≈ a mean over the data of a per-record quantity at the
current point:

* **refresh** — ``v_t`` = the noisy mean of the clipped quantity on a (large) batch;
* **correction** — ``v_t = v_{t−1} +`` the noisy mean of clipped per-record differences between
  the current and the previous point, with a threshold proportional to the distance moved (the
  plan's :class:`~privopt.algorithms.releases.StepProportional`). A correction at distance 0 is
  skipped: its increment is exactly 0, so no data is touched and nothing is released.

When to refresh: every ``period`` iterations (SPIDER), or once the drift the caller reports with
:meth:`SpiderEstimator.observe_drift` reaches ``drift_threshold`` (drift-adaptive SPIDER; the
drift is reset by each refresh).

:class:`StormEstimator` tracks a scalar mean with momentum β:
``s_t = noisy mean of [Clip(h(w_t)) − (1−β)Clip(h(w_{t−1}))] + (1−β)·s_{t−1}``.

Example:
    >>> spider = SpiderEstimator(refresh="g-refresh", correction="g-diff", period=4)
    >>> [spider.refresh_due(t) for t in range(6)]
    [True, True, True, True, True, True]
    >>> spider.value = 1.0  # once estimated, only every 4th iteration refreshes
    >>> [spider.refresh_due(t) for t in range(6)]
    [True, False, False, False, True, False]
    >>> ada = SpiderEstimator(refresh="o1", correction="o2", drift_threshold=0.5)
    >>> ada.value = 1.0
    >>> ada.observe_drift(0.3); ada.refresh_due(7)
    False
    >>> ada.observe_drift(0.3); ada.refresh_due(8)
    True
"""

from __future__ import annotations

import math
from typing import Any

from privopt.errors import ConfigError

__all__ = ["SpiderEstimator", "StormEstimator"]


class SpiderEstimator:
    """SPIDER estimator releasing through a plan's refresh and correction families.

    Args:
        refresh: name of the refresh release (a plain clipped mean).
        correction: name of the correction release (clipped differences at two points).
        period: refresh every ``period`` iterations (``t % period == 0``).
        drift_threshold: refresh when the observed drift reaches it (instead of ``period``).
        scalar: keep the estimate as a Python float (1-element releases) instead of a tensor.
    """

    def __init__(
        self,
        *,
        refresh: str,
        correction: str,
        period: int | None = None,
        drift_threshold: float | None = None,
        scalar: bool = False,
    ):
        if (period is None) == (drift_threshold is None):
            raise ConfigError("a SPIDER estimator needs exactly one of period and drift_threshold")
        if period is not None and not (isinstance(period, int) and period >= 1):
            raise ConfigError(f"SPIDER period must be an integer >= 1, got {period!r}")
        if drift_threshold is not None and not (drift_threshold > 0 and math.isfinite(drift_threshold)):
            raise ConfigError(f"drift threshold must be a finite number > 0, got {drift_threshold!r}")
        self.refresh_name, self.correction_name = refresh, correction
        self.period, self.drift_threshold = period, drift_threshold
        self.scalar = scalar
        self.value: Any = None
        self.drift = 0.0

    def refresh_due(self, t: int) -> bool:
        """Whether iteration ``t`` refreshes (always, before the first estimate)."""
        if self.value is None:
            return True
        if self.period is not None:
            return t % self.period == 0
        return self.drift >= self.drift_threshold

    def observe_drift(self, amount: float) -> None:
        """Add ``amount`` (e.g. a squared step length) to the drift since the last refresh."""
        self.drift += float(amount)

    def _as_value(self, released):
        return float(released) if self.scalar else released

    def update(self, phase, *, t: int, distance: float, full, diff) -> Any:
        """One iteration: refresh from ``full`` or correct with ``diff`` (each a statistic function
        ``(indices, threshold) -> bounded sum``); ``distance`` between the current and previous
        point scales the correction threshold (0: skip). Returns the new estimate."""
        if self.refresh_due(t):
            self.value = self._as_value(phase.release(self.refresh_name, full))
            self.drift = 0.0
        elif distance > 0:
            self.value = self.value + self._as_value(phase.release(self.correction_name, diff, distance=distance))
        else:
            phase.skip(self.correction_name)
        return self.value

    def update_at(self, phase, *, t: int, distance: float, sums, at: dict, prev: dict) -> Any:
        """:meth:`update` with statistics given as ``sums = (grad_sum, diff_sum)``, called as
        ``grad_sum(idx, clip=c, **at)`` and ``diff_sum(idx, clip=c, **at, **{k + "_prev": v})``
        for the previous point ``prev`` (the naming convention of the algorithms' statistics)."""
        grad_sum, diff_sum = sums
        before = {f"{k}_prev": v for k, v in prev.items()}
        return self.update(
            phase,
            t=t,
            distance=distance,
            full=lambda idx, c: grad_sum(idx, clip=c, **at),
            diff=lambda idx, c: diff_sum(idx, clip=c, **at, **before),
        )

    def rescale(self, factor: float) -> None:
        """Multiply the estimate by a public factor (post-processing)."""
        if self.value is not None:
            self.value = self.value * factor

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "drift": self.drift}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.drift = state["value"], float(state["drift"])


class StormEstimator:
    """STORM tracker of a scalar mean with momentum ``beta`` ∈ (0, 1].

    Args:
        name: the release family of the momentum update.
        beta: momentum (1: a plain noisy minibatch mean each step).
    """

    def __init__(self, *, name: str, beta: float):
        if not 0 < beta <= 1:
            raise ConfigError(f"STORM momentum beta must be in (0, 1], got {beta!r}")
        self.name, self.beta = name, float(beta)
        self.value: float | None = None

    def update(self, phase, stat) -> float:
        """``noisy mean of stat + (1−β)·s_{t−1}``: ``stat(indices, threshold)`` must bound each
        record's term ``Clip(h(w_t)) − (1−β)·Clip(h(w_{t−1}))`` by ``(2 − β)·threshold``. Returns the
        raw estimate; the caller stores the (possibly post-processed) value in :attr:`value`."""
        if self.value is None:
            raise ConfigError("STORM estimator used before it was initialised")
        return float(phase.release(self.name, stat)) + (1.0 - self.beta) * float(self.value)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]
