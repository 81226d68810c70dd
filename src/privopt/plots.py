"""PNG plots of training curves and experiment results (matplotlib, headless)."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from privopt.checkpoint import atomic_write_bytes

__all__ = ["plot_training_curves", "plot_series", "save_figure"]


def save_figure(fig, path: Path) -> None:
    """Save atomically (a crash never leaves a half-written PNG) and close the figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())


def plot_training_curves(path: Path, history: Sequence[Mapping[str, float]], *, title: str = "") -> None:
    """Test loss / accuracy / AUC and the spent epsilon against the step (panels for the keys present;
    ``epsilon_spent`` is ``None`` in non-private runs and gets no panel). With groups, the accuracy
    panel also shows the worst group's accuracy."""
    steps = [r["step"] for r in history]
    keys = ("test_loss", "test_accuracy", "test_roc_auc", "epsilon_spent")
    panels = [k for k in keys if any(r.get(k) is not None for r in history)] or ["step"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, key in zip(axes[0], panels):
        overlay = (
            {key: "all records", "test_worst_group_accuracy": "worst group"} if key == "test_accuracy" else {key: ""}
        )
        for k, label in overlay.items():
            ys = [float("nan") if r.get(k) is None else r[k] for r in history]
            if any(y == y for y in ys):  # NaN != NaN: a series with no value gets no line
                ax.plot(steps, ys, marker=".", label=label or None)
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize="small")
        ax.set_xlabel("step")
        # During a run the ledger reports an upper bound (RDP of the steps so far, capped by the plan's
        # exact epsilon: docs/accounting.md, "Caching"); only the last point is exact.
        ax.set_title("epsilon spent (bound; last point exact)" if key == "epsilon_spent" else key.replace("_", " "))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, y=1.04)  # above the panels' titles, not over them
    save_figure(fig, path)


def plot_series(
    path: Path,
    series: Mapping[str, tuple[Iterable[float], Iterable[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logy: bool = False,
    logx: bool = False,
    marker: str | None = None,
    plain_ticks: bool = False,
) -> None:
    """One line per label: ``series[label] = (xs, ys)``. ``marker`` marks each point (a line of one point
    shows); a log x axis, and with ``plain_ticks`` a log y axis, is labelled with plain numbers."""
    series = {label: (list(xs), list(ys)) for label, (xs, ys) in series.items()}
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), label=label, marker=marker)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis, [x for xs, _ in series.values() for x in xs])
    if logy and plain_ticks:
        _plain_log_ticks(ax.yaxis, [])
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _plain_log_ticks(axis, values: list[float]) -> None:
    """A log axis labelled with plain numbers (``0.5``, ``10``, not ``5×10⁻¹``), at the data's values
    when there are few of them; unlabelled minor ticks (their labels overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ticks = sorted({v for v in values if v > 0})
    if 0 < len(ticks) <= 12:
        axis.set_ticks(ticks)
    else:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
