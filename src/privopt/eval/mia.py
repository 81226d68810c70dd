"""Black-box membership-inference attack (MIA) and the DP cap on its AUC (``docs/privacy.md``,
"Membership inference and the DP cap").

Attack: score every point by the model's negative loss (or its max softmax confidence) and
measure how well the score separates training members from non-members (ROC AUC). For an
(ε, δ)-DP training algorithm every membership test satisfies ``TPR ≤ e^ε FPR + δ`` and
``1 − TPR ≥ e^{−ε}(1 − FPR − δ)``, which caps the attack AUC at ``e^ε/(1 + e^ε) + δ``
(:func:`dp_auc_bound`). :func:`mia_report` checks a trained model against that cap with a
statistical allowance: a sanity test every DP implementation should pass (the AUCs printed in
Paper A's Table 2 exceed it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from privopt.errors import ConfigError, DataError

__all__ = ["attack_scores", "mia_auc", "dp_auc_bound", "hanley_mcneil_se", "mia_report"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Score = Literal["loss", "confidence"]


def attack_scores(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    score: Score = "loss",
    batch_size: int = 1024,
) -> np.ndarray:
    """Membership scores (higher = "more likely a member"), float64 numpy ``[n]``.

    ``score="loss"``: ``−ℓ(x; ξ)``; ``score="confidence"``: the max softmax probability of the
    outputs (Paper A's "output confidence"; needs class logits).
    """
    if score not in ("loss", "confidence"):
        raise ConfigError(f"score must be 'loss' or 'confidence', got {score!r}")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    if not (isinstance(batch_size, int) and batch_size > 0):
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    p = next(model.parameters(), None)
    dev = p.device if p is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad():
            for i in range(0, x.shape[0], batch_size):
                xb, yb = x[i : i + batch_size].to(dev), y[i : i + batch_size].to(dev)
                logits = model(xb)
                if score == "loss":
                    s = -loss_fn(logits, yb).reshape(-1)
                else:
                    s = torch.softmax(logits.to(torch.float64), dim=1).max(dim=1).values
                out.append(s.detach().to("cpu", torch.float64))
    finally:
        model.train(was_training)
    scores = torch.cat(out).numpy() if out else np.zeros(0)
    if not np.isfinite(scores).all():
        raise DataError("non-finite membership scores (loss overflow?)")
    return scores


def _balanced(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Subsample the larger of two score arrays (without replacement) to the size of the smaller."""
    m = min(len(a), len(b))
    if len(a) > m:
        a = a[rng.choice(len(a), size=m, replace=False)]
    if len(b) > m:
        b = b[rng.choice(len(b), size=m, replace=False)]
    return a, b


def _auc(member_scores: np.ndarray, non_member_scores: np.ndarray) -> float:
    if len(member_scores) == 0 or len(non_member_scores) == 0:
        raise DataError("MIA needs at least one member and one non-member")
    labels = np.concatenate([np.ones(len(member_scores)), np.zeros(len(non_member_scores))])
    return float(roc_auc_score(labels, np.concatenate([member_scores, non_member_scores])))


def mia_auc(
    model: nn.Module,
    loss_fn: LossFn,
    *,
    members: tuple[torch.Tensor, torch.Tensor],
    non_members: tuple[torch.Tensor, torch.Tensor],
    score: Score = "loss",
    balance: bool = True,
    seed: int = 0,
    batch_size: int = 1024,
) -> float:
    """ROC AUC of the black-box score attack separating ``members`` from ``non_members``.

    Args:
        model, loss_fn: the trained model and its per-sample loss.
        members: ``(x, y)`` drawn from the training set.
        non_members: ``(x, y)`` never used in training (e.g. the test set).
        score: ``"loss"`` (default; score = −loss) or ``"confidence"``.
        balance: subsample the larger set (seeded) so both classes have equal size.
        seed: seed of the subsampling.
        batch_size: evaluation chunk size.

    Returns:
        AUC in [0, 1]; 0.5 = no better than guessing.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> torch.manual_seed(0) and None
        >>> model = nn.Linear(3, 2)
        >>> ce = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
        >>> data = lambda n: (torch.randn(n, 3), torch.randint(0, 2, (n,)))
        >>> 0.0 <= mia_auc(model, ce, members=data(50), non_members=data(80)) <= 1.0
        True
    """
    rng = np.random.default_rng(seed)
    s_in = attack_scores(model, loss_fn, *members, score=score, batch_size=batch_size)
    s_out = attack_scores(model, loss_fn, *non_members, score=score, batch_size=batch_size)
    if balance:
        s_in, s_out = _balanced(s_in, s_out, rng)
    return _auc(s_in, s_out)


def dp_auc_bound(epsilon: float, delta: float = 0.0) -> float:
    """Maximal membership-attack AUC against an (ε, δ)-DP algorithm: ``e^ε/(1+e^ε) + δ`` (≤ 1).

    Example:
        >>> round(dp_auc_bound(1.0, 0.0), 4)
        0.7311
    """
    eps, dlt = float(epsilon), float(delta)
    if not eps >= 0:
        raise ConfigError(f"epsilon must be >= 0, got {epsilon!r}")
    if not 0.0 <= dlt <= 1.0:
        raise ConfigError(f"delta must be in [0, 1], got {delta!r}")
    base = 1.0 / (1.0 + math.exp(-eps)) if math.isfinite(eps) else 1.0  # logistic form: no overflow
    return min(1.0, base + dlt)


def hanley_mcneil_se(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an empirical ROC AUC (Hanley & McNeil, 1982).

    ``SE² = [A(1−A) + (n₁−1)(Q₁−A²) + (n₂−1)(Q₂−A²)]/(n₁n₂)`` with ``Q₁ = A/(2−A)``,
    ``Q₂ = 2A²/(1+A)``. At A = 0.5 this is ≈ ``sqrt((n₁+n₂)/(12 n₁ n₂))``, the null standard
    deviation of the Mann–Whitney statistic.
    """
    if n_pos < 1 or n_neg < 1:
        raise ConfigError(f"need n_pos, n_neg >= 1, got {n_pos}, {n_neg}")
    a = min(max(float(auc), 0.0), 1.0)
    q1 = a / (2.0 - a)
    q2 = 2.0 * a * a / (1.0 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def mia_report(
    model: nn.Module,
    loss_fn: LossFn,
    *,
    members: tuple[torch.Tensor, torch.Tensor],
    non_members: tuple[torch.Tensor, torch.Tensor],
    epsilon: float,
    delta: float,
    score: Score = "loss",
    num_se: float = 3.0,
    seed: int = 0,
    batch_size: int = 1024,
    max_per_side: int | None = None,
) -> dict[str, Any]:
    """Run the attack and compare its AUC with the DP cap.

    The allowance ``slack = num_se · SE`` uses the Hanley–McNeil standard error evaluated *at the
    bound* (the boundary of the null hypothesis "the attack is no better than DP allows") for the
    actual sample sizes, so ``within_bound = auc ≤ bound + slack`` is a one-sided test at roughly
    the ``num_se``-sigma level.

    Args:
        members, non_members: ``(x, y)`` pairs (see :func:`mia_auc`).
        epsilon, delta: the privacy guarantee of the training run.
        num_se: number of standard errors of allowance (default 3).
        max_per_side: optionally cap each side (seeded subsample); Paper A uses 10,000.

    Returns:
        ``{"mia_auc", "mia_bound", "within_bound", "slack", "n_members", "n_non_members",
        "score"}``.
    """
    if not num_se >= 0:
        raise ConfigError(f"num_se must be >= 0, got {num_se!r}")
    rng = np.random.default_rng(seed)
    s_in = attack_scores(model, loss_fn, *members, score=score, batch_size=batch_size)
    s_out = attack_scores(model, loss_fn, *non_members, score=score, batch_size=batch_size)
    s_in, s_out = _balanced(s_in, s_out, rng)
    if max_per_side is not None and len(s_in) > max_per_side:
        s_in = s_in[rng.choice(len(s_in), size=max_per_side, replace=False)]
        s_out = s_out[rng.choice(len(s_out), size=max_per_side, replace=False)]
    auc = _auc(s_in, s_out)
    bound = dp_auc_bound(epsilon, delta)
    slack = num_se * hanley_mcneil_se(bound, len(s_in), len(s_out))
    return {
        "mia_auc": auc,
        "mia_bound": bound,
        "within_bound": bool(auc <= bound + slack),
        "slack": slack,
        "n_members": int(len(s_in)),
        "n_non_members": int(len(s_out)),
        "score": score,
    }
