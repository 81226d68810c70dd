"""The settings part of Paper A's reproduction reports: models, weight caps, tuned hyper-parameters.

See ``docs/algorithms/dro.md`` ("Reproducing Paper A").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from privopt.experiments.dro_protocol import METHOD_LABELS

__all__ = ["models_table", "tuned_table", "weight_cap_text"]


def _model_text(row: dict) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in (row.get("model_params") or {}).items())
    return f"{row['model']} ({opts})" if opts else str(row["model"])


def models_table(rows: Sequence[dict], budget: dict[str, Any]) -> str:
    """Markdown table of the model and lr grid each method ran with, and why a method deviates.

    ``budget`` is the reproduction's budget as a dict (``dataclasses.asdict``); a method with its own
    setting (``method_settings``) shows that setting's reason, the others ``shared``.

    Example:
        >>> rows = [{"method": "scdro", "model": "mlp", "model_params": {"hidden": 64}}]
        >>> budget = {"lrs": (10.0,), "batch_size": 1024,
        ...           "method_settings": {"scdro": {"lrs": (0.1,), "batch_size": 256, "reason": "non-private"}}}
        >>> print(models_table(rows, budget).splitlines()[2])
        | SCDRO (non-private) | mlp (hidden=64) | 256 | 0.1 | non-private |
    """
    lines = ["| method | model | batch | lr grid | setting |", "|---|---|---|---|---|"]
    settings = budget.get("method_settings") or {}
    for m in dict.fromkeys(r["method"] for r in rows):
        models = ", ".join(sorted({_model_text(r) for r in rows if r["method"] == m and r.get("model")})) or "–"
        own = settings.get(m) or {}
        grid = ", ".join(f"{lr:g}" for lr in (own.get("lrs") or budget["lrs"]))
        batch, why = own.get("batch_size") or budget["batch_size"], own.get("reason") or "shared"
        lines.append(f"| {METHOD_LABELS.get(m, m)} | {models} | {batch} | {grid} | {why} |")
    if "weight_cap" in budget:
        lines += ["", f"DRO weight cap A (a record's weighted term is at most A·clip): {weight_cap_text(budget)}."]
    return "\n".join(lines)


def weight_cap_text(budget: dict[str, Any]) -> str:
    """The budget's DRO weight cap rule in words (``budget`` as a dict).

    Example:
        >>> weight_cap_text({"weight_cap": 2.0, "weight_caps": [(1.0, 1.25)]})
        '1.25 at ε ≤ 1, 2 above'
        >>> weight_cap_text({"weight_cap": 2.0, "weight_caps": [], "weight_cap_grid": [1.25, 2.0]})
        'tuned from {1.25, 2} with the lr (runs with given settings: 2)'
        >>> weight_cap_text({"weight_cap": 2.0, "weight_caps": [(1.0, 1.25)], "weight_cap_grid": [1.25, 2.0]})
        '1.25 at ε ≤ 1; above, tuned from {1.25, 2} with the lr (2 for runs with given settings)'
    """
    caps = [tuple(pair) for pair in budget.get("weight_caps") or ()]
    ruled = ", ".join(f"{a:g} at ε ≤ {bound:g}" for bound, a in caps)
    grid = budget.get("weight_cap_grid") or ()
    if not grid:
        return f"{ruled}, {budget['weight_cap']:g} above" if caps else f"{budget['weight_cap']:g}"
    tuned = f"tuned from {{{', '.join(f'{a:g}' for a in grid)}}} with the lr"
    if caps:
        return f"{ruled}; above, {tuned} ({budget['weight_cap']:g} for runs with given settings)"
    return f"{tuned} (runs with given settings: {budget['weight_cap']:g})"


def tuned_table(rows: Sequence[dict], epsilons: Sequence[float]) -> str:
    """Markdown table of the hyper-parameters each method ran with at each ε (tuned or given).

    A cell lists every distinct setting among that cell's runs (one, unless the seeds differ).

    Example:
        >>> rows = [{"method": "dp-double-spider", "private": True, "epsilon": 1.0, "lr": 40.0, "clip": 0.1,
        ...          "weight_cap": 1.25},
        ...         {"method": "scdro", "private": False, "epsilon": None, "lr": 0.008, "clip": 0.1, "weight_cap": 1e6}]
        >>> print(tuned_table(rows, [1.0]).splitlines()[2])
        | DP Double-SPIDER | lr 40, clip 0.1, A 1.25 |
    """
    if not any(r.get("private") for r in rows):  # no private column: one cell per method
        epsilons = [None]
    heads = [("hyper-parameters" if e is None else f"ε = {e:g}") for e in epsilons]
    lines = ["| method | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        if not any(r.get("private") for r in mine):  # non-private: one setting for the whole row
            cells = [_settings_text(mine)] + ["″"] * (len(epsilons) - 1)
        else:
            cells = [_settings_text([r for r in mine if r.get("epsilon") == e]) for e in epsilons]
        lines.append(f"| {METHOD_LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _settings_text(rows: Sequence[dict]) -> str:
    texts = []
    for r in rows:
        cap = r.get("weight_cap") if r.get("private") else None  # a non-private method's cap never binds
        text = f"lr {r['lr']:g}, clip {r['clip']:g}" + ("" if cap is None else f", A {cap:g}")
        if text not in texts:
            texts.append(text)
    return "; ".join(texts) or "–"
