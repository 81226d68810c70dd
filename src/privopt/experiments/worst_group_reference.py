"""Non-private ceiling of the worst-group reproduction: how much worst-group accuracy can reweighting
the groups buy at all with logistic regression (``docs/algorithms/worst_group.md``, "Reproduction")?

Fits, on the training split and without privacy, (a) ERM (scikit-learn's logistic regression, weak
ℓ2 penalty) and (b) the worst-group minimax point ``min_w max_i L_i(w)`` with the certified saddle
solver of Minimax Phased ERM (tiny regularisation, duality gap ≤ ``GAP``), and scores both on the test
split. When the two are close, no worst-group method — private or not — can beat ERM (hence DP-SGD)
by more than that margin: the ceiling is a property of the data and the model class.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

__all__ = ["GAP", "minimax_reference"]

GAP = 1e-5  # certified duality gap of the minimax solve
_RADIUS = 1e3  # W: large enough never to bind on standardised features


def _scores(weights: torch.Tensor, bias: torch.Tensor, x, y, g, *, num_groups: int, names) -> dict[str, Any]:
    logits = x @ weights.T + bias
    loss = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    acc = (logits.argmax(1) == y).double()
    present = [i for i in range(num_groups) if bool((g == i).any())]
    group_acc = {i: float(acc[g == i].mean()) for i in present}
    return {
        "worst_group_accuracy": min(group_acc.values()),
        "average_accuracy": float(acc.mean()),
        "worst_group_loss": max(float(loss[g == i].mean()) for i in present),
        "per_group": {(names[i] if names else str(i)): round(v, 4) for i, v in group_acc.items()},
    }


def minimax_reference(data, *, max_iters: int = 100_000) -> dict[str, Any]:
    """ERM and the exact worst-group minimax point of logistic regression on ``data`` (a group
    :class:`~privopt.data.Dataset`), scored on its test split. NOT private: a reference only.

    Example:
        >>> from privopt.data import load_dataset
        >>> ref = minimax_reference(load_dataset("synthetic-groups", seed=0, n_train=800, dim=3))
        >>> ref["minimax"]["gap"] <= GAP
        True
    """
    from sklearn.linear_model import LogisticRegression

    from privopt.algorithms.worst_group_scsc import SaddleObjective, solve_accelerated

    t0 = time.perf_counter()
    n, p, names = int(data.y_train.shape[0]), int(data.num_groups), data.group_names
    x, y, g = data.x_train.double().reshape(n, -1), data.y_train.long(), data.g_train.long()
    xt = data.x_test.double().reshape(int(data.y_test.shape[0]), -1)
    test = (xt, data.y_test.long(), data.g_test.long())
    erm = LogisticRegression(C=1e4, max_iter=5000).fit(x.numpy(), y.numpy())
    half = torch.tensor(erm.coef_[0] / 2)  # the two-logit form of a binary logistic regression
    w_erm, b_erm = torch.stack([-half, half]), torch.tensor([-erm.intercept_[0] / 2, erm.intercept_[0] / 2])
    d = x.shape[1]
    start = torch.cat([w_erm.reshape(-1), b_erm])
    obj = SaddleObjective(
        x, y, g, norm=torch.bincount(g, minlength=p).double().clamp(min=1.0), num_classes=2, mu_w=1e-5,
        mu_lam=1e-4, center=start, ball_center=torch.zeros_like(start), radius=_RADIUS,
    )  # fmt: skip
    res = solve_accelerated(obj, start, target_gap=GAP, max_iters=max_iters)
    w_mm, b_mm = res.w[: 2 * d].reshape(2, d), res.w[2 * d :]
    return {
        "erm": _scores(w_erm, b_erm, *test, num_groups=p, names=names),
        "minimax": {**_scores(w_mm, b_mm, *test, num_groups=p, names=names), "gap": float(res.gap)},
        "note": (
            "non-private references fitted on the training split, scored on the test split; 'gap' and "
            "'train_worst_group_loss' are measured on the training split without noise: NOT private"
        ),
        "wall_s": time.perf_counter() - t0,
        "train_worst_group_loss": {
            "erm": float(np.max(obj.losses(start).numpy())),
            "minimax": float(obj.losses(res.w).max()),
        },
    }
