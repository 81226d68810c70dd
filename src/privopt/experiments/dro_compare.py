"""The proposed SPIDER methods against the DP-SGD baseline, with the seed-to-seed noise shown.

A table of means says which method is ahead; it does not say whether a gap of a tenth of a
point is a result or the spread of the seeds. For each ε and metric this module takes the
better of the proposed methods (by its mean on that metric), its difference to the baseline's
mean and a Welch two-sample 95 % confidence interval of that difference (the runs of different
methods share no noise, so they are compared as independent samples). The verdict reads the sign
and the interval together: *ahead* or *behind* only when the whole interval lies on that side of
zero, *ahead within noise* / *behind within noise* when it reaches zero (the shared rule of
:func:`privopt.eval.compare.compare_means`, ``docs/RESULTS.md``). See ``docs/algorithms/dro.md``.

Choosing the better of two methods after the fact favours them slightly; the interval does not
correct for that choice, which is one more reason to read "within noise" as a tie.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from privopt.eval.compare import VERDICTS, compare_means, finite_values
from privopt.experiments.dro_protocol import METHOD_LABELS

__all__ = ["BASELINE", "CANDIDATES", "VERDICTS", "Comparison", "compare_to_baseline", "comparison_markdown"]

BASELINE = "dp-sgd"
CANDIDATES = ("dp-double-spider", "dp-recursive-spider")
METRICS = (("test_balanced_accuracy", "balanced"), ("test_worst_class_accuracy", "worst class"))


@dataclass(frozen=True)
class Comparison:
    """One (ε, metric) cell: the better candidate's mean minus the baseline's.

    ``difference`` … ``verdict`` are those of :class:`privopt.eval.compare.Difference` (``verdict``
    one of :data:`VERDICTS`), repeated flat after the cell's keys so that ``summary.json``'s
    ``baseline_comparison`` keeps its layout.
    """

    epsilon: float
    metric: str
    method: str
    difference: float
    low: float
    high: float
    runs: int
    baseline_runs: int
    verdict: str


def compare_to_baseline(
    rows: Sequence[dict],
    *,
    epsilons: Sequence[float],
    baseline: str = BASELINE,
    candidates: Sequence[str] = CANDIDATES,
) -> list[Comparison]:
    """Compare the better of ``candidates`` with ``baseline`` at every ε, on each metric of METRICS.

    ``rows`` are the reproduction's result rows (``method``, ``epsilon`` and the metrics; runs
    that diverged carry no finite metric and are left out). Cells where the baseline or every
    candidate has no finite run are skipped.

    Example:
        >>> rows = [{"method": m, "epsilon": 1.0, "test_balanced_accuracy": a,
        ...          "test_worst_class_accuracy": a - 0.1}
        ...         for m, accs in {"dp-sgd": [0.80, 0.82, 0.81],
        ...                         "dp-double-spider": [0.81, 0.83, 0.82]}.items() for a in accs]
        >>> [(c.metric, round(c.difference, 4), c.verdict) for c in compare_to_baseline(rows, epsilons=[1.0])]
        [('balanced', 0.01, 'ahead within noise'), ('worst class', 0.01, 'ahead within noise')]
    """

    def values(method: str, eps: float, key: str) -> list[float]:
        return finite_values(r.get(key) for r in rows if r["method"] == method and r["epsilon"] == eps)

    out = []
    for eps in epsilons:
        for key, name in METRICS:
            base = values(baseline, eps, key)
            runs = {m: v for m in candidates if (v := values(m, eps, key))}
            if not base or not runs:
                continue
            best = max(runs, key=lambda m: statistics.fmean(runs[m]))
            d = compare_means(runs[best], base)
            out.append(Comparison(eps, name, best, d.difference, d.low, d.high, d.runs, d.baseline_runs, d.verdict))
    return out


def comparison_markdown(comparisons: Sequence[Comparison], *, scale: float = 100.0) -> str:
    """A table of the comparisons (differences in points when ``scale`` is 100) and a count line."""
    if not comparisons:
        return ""
    lines = [
        "| ε | metric | better SPIDER method | difference | 95 % interval | runs | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        interval = "–" if math.isnan(c.low) else f"[{c.low * scale:+.2f}, {c.high * scale:+.2f}]"
        lines.append(
            f"| {c.epsilon:g} | {c.metric} | {METHOD_LABELS.get(c.method, c.method)} | "
            f"{c.difference * scale:+.2f} | {interval} | {c.runs} / {c.baseline_runs} | {c.verdict} |"
        )
    at_least = sum(1 for c in comparisons if c.difference >= 0)
    counts = {v: sum(1 for c in comparisons if c.verdict == v) for v in VERDICTS}
    lines += [
        "",
        f"{at_least} of {len(comparisons)} cells at or above DP-SGD ({counts['ahead']} with the whole interval "
        f"above zero), {counts['behind within noise']} behind within the seeds' noise, {counts['behind']} behind "
        "with the whole interval below zero.",
    ]
    return "\n".join(lines)
