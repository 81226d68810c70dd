"""Aggregation, tables and figures of Paper B's Covertype experiment (:mod:`privopt.experiments.erm_covertype`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_results", "summarize", "summary_markdown"]


# ---------------------------------------------------------------------------------- aggregation
def _mean_curve(curves: list[list[dict]]) -> dict[str, np.ndarray]:
    # All runs of one configuration have the same evaluation points; average pointwise.
    k = min(len(c) for c in curves)
    arr = {key: np.array([[pt[key] for pt in c[:k]] for c in curves]) for key in ("wall_s", "passes", "gap")}
    return {key: v.mean(axis=0) for key, v in arr.items()}


def _gap_at(curve: dict[str, np.ndarray], key: str, x: float) -> float:
    """Mean gap of a curve at abscissa x (last point reached at or before x; NaN before the start)."""
    xs = curve[key]
    i = int(np.searchsorted(xs, x, side="right")) - 1
    return float(curve["gap"][i]) if i >= 0 else float("nan")


def summarize(rows: list[dict]) -> dict[str, Any]:
    """Per (setting, method, epsilon): the best step size and its mean/std gap, time and passes,
    plus the gap each method reaches within the other's wall time ("equal time")."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["method"], r["epsilon"], r["step_size"]), []).append(r)
    best: dict[tuple, dict] = {}
    for (setting, method, eps, step), rs in groups.items():
        gaps = np.array([r["gap"] for r in rs])
        entry = {
            "setting": setting,
            "method": method,
            "epsilon": eps,
            "step_size": step,
            "runs": len(rs),
            "gap_mean": float(gaps.mean()),
            "gap_std": float(gaps.std()),
            "wall_s_mean": float(np.mean([r["wall_s"] for r in rs])),
            "passes": float(np.mean([r["passes"] for r in rs])),
            "epsilon_spent_max": float(max(r["epsilon_spent"] for r in rs)),
            "curve": _mean_curve([r["curve"] for r in rs]),
        }
        key = (setting, method, eps)
        if key not in best or entry["gap_mean"] < best[key]["gap_mean"]:
            best[key] = entry
    comparisons = []
    for (setting, method, eps), e in best.items():
        if method == "dp-gd":
            continue
        gd = best.get((setting, "dp-gd", eps))
        if gd is None:
            continue
        comparisons.append(
            {
                "setting": setting,
                "method": method,
                "epsilon": eps,
                "method_gap": e["gap_mean"],
                "method_wall_s": e["wall_s_mean"],
                "dp_gd_gap_at_method_time": _gap_at(gd["curve"], "wall_s", e["wall_s_mean"]),
                "dp_gd_gap_final": gd["gap_mean"],
                "dp_gd_wall_s": gd["wall_s_mean"],
                "method_gap_at_dp_gd_time": _gap_at(e["curve"], "wall_s", gd["wall_s_mean"]),
                "method_better_at_equal_time": bool(
                    e["gap_mean"] < _gap_at(gd["curve"], "wall_s", e["wall_s_mean"])
                    if e["wall_s_mean"] <= gd["wall_s_mean"]
                    else _gap_at(e["curve"], "wall_s", gd["wall_s_mean"]) < gd["gap_mean"]
                ),
            }
        )
    table = []
    for e in sorted(best.values(), key=lambda d: (d["setting"], d["epsilon"], d["method"])):
        t = {k: v for k, v in e.items() if k != "curve"}
        t["curve"] = {k: v.tolist() for k, v in e["curve"].items()}
        table.append(t)
    return {"best": table, "comparisons": comparisons}


def summary_markdown(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    lines = ["# Paper B on Covertype: DP-SVRG / DP-SVRG++ vs DP-GD", ""]
    if meta:
        lines += [
            f"n = {meta['n_train']}, p = {meta['dim']}, delta = {meta['delta']}, budget = {meta['budget']}, "
            f"{meta['runs']} runs per configuration; positive class: {meta['positive_class']} "
            f"({100 * meta['positive_share']:.1f}% of rows); neighbouring: {meta['neighbouring']}; "
            f"accountant: {meta['accountant']}.",
            "",
        ]
    lines += [
        "Best constant step size per method (chosen non-privately by mean final gap).",
        "",
        "| setting | method | ε | step | gap (mean ± std) | wall s | passes | ε spent (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in summary["best"]:
        lines.append(
            f"| {e['setting']} | {e['method']} | {e['epsilon']:g} | {e['step_size']:g} | "
            f"{e['gap_mean']:.4g} ± {e['gap_std']:.2g} | {e['wall_s_mean']:.2f} | {e['passes']:.1f} | "
            f"{e['epsilon_spent_max']:.4f} |"
        )
    lines += [
        "",
        "Equal-time comparison (mean curves): the gap DP-GD reaches within the method's wall time, "
        "and the method's gap within DP-GD's wall time.",
        "",
        "| setting | method | ε | method gap (its time s) | DP-GD gap at that time | DP-GD final gap (its time s) "
        "| method gap at DP-GD time | method better at equal time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["comparisons"]:
        lines.append(
            f"| {c['setting']} | {c['method']} | {c['epsilon']:g} | {c['method_gap']:.4g} "
            f"({c['method_wall_s']:.2f}) | {c['dp_gd_gap_at_method_time']:.4g} | {c['dp_gd_gap_final']:.4g} "
            f"({c['dp_gd_wall_s']:.2f}) | {c['method_gap_at_dp_gd_time']:.4g} | "
            f"{'yes' if c['method_better_at_equal_time'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def plot_results(rows: list[dict], summary: dict[str, Any], out: Path) -> list[Path]:
    """Gap vs wall time and vs passes, one panel per epsilon, best step size per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from privopt.plots import save_figure

    paths = []
    for fig_no, setting in ((1, "regularized"), (2, "unregularized")):
        entries = [e for e in summary["best"] if e["setting"] == setting]
        eps_list = sorted({e["epsilon"] for e in entries})
        if not eps_list:
            continue
        for key, xlabel in (("wall_s", "wall time (s)"), ("passes", "passes over the data")):
            fig, axes = plt.subplots(1, len(eps_list), figsize=(4.2 * len(eps_list), 3.4), squeeze=False)
            for ax, eps in zip(axes[0], eps_list):
                for e in (e for e in entries if e["epsilon"] == eps):
                    xs = np.asarray(e["curve"][key])
                    ys = np.maximum(np.asarray(e["curve"]["gap"]), 1e-12)
                    ax.plot(xs[1:], ys[1:], marker=".", ms=3, label=f"{e['method']} (η={e['step_size']:g})")
                ax.set_yscale("log")
                if key == "wall_s":
                    ax.set_xscale("log")
                ax.set_xlabel(xlabel)
                ax.set_title(f"ε = {eps:g}")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
            axes[0][0].set_ylabel("optimality gap F(w) − F*")
            fig.suptitle(f"Fig. {fig_no}: {setting} logistic regression on Covertype")
            path = out / f"fig{fig_no}_gap_vs_{'time' if key == 'wall_s' else 'passes'}.png"
            save_figure(fig, path)
            paths.append(path)
    return paths
