"""Sums that carry their own sensitivity, and the batch-level helpers that produce them.

A noisy release needs two things from the statistic it privatises: the value (a sum over the
batch of per-record terms) and the bound on one record's contribution to it (the clip threshold,
i.e. the add/remove-one L2 sensitivity). :class:`BoundedSum` keeps the two together from the
moment the terms are clipped, so :class:`~privopt.grads.release.PrivateBatch` reads the bound
instead of being told it a second time. The engines' :class:`~privopt.grads.engine.ClippedSum`
is read the same way (its ``total`` and ``clip``; :func:`as_bounded`).

A caller changes a bound only explicitly: :meth:`BoundedSum.scaled` scales value and bound
together, and :func:`clipped_scalar_difference_sum` states the bound of a weighted difference of
two clipped terms (``(1 + |w|)·C``; STORM's ``(2 − β)·C``).

Per-sample clipping makes a chunked sum identical to the unchunked one, so chunks only bound
memory. Scalar queries (DRO dual variables) are clipped as ``sign(a)·min(|a|, C)`` in float64.

A per-record value that is NaN (e.g. the loss of a record whose logits overflow to ``inf − inf``)
contributes nothing, as a gradient with a non-finite norm does in the engines: ``clamp`` keeps
NaN, and one NaN term would make the whole sum NaN, which no noise hides (the record's presence
would be released exactly).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import nn
from torch.func import functional_call

from privopt.errors import ConfigError
from privopt.grads.flat import zero_flat

__all__ = [
    "BoundedSum",
    "as_bounded",
    "clamped_losses",
    "clipped_scalar_sum",
    "clipped_scalar_difference_sum",
    "chunked_clipped_sum",
    "batch_losses",
]

Weights = Union[None, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


def _check_bound(bound: Any) -> float:
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0 or math.isnan(bound):
        raise ConfigError(f"per-record bound (clip threshold) must be > 0, got {bound!r}")
    return float(bound)


@dataclass(frozen=True)
class BoundedSum:
    """A sum over a batch of per-record terms, each of L2 norm at most ``bound``.

    ``bound`` is the add/remove-one L2 sensitivity of ``value`` (one record adds or removes one
    term). It may be ``inf`` only for non-private reference runs (no clipping).

    Example:
        >>> s = BoundedSum(torch.tensor([0.5, -1.0]), bound=1.0)
        >>> t = s.scaled(-2.0)
        >>> t.value.tolist(), t.bound
        ([-1.0, 2.0], 2.0)
    """

    value: torch.Tensor
    bound: float

    def __post_init__(self):
        object.__setattr__(self, "bound", _check_bound(self.bound))

    def scaled(self, factor: float) -> BoundedSum:
        """``factor·value`` with bound ``|factor|·bound`` (the only way to change a bound)."""
        f = float(factor)
        if f == 0 or not math.isfinite(f):
            raise ConfigError(f"scaling factor must be finite and non-zero, got {factor!r}")
        return BoundedSum(self.value * f, self.bound * abs(f))


def as_bounded(stat: Any) -> BoundedSum:
    """Read a statistic's value and per-record bound: a :class:`BoundedSum` or an engine
    :class:`~privopt.grads.engine.ClippedSum` (``total``, ``clip``). A bare tensor is refused:
    its sensitivity would have to be asserted by the caller."""
    if isinstance(stat, BoundedSum):
        return stat
    if hasattr(stat, "total") and hasattr(stat, "clip"):
        return BoundedSum(stat.total, bound=stat.clip)
    raise ConfigError(
        f"a noisy release needs a sum that carries its per-record bound (BoundedSum or ClippedSum), got "
        f"{type(stat).__name__}; build it with a clipping helper of privopt.grads.sums"
    )


def _drop_nan(values: torch.Tensor) -> torch.Tensor:
    """float64 copy of ``values`` with NaN entries set to 0 (the record contributes nothing)."""
    a = values.detach().to(torch.float64)
    return torch.where(torch.isnan(a), 0.0, a)


def clamped_losses(losses: torch.Tensor, bound: float) -> torch.Tensor:
    """Per-record losses clamped to ``[0, B]`` in float64, a NaN loss counting as 0 (so each entry
    is in ``[0, B]``: the per-record bound of any sum of them).

    Example:
        >>> clamped_losses(torch.tensor([-1.0, 3.0, float("inf"), float("nan")]), 2.0).tolist()
        [0.0, 2.0, 2.0, 0.0]
    """
    return _drop_nan(losses).clamp(0.0, _check_bound(bound))


def clipped_scalar_sum(values: torch.Tensor, clip: float) -> BoundedSum:
    """``sum_i sign(a_i)·min(|a_i|, C)`` as a 1-element float64 tensor (per-record bound C).

    Example:
        >>> s = clipped_scalar_sum(torch.tensor([0.5, -3.0, 2.0]), 1.0)
        >>> s.value, s.bound
        (tensor([0.5000], dtype=torch.float64), 1.0)
    """
    clip = _check_bound(clip)
    return BoundedSum(_drop_nan(values).clamp(-clip, clip).sum().reshape(1), bound=clip)


def clipped_scalar_difference_sum(
    values: torch.Tensor, values_prev: torch.Tensor, *, clip: float, weight_prev: float
) -> BoundedSum:
    """``sum_i [Clip(a_i, C) − w·Clip(b_i, C)]`` (float64, 1 element) with bound ``(1 + |w|)·C``.

    Each term is clipped separately, so one record contributes at most ``C + |w|·C``. STORM's
    value tracker uses ``w = 1 − β``: bound ``(2 − β)·C``.

    Example:
        >>> s = clipped_scalar_difference_sum(torch.tensor([3.0]), torch.tensor([-3.0]), clip=1.0, weight_prev=0.5)
        >>> s.value.item(), s.bound
        (1.5, 1.5)
    """
    clip = _check_bound(clip)
    w = float(weight_prev)
    now = _drop_nan(values).clamp(-clip, clip)
    before = _drop_nan(values_prev).clamp(-clip, clip)
    return BoundedSum((now - w * before).sum().reshape(1), bound=(1.0 + abs(w)) * clip)


@torch.no_grad()
def batch_losses(
    model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, *, params: dict | None = None, chunk: int = 1024
) -> torch.Tensor:
    """Per-sample losses ``[B]`` at ``params`` (``None``: the model's own parameters)."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
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
) -> BoundedSum:
    """``engine.clipped_sum`` over chunks of at most ``chunk`` records (per-sample clipping makes
    the chunked sum identical); tensor weights are aligned with the rows of ``x``. An empty batch
    gives the zero vector. The result carries the threshold as its per-record bound."""
    total = zero_flat(model).to(x.device)
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
    return BoundedSum(total, bound=clip)
