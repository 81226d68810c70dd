"""Figures of Paper B's Covertype comparison (:mod:`privopt.experiments.erm_covertype`): one figure per
setting, one column per epsilon; rows: the final runs' mean gap curves versus passes and versus
wall time (printed schedules dashed), and the tuning profile (best tuning-set gap for each run
length, against that run's passes; the chosen schedule circled)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_results"]


def _curves(ax, entries: list[dict], printed: list[dict], key: str) -> None:
    for style, group in (("-", entries), ("--", printed)):
        for e in group:
            xs, ys = np.asarray(e["curve"][key]), np.maximum(np.asarray(e["curve"]["gap"]), 1e-12)
            ax.plot(
                xs[1:], ys[1:], style, marker=".", ms=3, label=e["method"] + (" (printed)" if style == "--" else "")
            )
    ax.set_yscale("log")
    ax.set_xscale("log" if key == "wall_s" else "linear")
    ax.set_xlabel("wall time (s)" if key == "wall_s" else "passes over the data")


def _profiles(ax, entries: list[dict]) -> None:
    for e in entries:
        lengths, gaps, passes = zip(*e["profile"])
        (line,) = ax.plot(passes, np.maximum(gaps, 1e-12), marker="o", ms=3, label=e["method"])
        chosen = lengths.index(next(iter(e["schedule"].values())))
        ax.plot([passes[chosen]], [max(gaps[chosen], 1e-12)], "o", mfc="none", ms=10, color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("passes of the run length (tuning set)")


def _setting_figure(entries: list[dict], printed: list[dict], title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from privopt.plots import save_figure

    eps_list = sorted({e["epsilon"] for e in entries})
    fig, axes = plt.subplots(3, len(eps_list), figsize=(4.2 * len(eps_list), 9.6), squeeze=False)
    for col, eps in enumerate(eps_list):
        here = [e for e in entries if e["epsilon"] == eps]
        ref = [e for e in printed if e["epsilon"] == eps]
        _curves(axes[0][col], here, ref, "passes")
        _curves(axes[1][col], here, ref, "wall_s")
        _profiles(axes[2][col], here)
        axes[0][col].set_title(f"ε = {eps:g}")
        for row in range(3):
            axes[row][col].grid(alpha=0.3)
            axes[row][col].legend(fontsize=7)
    axes[0][0].set_ylabel("gap F(w) − F* (training, NOT private)")
    axes[1][0].set_ylabel("gap F(w) − F* (training, NOT private)")
    axes[2][0].set_ylabel("best tuning-set gap")
    fig.suptitle(title)
    save_figure(fig, path)
    return path


def plot_results(summary: dict[str, Any], out: Path, figures: dict[str, int]) -> list[Path]:
    """``fig{N}_{setting}.png`` for each setting (``figures`` maps setting name to figure number)."""
    import matplotlib

    matplotlib.use("Agg")
    paths = []
    for setting, fig_no in figures.items():
        entries = [e for e in summary["methods"] if e["setting"] == setting]
        printed = [e for e in summary["printed"] if e["setting"] == setting]
        if entries:
            title = f"Fig. {fig_no}: {setting} logistic regression on Covertype (tuned schedules)"
            paths.append(_setting_figure(entries, printed, title, out / f"fig{fig_no}_{setting}.png"))
    return paths
