"""Classification metrics of Paper A's experiments: accuracy, ROC AUC, F1, per-class
and worst-class accuracy, and worst-group accuracy (Paper D's target quantity).

All functions accept torch tensors or numpy arrays and return plain Python floats (JSON-ready).
Undefined quantities — the AUC when only one class is present, the accuracy of a class or group
with no samples — are ``nan`` rather than an exception, so a small or imbalanced evaluation split
never crashes a training run; aggregate across seeds with ``numpy.nanmean``.
"""

from __future__ import annotations

import math
from typing import Any, Union

import numpy as np
import torch
from sklearn.metrics import f1_score, roc_auc_score

from privopt.errors import ConfigError, DataError

__all__ = ["classification_metrics", "group_accuracies", "worst_group_accuracy", "probabilities"]

ArrayLike = Union[torch.Tensor, np.ndarray]


def _np(a: ArrayLike, name: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.size and arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise DataError(f"{name} contains NaN or inf")
    return arr


def _labels(y: ArrayLike, n: int, num_classes: int) -> np.ndarray:
    yy = _np(y, "y").reshape(-1)
    if yy.shape[0] != n:
        raise DataError(f"y has {yy.shape[0]} entries but logits have {n} rows")
    if yy.size and (yy.min() < 0 or yy.max() >= num_classes or not np.all(np.equal(np.mod(yy, 1), 0))):
        # Not the range found: these may be training labels (diagnostics).
        raise DataError(f"labels must be integers in [0, {num_classes - 1}]: some label is not")
    return yy.astype(np.int64)


@torch.no_grad()
def model_logits(model: torch.nn.Module, x: torch.Tensor, *, chunk: int = 2048) -> torch.Tensor:
    """``model``'s outputs on ``x`` in eval mode, in chunks of ``chunk`` records (the model's own
    train/eval mode is restored).

    Example:
        >>> model_logits(torch.nn.Linear(3, 2), torch.zeros(5, 3), chunk=2).shape
        torch.Size([5, 2])
    """
    was_training = model.training
    model.eval()
    try:
        return torch.cat([model(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)])
    finally:
        model.train(was_training)


def probabilities(logits: ArrayLike, *, num_classes: int) -> np.ndarray:
    """Class probabilities ``[N, num_classes]`` from logits.

    Binary problems may pass a single logit per sample (shape ``[N]`` or ``[N, 1]``, the logit of
    class 1) or two columns.
    """
    z = _np(logits, "logits").astype(np.float64)
    if num_classes == 2 and (z.ndim == 1 or (z.ndim == 2 and z.shape[1] == 1)):
        p1 = 1.0 / (1.0 + np.exp(-z.reshape(-1)))
        return np.stack([1.0 - p1, p1], axis=1)
    if z.ndim != 2 or z.shape[1] != num_classes:
        raise DataError(f"logits must have shape [N, {num_classes}], got {z.shape}")
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _per_class_accuracy(pred: np.ndarray, y: np.ndarray, num_classes: int) -> list[float]:
    out = []
    for c in range(num_classes):
        mask = y == c
        out.append(float(np.mean(pred[mask] == c)) if mask.any() else math.nan)
    return out


def _ovr_auc(prob: np.ndarray, y: np.ndarray, num_classes: int) -> float:
    """Macro one-vs-rest ROC AUC over the classes that have both positives and negatives."""
    if num_classes == 2:
        return float(roc_auc_score(y, prob[:, 1])) if len(np.unique(y)) == 2 else math.nan
    aucs = []
    for c in range(num_classes):
        pos = y == c
        if pos.any() and (~pos).any():
            aucs.append(roc_auc_score(pos.astype(int), prob[:, c]))
    return float(np.mean(aucs)) if aucs else math.nan


def classification_metrics(logits: ArrayLike, y: ArrayLike, *, num_classes: int) -> dict[str, Any]:
    """Accuracy, ROC AUC, F1, balanced / per-class / worst-class accuracy.

    Args:
        logits: model outputs ``[N, num_classes]`` (or ``[N]``/``[N, 1]`` for binary).
        y: integer labels ``[N]``.
        num_classes: number of classes K ≥ 2.

    Returns:
        ``{"accuracy", "roc_auc", "f1", "balanced_accuracy", "worst_class_accuracy",
        "per_class_accuracy", "num_samples"}``. For K = 2, ``roc_auc`` and ``f1`` are the binary
        scores of class 1; for K > 2 they are macro one-vs-rest AUC and macro F1. The macro AUC and
        the worst/balanced accuracies range over the classes present in ``y`` (absent classes give
        ``nan`` entries in ``per_class_accuracy``); macro F1 ranges over classes present in ``y`` or
        in the predictions.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 3.0]])
        >>> m = classification_metrics(logits, torch.tensor([0, 1, 1, 1]), num_classes=2)
        >>> m["accuracy"], m["worst_class_accuracy"], m["roc_auc"]
        (0.75, 0.6666666666666666, 1.0)
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    prob = probabilities(logits, num_classes=num_classes)
    n = prob.shape[0]
    if n == 0:
        raise DataError("cannot compute metrics on an empty evaluation set")
    yy = _labels(y, n, num_classes)
    pred = prob.argmax(axis=1)
    per_class = _per_class_accuracy(pred, yy, num_classes)
    present = [a for a in per_class if not math.isnan(a)]
    if num_classes == 2:
        f1 = f1_score(yy, pred, pos_label=1, average="binary", labels=[0, 1], zero_division=0)
    else:
        f1 = f1_score(yy, pred, average="macro", zero_division=0)
    return {
        "accuracy": float(np.mean(pred == yy)),
        "roc_auc": _ovr_auc(prob, yy, num_classes),
        "f1": float(f1),
        "balanced_accuracy": float(np.mean(present)),
        "worst_class_accuracy": float(min(present)),
        "per_class_accuracy": per_class,
        "num_samples": int(n),
    }


def group_accuracies(logits: ArrayLike, y: ArrayLike, groups: ArrayLike) -> dict[int, float]:
    """Accuracy of each group present in ``groups`` (keys are the group ids, as ints)."""
    z = _np(logits, "logits")
    pred = (z.reshape(-1) > 0).astype(np.int64) if (z.ndim == 1 or z.shape[1] == 1) else z.argmax(axis=1)
    yy = _np(y, "y").reshape(-1)
    gg = _np(groups, "groups").reshape(-1)
    if not (yy.shape[0] == gg.shape[0] == pred.shape[0]):
        raise DataError(f"logits, y and groups disagree in length: {pred.shape[0]}, {yy.shape[0]}, {gg.shape[0]}")
    if pred.shape[0] == 0:
        raise DataError("cannot compute group accuracies on an empty evaluation set")
    return {int(g): float(np.mean(pred[gg == g] == yy[gg == g])) for g in np.unique(gg)}


def worst_group_accuracy(logits: ArrayLike, y: ArrayLike, groups: ArrayLike) -> float:
    """Minimum accuracy over the groups present in ``groups``.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
        >>> worst_group_accuracy(logits, torch.tensor([0, 1, 1, 0]), torch.tensor([0, 0, 1, 1]))
        0.5
    """
    return min(group_accuracies(logits, y, groups).values())
