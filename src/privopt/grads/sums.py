"""Batch-level helpers on top of an engine: clipped scalar sums, chunked clipped sums, losses.

Per-sample clipping makes a chunked sum identical to the unchunked one, so chunks only bound
memory. Scalar queries (DRO dual variables) are clipped as ``sign(a)·min(|a|, C)`` in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch
from torch import nn
from torch.func import functional_call

from privopt.errors import ConfigError
from privopt.grads.flat import num_trainable

__all__ = ["clipped_scalar_sum", "chunked_clipped_sum", "batch_losses"]

Weights = Union[None, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


def clipped_scalar_sum(values: torch.Tensor, clip: float) -> torch.Tensor:
    """``sum_i sign(a_i)·min(|a_i|, C)`` as a 1-element float64 tensor (per-record bound C).

    Example:
        >>> clipped_scalar_sum(torch.tensor([0.5, -3.0, 2.0]), 1.0)
        tensor([0.5000], dtype=torch.float64)
    """
    if not clip > 0:
        raise ConfigError(f"clip threshold must be > 0, got {clip}")
    a = values.detach().to(torch.float64)
    return a.clamp(-clip, clip).sum().reshape(1)


@torch.no_grad()
def batch_losses(
    model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, *, params: dict | None = None, chunk: int = 1024
) -> torch.Tensor:
    """Per-sample losses ``[B]`` at ``params`` (``None``: the model's own parameters)."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64)
    out = []
    buffers = dict(model.named_buffers())
    for s in range(0, x.shape[0], chunk):
        xs, ys = x[s : s + chunk], y[s : s + chunk]
        logits = model(xs) if params is None else functional_call(model, ({**params}, buffers), (xs,))
        out.append(loss_fn(logits, ys).detach())
    return torch.cat(out)


def _slice_weights(w: Weights, sl: slice) -> Weights:
    return w[sl] if isinstance(w, torch.Tensor) else w


def chunked_clipped_sum(
    engine,
    model: nn.Module,
    loss_fn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    chunk: int,
    params=None,
    weights: Weights = None,
    params_prev=None,
    weights_prev: Weights = None,
) -> torch.Tensor:
    """``engine.clipped_sum`` over chunks of at most ``chunk`` records (per-sample clipping makes
    the chunked sum identical); tensor weights are aligned with the rows of ``x``. An empty batch
    gives the zero vector."""
    total = torch.zeros(num_trainable(model))
    for s in range(0, x.shape[0], chunk):
        sl = slice(s, s + chunk)
        res = engine.clipped_sum(
            model,
            loss_fn,
            x[sl],
            y[sl],
            clip=clip,
            params=params,
            weights=_slice_weights(weights, sl),
            params_prev=params_prev,
            weights_prev=_slice_weights(weights_prev, sl),
        )
        total = total + res.total.to(total.dtype)
    return total
