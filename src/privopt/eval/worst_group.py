"""Worst-group metrics (Paper D's target): per-group accuracy and risk, their worst and average.

``average_*`` is over the evaluation records (the usual "average accuracy" of group-robustness
work); ``mean_group_*`` is the unweighted mean over groups. Groups absent from the evaluation split
are left out of the worst and mean (and reported with ``n = 0``).

Example:
    >>> import torch
    >>> logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 0.0]])
    >>> m = worst_group_metrics(logits, torch.tensor([0, 1, 1, 0]), torch.tensor([0, 0, 1, 1]), num_groups=2)
    >>> m["worst_group_accuracy"], m["average_accuracy"], m["worst_group"]
    (0.5, 0.75, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from privopt.errors import DataError
from privopt.eval.metrics import group_accuracies

__all__ = ["evaluate_groups", "group_accuracy_table", "worst_group_metrics"]


def worst_group_metrics(
    logits: torch.Tensor,
    y: torch.Tensor,
    groups: torch.Tensor,
    *,
    num_groups: int,
    group_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Accuracy and cross-entropy risk per group, their worst and average.

    Returns:
        ``worst_group_accuracy``, ``worst_group_loss`` (the largest group risk), ``worst_group``
        (the id with the lowest accuracy), ``average_accuracy``, ``average_loss``,
        ``mean_group_accuracy``, ``mean_group_loss`` and ``per_group``:
        ``{name: {"accuracy", "loss", "n"}}``.
    """
    z = logits.detach().to(torch.float64)
    if z.dim() == 1 or z.shape[1] == 1:  # one logit of class 1
        z = torch.stack([torch.zeros_like(z.reshape(-1)), z.reshape(-1)], dim=1)
    y, g = y.long().reshape(-1), groups.long().reshape(-1)
    if not (z.shape[0] == y.shape[0] == g.shape[0]) or z.shape[0] == 0:
        raise DataError(
            f"logits, labels and groups must be non-empty and of equal length: {z.shape[0]}, {len(y)}, {len(g)}"
        )
    losses = nn.functional.cross_entropy(z, y, reduction="none")
    acc = group_accuracies(z, y, g)
    names = list(group_names) if group_names else [f"group {i}" for i in range(num_groups)]
    per_group, risks = {}, {}
    for i in range(num_groups):
        mask = g == i
        n = int(mask.sum())
        risks[i] = float(losses[mask].mean()) if n else math.nan
        per_group[names[i]] = {"accuracy": acc.get(i, math.nan), "loss": risks[i], "n": n}
    present = [i for i in range(num_groups) if per_group[names[i]]["n"] > 0]
    worst = min(present, key=lambda i: acc[i])
    return {
        "worst_group_accuracy": acc[worst],
        "worst_group_loss": max(risks[i] for i in present),
        "worst_group": worst,
        "average_accuracy": float((z.argmax(1) == y).double().mean()),
        "average_loss": float(losses.mean()),
        "mean_group_accuracy": sum(acc[i] for i in present) / len(present),
        "mean_group_loss": sum(risks[i] for i in present) / len(present),
        "per_group": per_group,
    }


@torch.no_grad()
def evaluate_groups(model: nn.Module, x, y, groups, *, num_groups: int, group_names=None, chunk: int = 8192):
    """:func:`worst_group_metrics` of ``model`` on ``(x, y, groups)`` (evaluated in chunks)."""
    from privopt.eval.metrics import model_logits

    logits = model_logits(model, x, chunk=chunk)
    return worst_group_metrics(logits, y, groups, num_groups=num_groups, group_names=group_names)


def group_accuracy_table(
    rows: Sequence[dict[str, Any]], *, group_names: Sequence[str], label_key: str = "label"
) -> str:
    """A markdown table: one row per result (its ``per_group`` accuracies), one column per group.

    Example:
        >>> rows = [{"label": "A", "per_group": {"g0": {"accuracy": 0.9}, "g1": {"accuracy": 0.5}}}]
        >>> print(group_accuracy_table(rows, group_names=["g0", "g1"]))
        | method | g0 | g1 |
        |---|---:|---:|
        | A | 0.900 | 0.500 |
    """
    head = "| method | " + " | ".join(group_names) + " |"
    sep = "|---|" + "---:|" * len(group_names)
    lines = [head, sep]
    for r in rows:
        cells = [r["per_group"].get(nm, {}).get("accuracy", math.nan) for nm in group_names]
        lines.append(f"| {r[label_key]} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)
