"""Tables, verdict and figures of the worst-group reproduction.

Example:
    >>> rows = [{"method": "dp-sgd", "label": "DP-SGD", "epsilon": 1.0, "worst_group_accuracy": 0.5,
    ...          "average_accuracy": 0.8, "worst_group_loss": 0.7, "epsilon_spent": 1.0, "per_group": {}}]
    >>> summarize(rows)[0]["worst_group_accuracy"]
    (0.5, 0.0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privopt.eval.compare import compare_means
from privopt.experiments.worst_group_protocol import PAPER_D

__all__ = [
    "per_group_table",
    "plot_rates",
    "plot_vs_epsilon",
    "rates_lines",
    "results_table",
    "summarize",
    "verdict",
    "verdict_markdown",
]

_METRICS = ("worst_group_accuracy", "average_accuracy", "worst_group_loss", "epsilon_spent", "wall_s")
_PER_SEED = ("worst_group_accuracy", "average_accuracy")  # kept run by run: the verdict's interval needs them


def _stats(values: Sequence[float]) -> tuple[float, float, int]:
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return (math.nan, math.nan, 0)
    return (float(np.mean(v)), float(np.std(v)), len(v))


def summarize(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """Mean, std and count over seeds of each metric, per (method, ε), in first-seen order; ``per_seed``
    keeps each run's worst-group and average accuracy (in row order) for :func:`verdict`'s interval."""
    keys: list[tuple[str, Any]] = []
    for r in rows:
        if (r["method"], r["epsilon"]) not in keys:
            keys.append((r["method"], r["epsilon"]))
    out = []
    for method, eps in keys:
        sel = [r for r in rows if r["method"] == method and r["epsilon"] == eps]
        entry = {"method": method, "label": sel[0]["label"], "epsilon": eps}
        entry.update({k: _stats([r.get(k) for r in sel]) for k in _METRICS})
        entry["per_seed"] = {k: [r.get(k) for r in sel] for k in _PER_SEED}
        entry["failed"] = sum(1 for r in sel if r.get("error"))
        out.append(entry)
    return out


def _cell(stat: tuple[float, float, int]) -> str:
    mean, std, n = stat
    return "failed" if n == 0 else f"{mean:.3f} ± {std:.3f}" if n > 1 else f"{mean:.3f}"  # one run: no spread


def results_table(summary: Sequence[dict], epsilons: Sequence[float]) -> str:
    """Markdown: worst-group test accuracy (average accuracy) per method and ε."""
    head = "| method | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |"
    lines = [head, "|---|" + "---:|" * len(epsilons)]
    methods = list(dict.fromkeys(s["method"] for s in summary))
    for m in methods:
        cells = []
        for e in epsilons:
            s = next((x for x in summary if x["method"] == m and (x["epsilon"] == e or x["epsilon"] is None)), None)
            cells.append("–" if s is None else f"{_cell(s['worst_group_accuracy'])} ({s['average_accuracy'][0]:.3f})")
        label = next(x["label"] for x in summary if x["method"] == m)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_group_table(rows: Sequence[dict], *, epsilon: float, group_names: Sequence[str]) -> str:
    """Markdown: mean per-group test accuracy over seeds at ``epsilon`` (non-private methods included)."""
    from privopt.eval.worst_group import group_accuracy_table

    table_rows = []
    for m in dict.fromkeys(r["method"] for r in rows):
        sel = [r for r in rows if r["method"] == m and r["epsilon"] in (epsilon, None) and r.get("per_group")]
        if sel:
            means = {g: {"accuracy": float(np.mean([r["per_group"][g]["accuracy"] for r in sel]))} for g in group_names}
            table_rows.append({"label": sel[0]["label"], "per_group": means})
    return group_accuracy_table(table_rows, group_names=group_names)


def verdict(summary: Sequence[dict], *, epsilons: Sequence[float] = (1.0, 2.0, 5.0)) -> list[dict[str, Any]]:
    """At each ε: the best Paper D method (by mean worst-group accuracy) against DP-SGD in the same run.

    The difference of the two mean worst-group accuracies, its Welch 95 % interval over the seeds
    (``low``, ``high``; NaN with fewer than two runs on a side) and the verdict of
    :func:`privopt.eval.compare.compare_means` (``docs/RESULTS.md``, "How methods are compared over
    seeds"); ``summary`` rows come from :func:`summarize` (their ``per_seed`` values).
    """
    out = []
    for e in epsilons:
        cands = [s for s in summary if s["method"] in PAPER_D and s["epsilon"] == e and s["worst_group_accuracy"][2]]
        base = next((s for s in summary if s["method"] == "dp-sgd" and s["epsilon"] == e), None)
        if not cands or base is None:
            continue
        best = max(cands, key=lambda s: s["worst_group_accuracy"][0])
        d = compare_means(best["per_seed"]["worst_group_accuracy"], base["per_seed"]["worst_group_accuracy"])
        out.append(
            {
                "epsilon": e,
                "best_method": best["method"],
                "best_label": best["label"],
                "best_worst_group_accuracy": best["worst_group_accuracy"][0],
                "best_average_accuracy": best["average_accuracy"][0],
                "dp_sgd_worst_group_accuracy": base["worst_group_accuracy"][0],
                "dp_sgd_average_accuracy": base["average_accuracy"][0],
                "difference": d.difference,
                "low": d.low,
                "high": d.high,
                "runs": d.runs,
                "baseline_runs": d.baseline_runs,
                "verdict": d.verdict,
            }
        )
    return out


def verdict_markdown(verdicts: Sequence[dict]) -> str:
    """Markdown: :func:`verdict`'s comparisons as a table (accuracies as fractions) and a count line."""
    if not verdicts:
        return ""
    lines = [
        "| ε | best Paper D method | worst-group (avg) | DP-SGD worst-group (avg) | difference | 95 % interval "
        "| runs | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        interval = "–" if math.isnan(v["low"]) else f"[{v['low']:+.3f}, {v['high']:+.3f}]"
        lines.append(
            f"| {v['epsilon']:g} | {v.get('best_label', v['best_method'])} | "
            f"{v['best_worst_group_accuracy']:.3f} ({v['best_average_accuracy']:.3f}) | "
            f"{v['dp_sgd_worst_group_accuracy']:.3f} ({v['dp_sgd_average_accuracy']:.3f}) | {v['difference']:+.3f} | "
            f"{interval} | {v['runs']} / {v['baseline_runs']} | {v['verdict']} |"
        )
    count = {k: sum(1 for v in verdicts if v["verdict"] == k) for k in ("ahead", "behind", "no interval")}
    within = sum(1 for v in verdicts if v["verdict"].endswith("within noise") or v["verdict"] == "level")
    lines += [
        "",
        f"Of {len(verdicts)} ε values: {count['ahead']} ahead of DP-SGD with the whole interval above zero, {within} "
        f"within the seeds' noise, {count['behind']} behind with the whole interval below zero, "
        f"{count['no interval']} without an interval (fewer than two runs on a side).",
    ]
    return "\n".join(lines)


def plot_vs_epsilon(summary: Sequence[dict], path: Path, *, title: str) -> None:
    """Worst-group test accuracy against ε per method (mean ± std); non-private methods as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in dict.fromkeys(s["method"] for s in summary):
        sel = [s for s in summary if s["method"] == m]
        if sel[0]["epsilon"] is None:
            ax.axhline(sel[0]["worst_group_accuracy"][0], ls="--", color="grey", label=sel[0]["label"])
            continue
        sel = sorted(sel, key=lambda s: s["epsilon"])
        eps = [s["epsilon"] for s in sel]
        mean = [s["worst_group_accuracy"][0] for s in sel]
        std = [s["worst_group_accuracy"][1] for s in sel]
        style = "-o" if m in PAPER_D else ":s"
        ax.errorbar(eps, mean, yerr=std, fmt=style, capsize=3, label=sel[0]["label"])
    ax.set_xscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("worst-group test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rates_lines(rates: dict[str, Any]) -> list[str]:
    """One markdown line per ε of the K-rate sweep: measured slope (95 % bootstrap interval) beside the theorem's."""
    lines = []
    for eps, c in rates["curves"].items():
        lo, hi = c["measured_slope_ci95"]
        share = ", ".join(f"{s:.2f}" for s in c["privacy_share"])
        line = (
            f"- rates, ε = {eps}, K = {c['ks'][0]:,}…{c['ks'][-1]:,} ({rates['seeds']} seeds): measured slope "
            f"{c['measured_slope']:.3f} [95 % CI {lo:.3f}, {hi:.3f}]; privacy share of the excess {share}; "
        )
        crossing = " (the share crosses 1/2 inside the range)" if c["share_crosses_half"] else ""
        line += (
            f"dominant term: {c['dominant_term']}{crossing}"
            f", Theorem 2 slope {c['theorem_slope']:g} (with its logs {c['theorem_slope_with_logs']:.3f}); "
            f"within ±0.15: {c['within_015']}"
        )
        lines.append(line)
    return lines


def plot_rates(rates: dict[str, Any], path: Path) -> None:
    """Excess worst-group risk against K (log-log) per ε, the non-private twin, and the theorem's slope
    for the measured dominant term through the first point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for eps, curve in rates["curves"].items():
        ks, y = np.array(curve["ks"], dtype=float), np.array(curve["excess"])
        lo, hi = curve["measured_slope_ci95"]
        label = f"ε = {eps}: slope {curve['measured_slope']:.2f} [{lo:.2f}, {hi:.2f}]"
        line = ax.loglog(ks, y, "o-", label=label)[0]
        ax.loglog(ks, curve["excess_non_private"], "x:", color=line.get_color(), alpha=0.7,
                  label=f"ε = {eps}: non-private twin")  # fmt: skip
        if "theorem_slope" in curve:
            ref = y[0] * (ks / ks[0]) ** curve["theorem_slope"]
            label = f"ε = {eps}: Theorem 2 {curve['dominant_term']} term, slope {curve['theorem_slope']:g}"
            ax.loglog(ks, ref, "--", color=line.get_color(), alpha=0.6, label=label)
    ax.set_xlabel("K (samples, all groups)")
    ax.set_ylabel("excess worst-group risk")
    ax.set_title("Minimax Phased ERM on synthetic-groups (p = 4)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
