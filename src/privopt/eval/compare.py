"""One method's runs against a baseline's: the difference of means, its Welch 95 % interval, a verdict.

The reports of the reproductions compare a proposed method with a baseline over a few seeds. A
difference of means alone does not say whether a gap is a result or the spread of the seeds, so
every report reads it through :func:`compare_means`: the runs of the two methods share no noise and
are compared as independent samples with unequal variances (Welch), and a side is claimed only when
the whole 95 % interval lies on it. The rule is documented once, in ``docs/RESULTS.md`` ("How
methods are compared over seeds").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["VERDICTS", "Difference", "compare_means", "finite_values", "verdict", "welch_interval"]

VERDICTS = ("ahead", "level", "ahead within noise", "behind within noise", "behind", "no interval")


@dataclass(frozen=True)
class Difference:
    """``mean(values) - mean(baseline)`` with its 95 % interval (``low``, ``high``; NaN with fewer than
    two runs on a side), the runs used on each side and the :func:`verdict`."""

    difference: float
    low: float
    high: float
    runs: int
    baseline_runs: int
    verdict: str


def finite_values(values: Iterable) -> list[float]:
    """The finite numbers of ``values`` as floats (``None``, NaN, infinities and non-numbers left out)."""
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def welch_interval(values: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """95 % confidence interval of ``mean(values) - mean(baseline)`` (Welch; unequal variances).

    By the formula rather than ``scipy.stats.ttest_ind``, which warns on samples whose values are
    all equal (worst-class accuracies of 0 % on every seed are common). Samples with no spread at
    all give the point; fewer than two values on a side give ``(nan, nan)``.
    """
    from scipy import stats

    if len(values) < 2 or len(baseline) < 2:
        return math.nan, math.nan
    d = statistics.fmean(values) - statistics.fmean(baseline)
    va, vb = statistics.variance(values) / len(values), statistics.variance(baseline) / len(baseline)
    if va + vb == 0:  # no spread at all: the interval is the point
        return d, d
    df = (va + vb) ** 2 / (va**2 / (len(values) - 1) + vb**2 / (len(baseline) - 1))
    half = float(stats.t.ppf(0.975, df)) * math.sqrt(va + vb)
    return d - half, d + half


def verdict(difference: float, low: float, high: float) -> str:
    """One of :data:`VERDICTS` for a difference and its interval.

    ``"ahead"`` / ``"behind"`` only when the whole interval lies above / below 0; ``"level"`` when
    the difference is 0 and the interval is that point (both sides the same constant);
    ``"ahead within noise"`` (difference ≥ 0) or ``"behind within noise"`` when the interval reaches
    0; ``"no interval"`` when there is none (NaN bounds: fewer than two runs on a side).
    """
    if math.isnan(low):
        return "no interval"
    if low > 0:
        return "ahead"
    if high < 0:
        return "behind"
    if difference == 0 and low == high:
        return "level"
    return "ahead within noise" if difference >= 0 else "behind within noise"


def compare_means(values: Iterable, baseline: Iterable) -> Difference:
    """The runs ``values`` of a method against the runs ``baseline`` of the baseline.

    Args:
        values: one metric's value per run (seed) of the method; ``None``, NaN and infinite values
            (runs that diverged or failed) are left out.
        baseline: the same metric per run of the baseline, filtered the same way.

    Returns:
        A :class:`Difference`. With fewer than two finite runs on a side the interval is NaN and the
        verdict is ``"no interval"``, never a claim; with no finite run on a side the difference is
        NaN too.

    Example:
        >>> d = compare_means([0.84, 0.83, 0.85], [0.80, 0.82, 0.81, 0.83])
        >>> round(d.difference, 4), round(d.low, 4), round(d.high, 4), d.verdict
        (0.025, 0.0027, 0.0473, 'ahead')
        >>> compare_means([0.81, 0.83], [0.80, 0.84]).verdict
        'ahead within noise'
        >>> compare_means([0.9], [0.1, 0.2]).verdict
        'no interval'
    """
    a, b = finite_values(values), finite_values(baseline)
    diff = statistics.fmean(a) - statistics.fmean(b) if a and b else math.nan
    low, high = welch_interval(a, b)
    return Difference(diff, low, high, len(a), len(b), verdict(diff, low, high))
