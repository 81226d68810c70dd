"""Aggregation and tables of Paper B's Covertype comparison (:mod:`privopt.experiments.erm_covertype`).

:func:`summarize` turns the run rows and the tuning selections into per-method results, the
paper's printed-schedule references and one comparison per setting and epsilon (the proposed
method against DP-GD, both on their tuned schedules); :func:`summary_markdown` renders them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privopt.eval.compare import compare_means
from privopt.experiments.privacy_notes import notes_markdown

__all__ = ["summarize", "summary_markdown"]


def _mean_curve(curves: list[list[dict]]) -> dict[str, list[float]]:
    # All runs of one configuration have the same evaluation points; average pointwise.
    k = min(len(c) for c in curves)
    return {
        key: np.mean([[pt[key] for pt in c[:k]] for c in curves], axis=0).tolist()
        for key in ("wall_s", "passes", "gap")
    }


def _aggregate(rs: list[dict]) -> dict[str, Any]:
    gaps = np.array([r["gap"] for r in rs])
    return {
        "runs": len(rs),
        "gap_mean": float(gaps.mean()),
        "gap_std": float(gaps.std(ddof=1)) if len(rs) > 1 else 0.0,
        "wall_s_mean": float(np.mean([r["wall_s"] for r in rs])),
        "cpu_s_mean": float(np.mean([r["cpu_s"] for r in rs])),
        "passes": float(np.mean([r["passes"] for r in rs])),
        "epsilon_spent_max": float(max(r["epsilon_spent"] for r in rs)),
        "noise_multipliers": rs[0]["noise_multipliers"],
        "curve": _mean_curve([r["curve"] for r in rs]),
    }


def _groups(rows: list[dict], phase: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["phase"] == phase:
            out.setdefault((r["setting"], r["method"], r["epsilon"]), []).append(r)
    return out


# The shared verdict (privopt.eval.compare) in the gap's words: a gap above DP-GD's is "larger".
_GAP_VERDICTS = {"ahead": "larger", "behind": "smaller", "no interval": "n/a (1 run)"}  # the rest: "tie"


def _compare(setting: str, eps: float, proposed: dict, gd: dict, gaps: list[float], gd_gaps: list[float]):
    """The proposed method's runs against DP-GD's: the difference of the mean gaps with its Welch 95 %
    interval; "smaller" / "larger" only when the whole interval is on that side of 0."""
    d = compare_means(gaps, gd_gaps)
    verdict = _GAP_VERDICTS.get(d.verdict, "tie")  # no interval from one run: no verdict either
    return {
        "setting": setting,
        "epsilon": eps,
        "method": proposed["method"],
        "method_gap": proposed["gap_mean"],
        "dp_gd_gap": gd["gap_mean"],
        "gap_ratio": proposed["gap_mean"] / gd["gap_mean"] if gd["gap_mean"] > 0 else math.inf,
        "gap_difference": d.difference,
        "gap_ci95": [d.low, d.high],  # Welch, over the runs; NaN with one run
        "gap_verdict": verdict,
        "method_wall_s": proposed["wall_s_mean"],
        "dp_gd_wall_s": gd["wall_s_mean"],
        "method_passes": proposed["passes"],
        "dp_gd_passes": gd["passes"],
        "both_interior": bool(proposed["interior"] and gd["interior"]),
        "claim_holds": None
        if verdict.startswith("n/a")
        else bool(verdict == "smaller" and proposed["wall_s_mean"] < gd["wall_s_mean"]),
    }


def _gaps(rs: list[dict]) -> list[float]:
    return [r["gap"] for r in rs]


def summarize(rows: list[dict], selections: list[dict], proposed: dict[str, str]) -> dict[str, Any]:
    """Per (setting, method, epsilon): the tuned schedule and its final-run statistics; the printed
    references; and per (setting, epsilon) the proposed method (``proposed[setting]``) against DP-GD."""
    chosen = {(s["setting"], s["method"], s["epsilon"]): s for s in selections}
    methods = []
    for key, rs in sorted(_groups(rows, "final").items()):
        sel = chosen[key]
        entry = {"setting": key[0], "method": key[1], "epsilon": key[2], "schedule": rs[0]["schedule"]}
        entry.update(tuning_gap=sel["tuning_gap"], interior=sel["interior"], last_gain=sel["last_gain"])
        entry.update(profile=sel["profile"])
        entry.update(_aggregate(rs))
        methods.append(entry)
    printed = []
    for key, rs in sorted(_groups(rows, "printed").items()):
        printed.append(
            {"setting": key[0], "method": key[1], "epsilon": key[2], "schedule": rs[0]["schedule"], **_aggregate(rs)}
        )
    by_key = {(m["setting"], m["method"], m["epsilon"]): m for m in methods}
    finals = _groups(rows, "final")
    comparisons = [
        _compare(s, e, m, by_key[(s, "dp-gd", e)], _gaps(finals[(s, meth, e)]), _gaps(finals[(s, "dp-gd", e)]))
        for (s, meth, e), m in by_key.items()
        if meth == proposed.get(s) and (s, "dp-gd", e) in by_key
    ]
    return {"methods": methods, "printed": printed, "comparisons": comparisons}


def _schedule(s: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items())


def _convergence(e: dict[str, Any]) -> str:
    """'yes' when the kept run length is interior; at the grid's edge, the last length's gain."""
    if e["interior"]:
        return "yes"
    return f"edge ({100 * e['last_gain']:+.0f}% from the last ×length)"


def _gap(e: dict[str, Any]) -> str:
    """``mean ± std``; a single run has no spread to show (not ``± 0``)."""
    return f"{e['gap_mean']:.4g} ± {e['gap_std']:.2g}" if e["runs"] > 1 else f"{e['gap_mean']:.4g} (1 run)"


def _difference(c: dict[str, Any]) -> str:
    low, high = c["gap_ci95"]
    return f"{c['gap_difference']:+.3g}" + ("" if math.isnan(low) else f" [{low:+.3g}, {high:+.3g}]")


def _claim(c: dict[str, Any]) -> str:
    return {True: "holds", False: "does not hold", None: "not tested (1 run)"}[c["claim_holds"]]


def _method_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| setting | method | ε | tuned schedule | interior length | gap on training set (mean ± std) | wall s | CPU s "
        "| passes | ε spent (max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary["methods"]:
        lines.append(
            f"| {e['setting']} | {e['method']} | {e['epsilon']:g} | {_schedule(e['schedule'])} | "
            f"{_convergence(e)} | {_gap(e)} | "
            f"{e['wall_s_mean']:.2f} | {e['cpu_s_mean']:.2f} | {e['passes']:.1f} | {e['epsilon_spent_max']:.4f} |"
        )
    return lines


def summary_markdown(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    lines = ["# Paper B on Covertype: DP-SVRG / DP-SVRG++ / DP-AMD vs DP-GD, tuned schedules", ""]
    if meta:
        lines += [
            f"n = {meta['n_train']} training rows, {meta['n_tune']} disjoint tuning rows, p = {meta['dim']}, "
            f"delta = {meta['delta']}, budget = {meta['budget']}; {meta['runs']} final runs and "
            f"{meta['tune_runs']} tuning runs per grid point; neighbouring: {meta['neighbouring']}; accountant: "
            f"{meta['accountant']}; ℓ1 radius {meta['l1_radius']:g}.",
            "",
        ]
    lines += [
        "Each method's schedule (run length × step size) was chosen per ε on the tuning set; 'interior length: yes' "
        "says the chosen run length is below the grid's largest (longer runs were tried and were worse); 'edge' "
        "gives the tuning-gap decrease the largest length brought over the one before it.",
        "",
        *_method_table(summary),
        "",
        "Proposed method against DP-GD (both tuned). Gap verdict: the difference of the mean gaps and its Welch "
        "95 % interval over the runs; 'smaller' / 'larger' only when the whole interval is on that side of 0, "
        "else 'tie' (docs/RESULTS.md, 'How methods are compared over seeds').",
        "",
        "| setting | method | ε | method gap | DP-GD gap | ratio | difference [95 % interval] | verdict "
        "| method wall s / passes | DP-GD wall s / passes | paper's claim (smaller gap, less time) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["comparisons"]:
        lines.append(
            f"| {c['setting']} | {c['method']} | {c['epsilon']:g} | {c['method_gap']:.4g} | {c['dp_gd_gap']:.4g} | "
            f"{c['gap_ratio']:.3g} | {_difference(c)} | {c['gap_verdict']} | "
            f"{c['method_wall_s']:.2f} / {c['method_passes']:.1f} | "
            f"{c['dp_gd_wall_s']:.2f} / {c['dp_gd_passes']:.1f} | {_claim(c)} |"
        )
    if summary["printed"]:
        lines += [
            "",
            "The paper's printed schedules (references, not tuned):",
            "",
            "| setting | method | ε | schedule | gap (mean ± std) | wall s | passes |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in summary["printed"]:
            lines.append(
                f"| {e['setting']} | {e['method']} | {e['epsilon']:g} | {_schedule(e['schedule'])} | "
                f"{_gap(e)} | {e['wall_s_mean']:.2f} | {e['passes']:.1f} |"
            )
    if summary.get("not_private") or summary.get("hyperparameter_tuning"):
        lines += ["", notes_markdown(summary)]
    return "\n".join(lines) + "\n"
