"""Tables, claim checks and figures of Paper C's reproduction (``privopt reproduce sosp``).

Everything here reads the rows of ``results.jsonl`` (one per run); nothing is copied from the paper,
which prints no numbers: its claims are checked against the measured means.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from privopt.eval.compare import compare_means
from privopt.experiments.sosp_protocol import METHOD_LABELS

__all__ = ["aggregate", "format_table", "format_diagnostics", "check_claims", "format_claims", "plot_curves"]

GAUSS, BASELINE, DPSGD = "gauss-psgd", "dp-spider-sosp", "fed-dp-sgd"


def _runs(rows: list[dict[str, Any]], key: str = "test_accuracy") -> dict[tuple, list[float]]:
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["clients"], r["epsilon"])].append(float(r[key]))
    return groups


def _interval(runs: dict[tuple, list[float]], method: str, baseline: str, clients: int, eps: float) -> dict:
    """The shared comparison over seeds (privopt.eval.compare): difference, Welch 95 % interval, verdict."""
    d = compare_means(runs[(method, clients, eps)], runs[(baseline, clients, eps)])
    return {"clients": clients, "epsilon": eps, "difference": d.difference, "low": d.low, "high": d.high,
            "verdict": d.verdict}  # fmt: skip


def aggregate(rows: list[dict[str, Any]], key: str = "test_accuracy") -> dict[tuple, tuple[float, float, int]]:
    """``{(method, clients, epsilon): (mean, std, runs)}`` of ``key`` (std over seeds; 0 for one run)."""
    groups = _runs(rows, key)
    return {
        k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for k, v in sorted(groups.items())
    }


def format_table(rows: list[dict[str, Any]], key: str = "test_accuracy", scale: float = 100.0, digits: int = 1) -> str:
    """A markdown table: one line per (m, ε), one column per method, ``mean ± std`` of ``key`` (× scale,
    ``digits`` decimals; the mean alone for one run, which has no spread)."""
    agg = aggregate(rows, key)
    methods = [m for m in METHOD_LABELS if any(k[0] == m for k in agg)]
    settings = sorted({(k[1], k[2]) for k in agg})
    head = "| m | ε | " + " | ".join(METHOD_LABELS[m] for m in methods) + " |"
    lines = [head, "|" + "---|" * (2 + len(methods))]
    for clients, eps in settings:
        cells = []
        for m in methods:
            if (m, clients, eps) in agg:
                mean, std, runs = agg[(m, clients, eps)]
                spread = f" ± {scale * std:.{digits}f}" if runs > 1 else ""
                cells.append(f"{scale * mean:.{digits}f}{spread}")
            else:
                cells.append("—")
        lines.append(f"| {clients} | {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_claims(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The paper's claims and the issue's bars, from the mean test accuracies; beside them the
    difference, Welch 95 % interval and verdict over the seeds (``against_baseline`` per (m, ε),
    ``gauss_vs_dpsgd_eps1_m1_interval``) that say whether a gap is more than the seeds' noise."""
    agg, runs = {k: v[0] for k, v in aggregate(rows).items()}, _runs(rows)
    settings = sorted({(k[1], k[2]) for k in agg if k[0] == GAUSS and (BASELINE, k[1], k[2]) in agg})
    wins = [(m, e) for m, e in settings if agg[(GAUSS, m, e)] > agg[(BASELINE, m, e)]]
    gaps = {}
    for m in sorted({s[0] for s in settings}):
        gaps[m] = statistics.fmean(agg[(GAUSS, m, e)] - agg[(BASELINE, m, e)] for mm, e in settings if mm == m)
    ms = sorted(gaps)
    out: dict[str, Any] = {
        "beats_baseline_everywhere": bool(settings) and len(wins) == len(settings),
        "beats_baseline_in": [list(s) for s in wins],
        "loses_to_baseline_in": [list(s) for s in settings if s not in wins],
        "gap_by_clients": gaps,
        "against_baseline": [_interval(runs, GAUSS, BASELINE, m, e) for m, e in settings],
        # Gauss-PSGD ahead at every m, and further ahead the more clients there are.
        "gap_widens_with_m": None  # not testable on one m
        if len(ms) < 2
        else all(g > 0 for g in gaps.values()) and all(gaps[a] < gaps[b] for a, b in zip(ms, ms[1:])),
    }
    if (GAUSS, 1, 1.0) in agg and (DPSGD, 1, 1.0) in agg:
        out["gauss_vs_dpsgd_eps1_m1"] = [agg[(GAUSS, 1, 1.0)], agg[(DPSGD, 1, 1.0)]]
        out["gauss_at_least_dpsgd_eps1_m1"] = agg[(GAUSS, 1, 1.0)] >= agg[(DPSGD, 1, 1.0)]
        out["gauss_vs_dpsgd_eps1_m1_interval"] = _interval(runs, GAUSS, DPSGD, 1, 1.0)
    if (GAUSS, 1, 1.0) in agg and (GAUSS, 10, 1.0) in agg:
        ratio = agg[(GAUSS, 10, 1.0)] / agg[(GAUSS, 1, 1.0)]
        out["gauss_m10_over_m1_eps1"] = ratio
        out["gauss_m10_at_least_80pct"] = ratio >= 0.8
    return out


def _yes(flag: bool | None) -> str:
    return "not tested (needs two or more m)" if flag is None else "holds" if flag else "does NOT hold"


def _noise(c: dict[str, Any] | None) -> str:
    """A comparison over seeds in points: the difference, its 95 % interval and the verdict."""
    if c is None:  # claims written before the intervals were added
        return ""
    interval = "" if math.isnan(c["low"]) else f" [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
    return f"; difference {100 * c['difference']:+.1f}{interval} points over the seeds: {c['verdict']}"


def _counts(comparisons: list[dict[str, Any]]) -> str:
    if not comparisons:
        return ""
    n = {v: sum(1 for c in comparisons if c["verdict"] == v) for v in ("ahead", "behind", "no interval")}
    noise = len(comparisons) - sum(n.values())
    return (
        f"; by the Welch 95 % interval over the seeds: {n['ahead']} ahead, {noise} within noise, "
        f"{n['behind']} behind, {n['no interval']} without an interval"
    )


def format_claims(claims: dict[str, Any]) -> str:
    """The closing note: where the paper's claims and the issue's bars hold and where not."""
    won, lost = claims["beats_baseline_in"], claims["loses_to_baseline_in"]
    lines = [
        f"* Gauss-PSGD beats the baseline in every configuration: {_yes(claims['beats_baseline_everywhere'])} "
        f"({len(won)} of {len(won) + len(lost)} configurations; not in (m, ε) = {[tuple(s) for s in lost]}"
        f"{_counts(claims.get('against_baseline', []))}).",
        "* The gap widens with m: "
        + _yes(claims["gap_widens_with_m"])
        + " (mean gap over ε, accuracy points: "
        + ", ".join(f"m={m}: {100 * g:+.1f}" for m, g in claims["gap_by_clients"].items())
        + ").",
    ]
    if "gauss_at_least_dpsgd_eps1_m1" in claims:
        g, d = claims["gauss_vs_dpsgd_eps1_m1"]
        lines.append(
            f"* Gauss-PSGD ≥ DP-SGD at ε = 1, m = 1: {_yes(claims['gauss_at_least_dpsgd_eps1_m1'])} "
            f"({100 * g:.1f} vs {100 * d:.1f}){_noise(claims.get('gauss_vs_dpsgd_eps1_m1_interval'))}."
        )
    if "gauss_m10_at_least_80pct" in claims:
        lines.append(
            f"* Gauss-PSGD at m = 10 (local noise) ≥ 80 % of m = 1 at ε = 1: {_yes(claims['gauss_m10_at_least_80pct'])}"
            f" (ratio {claims['gauss_m10_over_m1_eps1']:.3f})."
        )
    return "\n".join(lines)


def format_diagnostics(rows: list[dict[str, Any]]) -> str:
    """Per (m, ε, method): the mean gradient norm and ``λ_min`` of the released models on training
    records, and how many Gauss-PSGD runs certified their point (NOT private research measurements)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["clients"], r["epsilon"], r["method"])].append(r)
    lines = ["| m | ε | method | ‖∇F‖ | λ_min(∇²F) | Lanczos converged | certified |", "|---|---|---|---|---|---|---|"]
    for (clients, eps, method), rs in sorted(groups.items()):
        certified = [r.get("certified") for r in rs if r.get("certified") is not None]
        cert = f"{sum(map(bool, certified))} of {len(certified)}" if certified else "—"
        grad = statistics.fmean(float(r["grad_norm"]) for r in rs)
        eig = statistics.fmean(float(r["hessian_min_eig"]) for r in rs)
        conv = f"{sum(bool(r.get('lanczos_converged')) for r in rs)} of {len(rs)}"  # else λ_min is an upper bound
        label = METHOD_LABELS.get(method, method)
        lines.append(f"| {clients} | {eps:g} | {label} | {grad:.3g} | {eig:.3g} | {conv} | {cert} |")
    return "\n".join(lines)


def _mean_curve(curves: list[list[list[float]]], grid: np.ndarray, col: int) -> np.ndarray:
    ys = []
    for c in curves:
        arr = np.asarray(c, dtype=float)
        if arr.size:
            ys.append(np.interp(grid, arr[:, 0], arr[:, col], left=np.nan, right=arr[-1, col]))
    # NaN (no line) before a seed's first evaluation: the mean is over the same seeds everywhere
    return np.vstack(ys).mean(axis=0) if ys else np.full_like(grid, np.nan)


def plot_curves(rows: list[dict[str, Any]], out_dir: Path, *, dataset: str) -> list[Path]:
    """One PNG per number of clients (the paper's Figures 1-2 layout): test accuracy (top) and
    test loss (bottom) against epochs, one panel per ε, one line per method (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for clients in sorted({r["clients"] for r in rows}):
        sub = [r for r in rows if r["clients"] == clients]
        eps = sorted({r["epsilon"] for r in sub})
        fig, axes = plt.subplots(2, len(eps), figsize=(4 * len(eps), 6), squeeze=False)
        top = max(max((p[0] for p in r["curve"]), default=1.0) for r in sub)
        grid = np.linspace(0.0, top, 60)
        for j, e in enumerate(eps):
            for method, label in METHOD_LABELS.items():
                curves = [r["curve"] for r in sub if r["epsilon"] == e and r["method"] == method]
                if curves:
                    axes[0, j].plot(grid, 100 * _mean_curve(curves, grid, 1), label=label)
                    axes[1, j].plot(grid, _mean_curve(curves, grid, 2), label=label)
            axes[0, j].set_title(f"ε = {e:g}, m = {clients}")
            axes[1, j].set_xlabel("epochs")
        axes[0, 0].set_ylabel("test accuracy (%)")
        axes[1, 0].set_ylabel("test loss")
        axes[0, 0].legend(fontsize=8)
        fig.tight_layout()
        path = Path(out_dir) / f"fig_{dataset}_m{clients}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
