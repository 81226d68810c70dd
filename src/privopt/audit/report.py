"""What ``privopt audit`` prints and writes: a summary, ``audit.json`` and ``audit.png``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from privopt.audit.audit import AuditReport, AuditResult

__all__ = ["format_report", "write_report", "check_report_dir", "plot_report", "JSON_NAME", "PLOT_NAME"]

JSON_NAME = "audit.json"
PLOT_NAME = "audit.png"


def _evidence(r: AuditResult) -> str:
    b = r.bound
    if r.method == "one-run":
        return f"{b['canaries']} canaries, {b['included']} in; {b['correct']}/{b['guesses']} guesses right"
    return (
        f"{b['runs']} runs; held-out errors {b['false_positives']}/{b['negatives']} false positives, "
        f"{b['false_negatives']}/{b['positives']} false negatives"
    )


def format_report(report: AuditReport) -> str:
    """A few lines for the terminal: one per audit, then the verdict."""
    d = report.to_dict()
    lines = [
        f"privopt audit: {d['algorithm']} on {d['dataset']} ({d['model']}), target epsilon = {d['epsilon_target']:g}, "
        f"delta = {d['delta']:.3g}, {100 * report.confidence:g}% confidence"
    ]
    for r in report.results:
        verdict = "EXCEEDS" if r.exceeds else "ok"
        lines.append(
            f"  {r.mode:9s} {r.method:8s}: epsilon >= {r.epsilon_lower_bound:.3f}   accounted epsilon = "
            f"{r.epsilon_accounted:.3f}   {verdict}   [{_evidence(r)}; {r.wall_time_s:.0f} s]"
        )
    if report.passed:
        lines.append("passed: no empirical lower bound exceeds the accounted epsilon")
    else:
        bad = ", ".join(f"{r.mode} {r.method}" for r in report.results if r.exceeds)
        lines.append(f"FAILED ({bad}): the run is not (epsilon, delta)-DP as accounted (see docs/audit.md)")
    return "\n".join(lines)


def check_report_dir(out_dir: str | Path) -> None:
    """Before an audit trains anything: ``out_dir`` must be a directory (or not exist yet) that
    holds no earlier audit, whose results would be overwritten.

    Raises:
        ConfigError: ``out_dir`` is a file, or already holds ``audit.json`` / ``audit.png``.
    """
    from privopt.errors import ConfigError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output path {out} is a file, not a directory; choose a new directory")
    earlier = [name for name in (JSON_NAME, PLOT_NAME) if (out / name).exists()]
    if earlier:
        raise ConfigError(
            f"{out} already holds an audit ({', '.join(earlier)}); choose a new --out directory (or move them away)"
        )


def write_report(report: AuditReport, out_dir: str | Path) -> list[Path]:
    """Write ``audit.json`` and ``audit.png`` into ``out_dir`` (created if needed); returns the paths."""
    from privopt.checkpoint import atomic_write_bytes

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(report.to_dict(), indent=2, default=str).encode()
    atomic_write_bytes(out / JSON_NAME, payload)
    plot_report(report, out / PLOT_NAME)
    return [out / JSON_NAME, out / PLOT_NAME]


def plot_report(report: AuditReport, path: Path) -> None:
    """Per audit: the score distributions of included and excluded canaries (runs), and the lower
    bound against the accounted ε."""
    from privopt.plots import plt, save_figure

    rows = report.results
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.2 * len(rows)), squeeze=False)
    for (hist, bars), r in zip(axes, rows):
        bins = np.histogram_bin_edges(r.scores, bins=40) if r.scores.size else 10
        hist.hist(r.scores[~r.included], bins=bins, alpha=0.6, label="excluded", density=True)
        hist.hist(r.scores[r.included], bins=bins, alpha=0.6, label="included", density=True)
        unit = "canary" if r.method == "one-run" else "run"
        hist.set_title(f"{r.mode} {r.method}: membership score per {unit}")
        hist.set_xlabel("log-likelihood ratio" if r.mode == "white-box" else "loss(true label) - loss(canary label)")
        hist.set_ylabel(f"density (share of {unit}s per unit score)")
        hist.legend()
        bars.bar(["lower bound", "accounted"], [r.epsilon_lower_bound, r.epsilon_accounted], color=["C3", "C0"])
        bars.set_ylabel("epsilon")
        bars.set_title(f"{100 * report.confidence:g}% lower bound vs accounted epsilon")
        bars.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save_figure(fig, path)
