"""Find the smallest noise scale whose accounted epsilon meets a target, within a time budget.

Epsilon falls monotonically as the noise scale grows, and ``log(epsilon)`` is close to linear in
``log(scale)``; so the search brackets the crossing geometrically and then hands it to scipy's
Brent root finder (the method dp_accounting's ``calibrate_dp_mechanism`` uses) in log-scale
space. Every evaluated scale whose epsilon is within target is a valid answer, so the search can
stop at a deadline and return the best such scale found: the answer is always safe, and exact
whenever the search completes. See docs/accounting.md, "Calibration".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from scipy import optimize

from privopt.privacy.accountant import EpsilonResult

__all__ = [
    "CalibrationProgress",
    "ProgressLine",
    "ScaleSearch",
    "SearchTimeout",
    "NoFeasibleScale",
    "SCALE_MIN",
    "SCALE_MAX",
]

SCALE_MIN = 1e-4
SCALE_MAX = 1e8
# A scale is good enough once its epsilon is within target and this close (relatively) to it.
EPSILON_TOL = 1e-5
# log(eps) outside +-_CLAMP is "certainly infeasible / certainly fine"; keeps Brent's steps finite.
_CLAMP = 50.0


@dataclass(frozen=True)
class CalibrationProgress:
    """One evaluation of a calibration search, as reported to a progress callback.

    Attributes:
        stage: ``"rdp"`` (the fast first search; ``"pld, rdp start"`` when it only starts a PLD
            calibration), ``"<accountant>, coarse grid"`` (a guide) or the final accountant (``"auto"``, ``"pld"``).
        evaluations: Accountant evaluations so far, over all stages.
        scale: The scale just evaluated.
        epsilon: Its epsilon at the target delta.
        best_scale: Smallest scale found within the target so far (``None`` if none yet).
        elapsed: Seconds since the calibration started.
    """

    stage: str
    evaluations: int
    scale: float
    epsilon: float
    best_scale: float | None
    elapsed: float

    def describe(self) -> str:
        """One line for a progress display.

        Example:
            >>> CalibrationProgress("pld", 7, 1.2, 1.05, 1.31, 2.5).describe()
            'calibrating (pld): 7 evaluations, 2.5 s; scale 1.2 gives epsilon 1.05; best so far 1.31'
        """
        best = "none yet" if self.best_scale is None else f"{self.best_scale:.6g}"
        return (
            f"calibrating ({self.stage}): {self.evaluations} evaluations, {self.elapsed:.1f} s; "
            f"scale {self.scale:.6g} gives epsilon {self.epsilon:.6g}; best so far {best}"
        )


class ProgressLine:
    """A calibration's progress on ``stream`` (``privopt account``): a live line on a terminal; in
    a log, the first evaluation, then a line every 2 s, and the last state at the end, so a log
    never stops on a stale line (it used to stop on the first evaluation's "best so far none yet"
    when the search ended within 2 s). Silent when ``quiet``. Call it with each
    :class:`CalibrationProgress`, then :meth:`finish`."""

    def __init__(self, stream, *, quiet: bool, every: float = 2.0):
        self._stream, self.quiet, self._every = stream, quiet, every
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last, self._pending, self._printed = -math.inf, None, False

    def __call__(self, p: CalibrationProgress) -> None:
        if self.quiet:
            return
        if self.tty:
            print("\r\033[K" + p.describe(), end="", file=self._stream, flush=True)
        elif time.monotonic() - self._last >= self._every:
            self._write(p)
        else:
            self._pending = p

    def _write(self, p: CalibrationProgress) -> None:
        self._last, self._pending, self._printed = time.monotonic(), None, True
        print(p.describe(), file=self._stream, flush=True)

    def finish(self) -> None:
        """Clear the live line, or write the last state if the log shows an earlier one."""
        if self.quiet:
            return
        if self.tty:
            print("\r\033[K", end="", file=self._stream, flush=True)
        elif self._printed and self._pending is not None:
            self._write(self._pending)


class SearchTimeout(Exception):
    """The search's time budget ran out (internal; the caller keeps the best scale found)."""


class NoFeasibleScale(Exception):
    """Even the largest scale misses the target (the caller explains why)."""


class _Converged(Exception):
    """A scale within target and within EPSILON_TOL of it was found."""


class ScaleSearch:
    """Smallest scale with ``eps_at(scale).epsilon <= target`` for one evaluator.

    Args:
        eps_at: Scale -> :class:`EpsilonResult` (monotone non-increasing in the scale).
        target: The target epsilon.
        stage: Name reported to ``progress``.
        epsilon_tol: Stop at a scale whose epsilon is within target and within this relative
            distance of it (the search aims at the middle of that window).
        clock: Shared state of the whole calibration: ``started``, ``deadline`` (monotonic
            seconds or ``inf``), ``evaluations`` (mutable count) and ``progress`` (callback or None).
    """

    def __init__(
        self,
        eps_at: Callable[[float], EpsilonResult],
        target: float,
        *,
        stage: str,
        clock: dict,
        epsilon_tol: float = EPSILON_TOL,
        slope: float = -1.0,
    ):
        self._eps_at, self._target, self._stage, self._clock = eps_at, target, stage, clock
        self._tol, self._slope = epsilon_tol, slope
        self._memo: dict[float, EpsilonResult] = {}
        self._slowest = 0.0
        self.best: tuple[float, EpsilonResult] | None = None

    def evaluate(self, u: float) -> EpsilonResult:
        """Epsilon at scale ``exp(u)``; raises :class:`SearchTimeout` when the budget is spent."""
        if u in self._memo:
            return self._memo[u]
        clock = self._clock
        if time.monotonic() + self._slowest > clock["deadline"]:
            raise SearchTimeout
        t0 = time.monotonic()
        scale = math.exp(u)
        res = self._eps_at(scale)
        self._slowest = max(self._slowest, time.monotonic() - t0)
        self._memo[u] = res
        clock["evaluations"] += 1
        if res.epsilon <= self._target and (self.best is None or scale < self.best[0]):
            self.best = (scale, res)
        if clock["progress"] is not None:
            best = None if self.best is None else self.best[0]
            elapsed = time.monotonic() - clock["started"]
            clock["progress"](CalibrationProgress(self._stage, clock["evaluations"], scale, res.epsilon, best, elapsed))
        return res

    def _gap(self, u: float) -> float:
        """``log(eps / aim)`` at scale ``exp(u)`` (clamped), where ``aim`` is the middle of the
        acceptance window; raises :class:`_Converged` once a scale lands in the window."""
        eps = self.evaluate(u).epsilon
        gap = -_CLAMP if eps <= 0 else max(-_CLAMP, min(_CLAMP, math.log(eps / self._target)))
        if math.log1p(-self._tol) <= gap <= 0:
            raise _Converged
        return gap - math.log1p(-self._tol / 2)

    def _bracket(self, u: float) -> tuple[float, float] | None:
        """``(lo, hi)`` in log-scale with gap(lo) > 0 >= gap(hi); ``None`` if every scale down to
        SCALE_MIN is within target. Guarded secant steps in log-log space (eps ~ 1/scale to start),
        overshooting slightly so that a good prediction brackets the crossing at once."""
        gap, prev, limit = self._gap(u), None, math.log(2.0)
        while True:
            slope = self._slope
            if prev is not None:
                secant = (gap - prev[1]) / (u - prev[0])
                slope = secant if -math.inf < secant < 0 else slope
            # A known starting slope (from a coarser search) aims straight at the window's middle.
            step = -gap / slope * (1.0 if prev is None and self._slope != -1.0 else 1.05)
            step = math.copysign(min(max(abs(step), 1e-6), limit), step)
            nu = u + step
            if nu < math.log(SCALE_MIN):
                return None
            if nu > math.log(SCALE_MAX):
                raise NoFeasibleScale
            ngap = self._gap(nu)
            if (ngap > 0) != (gap > 0):
                return (nu, u) if ngap > 0 else (u, nu)
            prev, u, gap, limit = (u, gap), nu, ngap, 2 * limit

    def slope_near(self, scale: float) -> float:
        """d log(eps) / d log(scale) from the two evaluated scales nearest ``scale`` (-1 if unknown)."""
        pts = sorted(
            ((abs(u - math.log(scale)), u, r.epsilon) for u, r in self._memo.items() if 0 < r.epsilon < math.inf),
        )[:2]
        if len(pts) < 2 or pts[0][1] == pts[1][1]:
            return -1.0
        slope = math.log(pts[0][2] / pts[1][2]) / (pts[0][1] - pts[1][1])
        return slope if -math.inf < slope < 0 else -1.0

    def run(self, start: float, *, rel_tol: float) -> tuple[float, EpsilonResult] | None:
        """Search from scale ``start`` until the best scale is within ``rel_tol`` of the crossing
        or its epsilon within ``epsilon_tol`` of the target; returns the best scale and its result.

        Raises:
            NoFeasibleScale: even :data:`SCALE_MAX` misses the target.
            SearchTimeout: the time budget ran out (:attr:`best` keeps the best scale so far).
        """
        try:
            bracket = self._bracket(math.log(start))
            if bracket is not None and bracket[1] - bracket[0] > rel_tol:
                optimize.brentq(self._gap, bracket[0], bracket[1], xtol=rel_tol, rtol=4 * 2.0**-52)
        except _Converged:
            pass
        return self.best
