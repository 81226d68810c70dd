"""Paper A's reproduction reports: tables, figures, the two reproductions and their command line.

``privopt reproduce dro-table3`` — test accuracy / AUC / F1 / worst-class accuracy, the
full-training-set gradient norm ``‖∇ₓΨ_KL‖`` over training and a membership-inference AUC for
DP-SGDA, PrivateDiff, DP Double-SPIDER and DP Recursive-SPIDER (plus the non-private SCDRO
reference) at ε ∈ {0.5, 1, 5, 10}; writes ``results.jsonl``, ``table3.md`` (mean ± std, laid out
like the paper's Table 3, next to the paper's numbers), ``tuning.json`` and the PNG curves of
Figures 1–3. ``privopt reproduce dro-mia`` does Table 2 (MIA AUC of the two SPIDER methods at
ε ∈ {0.1, 1, 3, 5, 8, 10}, 5 seeds) against the DP cap ``e^ε/(1+e^ε)+δ``. A DP run whose MIA AUC
exceeds the cap plus 3 standard errors is flagged and makes the command fail (a privacy bug, not
a result). Protocol: :mod:`privopt.experiments.dro_protocol`; runs:
:mod:`privopt.experiments.dro_runner`; see ``docs/algorithms/dro.md``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from privopt.checkpoint import atomic_write_json, atomic_write_text
from privopt.experiments.dro_compare import compare_to_baseline, comparison_markdown
from privopt.experiments.dro_protocol import (
    LAM0,
    METHOD_LABELS,
    MIA_EPSILONS,
    MIA_METHODS,
    NONPRIVATE_METHOD,
    PAPER_NONPRIVATE,
    PAPER_TABLE2,
    PAPER_TABLE3,
    RHO,
    TABLE3_EPSILONS,
    TABLE3_METHODS,
    TABLE3_ORDER,
    Budget,
    paper_delta,
)
from privopt.experiments.dro_report_settings import models_table, tuned_table
from privopt.experiments.dro_runner import GridRequest, ModelSpec, run_grid, single_threaded
from privopt.experiments.privacy_notes import notes_markdown

__all__ = ["format_table", "models_table", "run_dro_mia", "run_dro_table3"]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    vals = [v for v in values if _finite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _cell(values: Sequence[float], scale: float = 1.0, digits: int = 2, failed: int = 0) -> str:
    m, s = _mean_std(values)
    note = f" ({failed}/{len(values)} failed)" if failed else ""
    if math.isnan(m):
        return "failed" + note if failed else "–"
    if sum(1 for v in values if _finite(v)) < 2:  # one run has no spread: no "± 0.00"
        return f"{m * scale:.{digits}f}{note}"
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}{note}"


def _cell_of(rows: Sequence[dict], metric: str, scale: float, digits: int) -> str:
    """Mean ± std of ``metric`` over ``rows``; runs that diverged (``error``) are counted, not averaged."""
    return _cell([r.get(metric) for r in rows], scale, digits, failed=sum(1 for r in rows if r.get("error")))


def format_table(
    rows: Sequence[dict],
    *,
    metric: str = "test_accuracy",
    scale: float = 100.0,
    digits: int = 2,
    methods: Sequence[str] | None = None,
    epsilons: Sequence[float] | None = None,
) -> str:
    """Markdown table laid out like Table 3: one row per setting (non-private, then each ε), one
    column per method, cells ``mean ± std`` over seeds of ``metric`` (× ``scale``; a single run
    shows its value alone); runs that diverged are excluded from the mean and counted as
    ``(k/N failed)``.

    Example:
        >>> rows = [{"method": "dp-sgda", "epsilon": 1.0, "private": True, "test_accuracy": a} for a in (0.9, 0.92)]
        >>> print(format_table(rows).splitlines()[2])
        | ε = 1 | 91.00 ± 1.41 |
    """
    methods = list(methods or dict.fromkeys(r["method"] for r in rows if r["private"]))
    nonpriv = [r for r in rows if not r["private"]]
    # Without private methods (e.g. ``--methods scdro``) the non-private methods are the columns.
    columns = methods or list(dict.fromkeys(r["method"] for r in nonpriv))
    eps_list = list(epsilons or sorted({r["epsilon"] for r in rows if r["private"]})) if methods else []
    head = "| setting | " + " | ".join(METHOD_LABELS.get(m, m) for m in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    if nonpriv:
        # As in the paper, the non-private reference (SCDRO = Recursive-SPIDER without noise) sits in
        # the Recursive-SPIDER column (or the last column when that method is not shown).
        names = ", ".join(sorted({r["method"].upper() for r in nonpriv}))
        cell = _cell_of(nonpriv, metric, scale, digits)
        col = columns.index("dp-recursive-spider") if "dp-recursive-spider" in columns else len(columns) - 1
        lines.append(
            f"| non-private ({names}) | " + " | ".join(cell if i == col else "–" for i in range(len(columns))) + " |"
        )
    for eps in eps_list:
        cells = [
            _cell_of([r for r in rows if r["method"] == m and r["epsilon"] == eps], metric, scale, digits)
            for m in methods
        ]
        lines.append(f"| ε = {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paper_table3(dataset: str, methods: Sequence[str], epsilons: Sequence[float]) -> str | None:
    paper = PAPER_TABLE3.get(dataset)
    if paper is None:
        return None
    cols = [m for m in methods if m in TABLE3_ORDER]
    if not cols:
        return None
    lines = ["| setting | " + " | ".join(METHOD_LABELS[m] for m in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    if dataset in PAPER_NONPRIVATE:
        lines.append("| non-private (SCDRO) | " + " | ".join(f"{PAPER_NONPRIVATE[dataset]:.2f}" for _ in cols) + " |")
    for eps in epsilons:
        if eps in paper:
            lines.append(f"| ε = {eps:g} | " + " | ".join(f"{paper[eps][m]:.2f}" for m in cols) + " |")
    return "\n".join(lines)


def _ranking(rows: Sequence[dict], methods: Sequence[str], eps: float) -> list[str]:
    means = {
        m: _mean_std([r["test_accuracy"] for r in rows if r["method"] == m and r["epsilon"] == eps])[0] for m in methods
    }
    return sorted((m for m in methods if not math.isnan(means[m])), key=lambda m: -means[m])


def _ordering_notes(dataset: str, rows: Sequence[dict], methods: Sequence[str], epsilons: Sequence[float]) -> str:
    """Plain statement, per ε, of whether the measured best method / ordering matches the paper's."""
    paper = PAPER_TABLE3.get(dataset)
    if paper is None:
        return ""
    cols = [m for m in methods if m in TABLE3_ORDER]
    out = []
    for eps in epsilons:
        if eps not in paper:
            continue
        ours = _ranking(rows, cols, eps)
        theirs = sorted(cols, key=lambda m: -paper[eps][m])
        if not ours:
            continue
        same_best = ours[0] == theirs[0]
        proposed = {"dp-double-spider", "dp-recursive-spider"}
        ours_prop = ours[0] in proposed
        theirs_prop = theirs[0] in proposed
        out.append(
            f"- ε = {eps:g}: measured order {' > '.join(METHOD_LABELS[m] for m in ours)}; paper "
            f"{' > '.join(METHOD_LABELS[m] for m in theirs)}. Best method "
            f"{'agrees' if same_best else 'differs'}; a proposed SPIDER method is best: "
            f"measured {'yes' if ours_prop else 'no'}, paper {'yes' if theirs_prop else 'no'}."
        )
    return "\n".join(out)


def _curves(
    rows: Sequence[dict], key: str, methods: Sequence[str], eps: float | None, include_nonprivate: bool
) -> dict[str, tuple[list[float], list[float]]]:
    """Mean (over seeds) curve of ``key`` per method, x = fraction of the run completed."""
    series = {}
    for m in methods:
        rs = [
            r
            for r in rows
            if r["method"] == m and r["history"] and (r["epsilon"] == eps or (not r["private"] and include_nonprivate))
        ]
        if not rs:
            continue
        length = min(len(r["history"]) for r in rs)
        if length == 0:
            continue
        steps = [h["step"] for h in rs[0]["history"][:length]]
        total = max(rs[0]["steps"], 1)
        ys = []
        for i in range(length):
            vals = [r["history"][i].get(key) for r in rs]
            ys.append(_mean_std(vals)[0])
        series[METHOD_LABELS.get(m, m)] = ([s / total for s in steps], ys)
    return series


def _write_figures(
    out: Path, rows: Sequence[dict], methods: Sequence[str], epsilons: Sequence[float], dataset: str
) -> list[str]:
    from privopt.plots import plot_series

    written = []
    all_methods = list(dict.fromkeys(list(methods) + [r["method"] for r in rows if not r["private"]]))
    for fig, key, ylabel, logy in (
        ("fig1_gradnorm", "grad_norm", "‖∇ₓΨ_KL‖ (full training set, NOT private)", True),
        ("fig2_auc", "test_roc_auc", "test ROC AUC", False),
        ("fig3_f1", "test_f1", "test F1", False),
    ):
        for eps in epsilons:
            series = _curves(rows, key, all_methods, eps, include_nonprivate=True)
            if not series:
                continue
            if logy and any(v is not None and _finite(v) and v <= 0 for _, ys in series.values() for v in ys):
                logy = False
            path = out / f"{fig}_eps{eps:g}.png"
            plot_series(
                path, series, xlabel="fraction of training", ylabel=ylabel, logy=logy, title=f"{dataset}, ε = {eps:g}"
            )
            written.append(path.name)
    return written


def _mia_check(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r["private"] and r.get("mia_within_bound") is False]


def _summary_table(rows: Sequence[dict], methods: Sequence[str], epsilons: Sequence[float]) -> str:
    parts = []
    for title, metric, scale, digits in (
        ("Test ROC AUC", "test_auc", 1.0, 4),
        ("Test F1", "test_f1", 1.0, 4),
        ("Worst-class test accuracy (%)", "test_worst_class_accuracy", 100.0, 2),
        ("Final ‖∇ₓΨ_KL‖ on the training set", "grad_norm", 1.0, 4),
        ("MIA AUC (loss attack, class-matched)", "mia_auc", 1.0, 4),
        ("ε spent (ledger)", "epsilon_spent", 1.0, 3),
    ):
        parts.append(
            f"### {title}\n\n"
            + format_table(rows, metric=metric, scale=scale, digits=digits, methods=methods, epsilons=epsilons)
        )
    return "\n\n".join(parts)


def _table3_markdown(rows, meta, table: str, private_methods, violations, against: str) -> str:
    label, eps_list, budget = meta["dataset"], meta["epsilons"], meta["budget"]
    md = [
        f"# Paper A Table 3 reproduction — {label} (budget {budget['name']})",
        "",
        f"Test accuracy (%), mean ± std over {meta['seeds']} seed(s); δ = n^-1.1; KL-DRO ρ = {RHO}, λ0 = {LAM0}; "
        f"{budget['epochs']} epoch-equivalents per run for every method. Noise and sampling: {meta['randomness']}.",
        "",
        notes_markdown(meta),
        "",
        "## Measured",
        "",
        table,
        "",
        "Worst-class test accuracy (%):",
        "",
        format_table(rows, metric="test_worst_class_accuracy", methods=private_methods, epsilons=eps_list),
        "",
        "Balanced test accuracy (%):",
        "",
        format_table(rows, metric="test_balanced_accuracy", methods=private_methods, epsilons=eps_list),
    ]
    if against:
        md += ["", "## Against DP-SGD", "", against]
    paper = _paper_table3(label, private_methods, eps_list)
    if paper:
        ordering = _ordering_notes(label, rows, private_methods, eps_list)
        md += ["", "## Paper (Table 3)", "", paper, "", "## Ordering", "", ordering]
    md += ["", "## Other metrics", "", _summary_table(rows, private_methods, eps_list), "", "## Models", ""]
    md += [models_table(rows, budget), "", "## Tuning", ""]
    caps = budget.get("weight_cap_grid") or ()
    md.append(
        f"grid lr × clip = {list(budget['lrs'])} × {list(budget['clips'])}"
        + (f" (× DRO weight cap {list(caps)} for the DP DRO methods)" if caps else "")
        + f" (shared; a method's own lr grid is in the Models table; see tuning.json); tuning wall time "
        f"{meta['tuning_wall_s']:.0f} s; total wall time {meta['total_wall_s']:.0f} s."
    )
    md += ["", "Hyper-parameters of the final runs:", "", tuned_table(rows, eps_list)]
    if violations:
        cases = "; ".join(
            f"{r['method']} ε={r['epsilon']} seed {r['seed']} AUC {r['mia_auc']:.3f} > "
            f"{r['mia_bound']:.3f}+{r['mia_slack']:.3f}"
            for r in violations
        )
        md += [
            "",
            "## PRIVACY CHECK FAILED",
            "",
            f"{len(violations)} DP run(s) have a membership-attack AUC above the DP cap + 3 SE: {cases}",
        ]
    return "\n".join(md) + "\n"


_FORWARDED = (
    "dataset",
    "data_dir",
    "epsilons",
    "seeds",
    "budget",
    "methods",
    "model",
    "out_dir",
    "progress",
    "hyperparameters",
    "selection_note",
    "log",
    "insecure_seed",
    "device",
    "jobs",
    "plugins",
)


def _options(args: dict[str, Any]) -> dict[str, Any]:
    """The reproduction's arguments that :class:`GridRequest` takes under the same names."""
    return {k: args[k] for k in _FORWARDED}


def _result(rows, table: str, text: str, summary: dict, out: Path, violations, **tables: str) -> dict[str, Any]:
    return {
        "rows": rows,
        "table": table,
        **tables,
        "markdown": text,
        "summary": summary,
        "out_dir": str(out),
        "mia_violations": violations,
    }


def run_dro_table3(
    *,
    dataset: Any,
    data_dir=None,
    epsilons: Sequence[float] = TABLE3_EPSILONS,
    seeds: int = 3,
    budget: str | Budget = "quick",
    methods: Sequence[str] = TABLE3_METHODS,
    model: ModelSpec | None = None,
    out_dir,
    progress: bool = False,
    nonprivate: bool = True,
    tune: bool = True,
    hyperparameters: dict[str, dict] | None = None,
    selection_note: str | None = None,
    log: Callable[[str], None] | None = None,
    insecure_seed: int | None = None,
    device: str = "cpu",
    jobs: int = 1,
    plugins: Sequence[str] = (),
) -> dict[str, Any]:
    """Reproduce Paper A's Table 3 / Figures 1–3 on one dataset and write every output.

    Writes ``results.jsonl``, ``table3.md``, ``summary.json``, ``tuning.json``,
    ``fig1_gradnorm_eps*.png``, ``fig2_auc_eps*.png``, ``fig3_f1_eps*.png`` and ``runs/`` into
    ``out_dir``. The arguments are those of :class:`privopt.experiments.dro_runner.GridRequest`
    (``tune``: grid-search lr × clip per method on a validation split; ``nonprivate``: add the
    SCDRO reference; ``insecure_seed``: reproducible, NOT private noise, recorded as such;
    ``jobs``: runs at a time in worker processes, one torch thread each; same results for any value;
    ``plugins``: your modules or ``.py`` files, imported first here and in every worker, so ``methods``
    and ``model`` can name what they register; every run's record and ``summary.json`` state them).

    Returns:
        ``{"rows": [...], "table": markdown, "summary": {...}, "out_dir": path, "mia_violations": [...]}``.

    Example:
        >>> import tempfile
        >>> from privopt.experiments.dro import Budget, BUDGETS, run_dro_table3
        >>> tiny = Budget(**{**BUDGETS["quick"].__dict__, "epochs": 0.5, "eval_points": 2})
        >>> res = run_dro_table3(dataset="digits-st", epsilons=[1.0], seeds=1, budget=tiny,
        ...     methods=["dp-sgd"], tune=False, out_dir=tempfile.mkdtemp(), log=lambda s: None,
        ...     hyperparameters={"dp-sgd": {"lr": 0.5, "clip": 1.0}, "scdro": {"lr": 0.2, "clip": 1.0}})
        >>> sorted(r["method"] for r in res["rows"])
        ['dp-sgd', 'scdro']
    """
    opts = _options(locals())
    req = GridRequest(kind="table3", metrics=["grad_norm", "mia"], tune_grid=tune, nonprivate=nonprivate, **opts)
    rows, meta, out = single_threaded(run_grid)(req)
    return _table3_outputs(rows, meta, out)


def _table3_outputs(rows, meta, out: Path) -> dict[str, Any]:
    private_methods = [m for m in meta["methods"] if m != NONPRIVATE_METHOD]
    table = format_table(rows, metric="test_accuracy", methods=private_methods, epsilons=meta["epsilons"])
    figs = _write_figures(out, rows, private_methods, meta["epsilons"], meta["dataset"])
    violations = _mia_check(rows)
    comparison = compare_to_baseline(rows, epsilons=meta["epsilons"])
    against = comparison_markdown(comparison)
    text = _table3_markdown(rows, meta, table, private_methods, violations, against)
    atomic_write_text(out / "table3.md", text)
    summary = {**meta, "figures": figs, "mia_violations": len(violations), "table_markdown": table}
    summary["baseline_comparison"] = [asdict(c) for c in comparison]
    atomic_write_json(out / "summary.json", summary)
    balanced = format_table(rows, metric="test_balanced_accuracy", methods=private_methods, epsilons=meta["epsilons"])
    return _result(rows, table, text, summary, out, violations, balanced_table=balanced, comparison_table=against)


def _table2(rows, meta) -> str:
    from privopt.eval.mia import dp_auc_bound

    eps_list = meta["epsilons"]
    lines = ["| algorithm | " + " | ".join(f"ε = {e:g}" for e in eps_list) + " |", "|---" * (len(eps_list) + 1) + "|"]
    for m in meta["methods"]:
        cells = [
            _cell([r["mia_auc"] for r in rows if r["method"] == m and r["epsilon"] == e], 1.0, 4) for e in eps_list
        ]
        lines.append(f"| {METHOD_LABELS.get(m, m)} (measured) | " + " | ".join(cells) + " |")
        if m in PAPER_TABLE2:
            paper = PAPER_TABLE2[m]
            pc = [(f"{paper[e][0]:.4f} ± {paper[e][1]:.4f}" if e in paper else "–") for e in eps_list]
            lines.append(f"| {METHOD_LABELS.get(m, m)} (paper) | " + " | ".join(pc) + " |")
    n = rows[0]["n_train"] if rows else 1
    caps = " | ".join(f"{dp_auc_bound(e, paper_delta(n)):.4f}" for e in eps_list)
    lines.append(f"| DP cap e^ε/(1+e^ε)+δ | {caps} |")
    return "\n".join(lines)


def run_dro_mia(
    *,
    dataset: Any = "cifar10-st",
    data_dir=None,
    epsilons: Sequence[float] = MIA_EPSILONS,
    seeds: int = 5,
    budget: str | Budget = "quick",
    methods: Sequence[str] = MIA_METHODS,
    model: ModelSpec | None = None,
    out_dir,
    progress: bool = False,
    tune: bool = True,
    hyperparameters: dict[str, dict] | None = None,
    selection_note: str | None = None,
    log: Callable[[str], None] | None = None,
    insecure_seed: int | None = None,
    device: str = "cpu",
    jobs: int = 1,
    plugins: Sequence[str] = (),
) -> dict[str, Any]:
    """Reproduce Paper A's Table 2: membership-attack AUC per method and ε, next to the DP cap
    and the paper's numbers (which exceed the cap: a model that is ε-DP cannot reach them).
    Outputs ``results.jsonl``, ``table2.md``, ``summary.json``, ``tuning.json``. Arguments as
    :func:`run_dro_table3`."""
    req = GridRequest(kind="mia", metrics=["mia"], tune_grid=tune, nonprivate=False, **_options(locals()))
    rows, meta, out = single_threaded(run_grid)(req)
    table = _table2(rows, meta)
    violations = _mia_check(rows)
    text = (
        f"# Paper A Table 2 reproduction — {meta['dataset']} (budget {meta['budget']['name']})\n\n"
        f"Loss-attack ROC AUC (members = training points, non-members = test points, class-matched), "
        f"mean ± std over {meta['seeds']} seed(s). The paper's values exceed the DP cap. "
        f"Noise and sampling: {meta['randomness']}.\n\n{notes_markdown(meta)}\n\n{table}\n\n"
        f"DP runs above cap + 3 SE: {len(violations)}.\n"
    )
    atomic_write_text(out / "table2.md", text)
    summary = {**meta, "mia_violations": len(violations), "table_markdown": table}
    atomic_write_json(out / "summary.json", summary)
    return _result(rows, table, text, summary, out, violations)
