"""Shared helpers of the linear-ERM algorithm tests (DP-SVRG, DP-GD-ERM, DP-AMD): data and a run context."""

import numpy as np
import torch

from privopt.algorithms.base import RunContext
from privopt.objectives.erm import logistic_loss, normalize_rows


def linear_ctx(x, y, *, ledger=None, noise=None, seed=0, model=None):
    """A context for ``nn.Linear(p, 1, bias=False)`` (zero weight unless ``model`` is given) on numpy
    data, with seeded (insecure) noise and sampling generators."""
    if model is None:
        model = torch.nn.Linear(x.shape[1], 1, bias=False, dtype=torch.float64)
        torch.nn.init.zeros_(model.weight)
    return RunContext(
        model=model,
        loss_fn=logistic_loss,
        x_train=torch.from_numpy(x),
        y_train=torch.from_numpy(y),
        engine=None,
        ledger=ledger,
        noise=noise or {},
        noise_rng=torch.Generator().manual_seed(seed),
        sampler_rng=torch.Generator().manual_seed(seed + 1),
    )


def planted_data(n=60, p=7, seed=0, scale=1.0):
    """Rows of norm ``scale`` and labels drawn from a planted logistic model."""
    rng = np.random.default_rng(seed)
    x = normalize_rows(rng.normal(size=(n, p))) * scale
    w_true = rng.normal(size=p) * 3
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-x @ w_true)), 1.0, -1.0)
    return x, y
