"""The per-sample coefficients of an engine query, and the result type every engine returns.

Clip factors, caller weights (before the pass) and scales (after it, from the pass's losses and
norms) turn per-sample gradients into the terms a query sums; :func:`fixed_min_rows` pads small
batches so that a record's term never depends on how many others share its batch. Engines import
these from :mod:`privopt.grads.engine`, which re-exports them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import torch

from privopt.errors import ConfigError

ScaleFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Weights = Union[None, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]

__all__ = [
    "MIN_BATCH_ROWS",
    "ClippedSum",
    "ScaleFn",
    "Weights",
    "clip_factors",
    "fixed_min_rows",
    "pair_scales",
    "resolve_scale",
    "resolve_weights",
]

# Batches smaller than this are padded (with zero-weight copies of their own records) to this many
# rows, so that a record's per-sample values never depend on how many others share its batch.
MIN_BATCH_ROWS = 32


@dataclass
class ClippedSum:
    """Result of a clipped-sum query on one batch.

    Attributes:
        total: ``sum_i min(1, C/||h_i||) * h_i``, flat, shape ``[d]``. Its add/remove-one
            sensitivity is ``clip`` (a record moves at most one clipped term).
        norms: pre-clipping per-sample norms ``||h_i||``, shape ``[B]``, as clipped against (an
            upper bound that includes the engine's rounding where it computes a norm implicitly;
            not finite for samples whose term was dropped). Diagnostics only: data-dependent,
            never to be released.
        losses: per-sample losses at ``params``, shape ``[B]``.
        losses_prev: per-sample losses at ``params_prev`` for difference queries, else ``None``.
        clip: the threshold used.
    """

    total: torch.Tensor
    norms: torch.Tensor
    losses: torch.Tensor
    losses_prev: torch.Tensor | None
    clip: float

    @property
    def batch_size(self) -> int:
        return int(self.norms.shape[0])


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-sample factors ``min(1, C/||h||)``; zero vectors keep factor 1.

    A non-finite norm (an overflowing or NaN gradient) gets factor 0: that sample's term is
    dropped, and engines also zero its values so that ``0 * inf`` cannot make the sum non-finite.

    Example:
        >>> clip_factors(torch.tensor([0.5, 4.0, float("inf"), float("nan")]), 2.0)
        tensor([1.0000, 0.5000, 0.0000, 0.0000])
    """
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0:
        raise ConfigError(f"clip threshold must be a number > 0, got {clip!r}")
    # zero norm: C/0 = inf, capped to 1; inf norm: C/inf = 0; NaN norm (or inf/inf): NaN, mapped to 0.
    return torch.clamp(clip / norms, max=1.0).nan_to_num_(nan=0.0)


def resolve_weights(weights: Weights, losses: torch.Tensor) -> torch.Tensor | None:
    """Turn ``weights`` (None, tensor or callable of the losses) into a ``[B]`` tensor or None."""
    if weights is None:
        return None
    w = weights(losses.detach()) if callable(weights) else weights
    w = torch.as_tensor(w, dtype=losses.dtype, device=losses.device)
    if w.shape != losses.shape:
        raise ConfigError("per-sample weights must have the losses' shape (one per example of the batch)")
    return w


def resolve_scale(scale: ScaleFn, losses: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """``scale(losses, norms)`` as float64 ``[B]``, 0 where the norm or the scale is not finite."""
    if not callable(scale):
        raise ConfigError(f"scale must be a function of (losses, norms), got {type(scale).__name__}")
    s = torch.as_tensor(scale(losses.detach(), norms), device=norms.device).to(torch.float64)
    if s.shape != norms.shape:
        raise ConfigError("scale must return one value per example of the batch (the norms' shape)")
    return torch.where(torch.isfinite(norms) & torch.isfinite(s), s, 0.0)


def pair_scales(
    scale: ScaleFn,
    scale_prev: ScaleFn,
    point: tuple[torch.Tensor, torch.Tensor],
    prev: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both points' scales (float64 ``[B]``) from each point's ``(losses, norms)``: a sample whose
    norm is not finite at *either* point gets 0 at both (it contributes nothing); a scale that is
    not finite counts as 0 at its point."""
    s, s_prev = resolve_scale(scale, *point), resolve_scale(scale_prev, *prev)
    valid = torch.isfinite(point[1]) & torch.isfinite(prev[1])
    return torch.where(valid, s, 0.0), torch.where(valid, s_prev, 0.0)


def _pad_scale(scale: ScaleFn, B: int) -> ScaleFn:
    """``scale`` for a batch padded beyond ``B`` rows: the caller's on the first ``B``, 0 after."""

    def padded(losses: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
        real = resolve_scale(scale, losses[:B], norms[:B])
        return torch.cat([real, real.new_zeros(losses.shape[0] - B)])

    return padded


def _pad_weights(weights: Weights, B: int, rows: torch.Tensor) -> Weights:
    """Weights for a batch padded to ``rows.numel()`` rows: the caller's for the first ``B``, 0 after."""

    def padded(losses: torch.Tensor) -> torch.Tensor:
        real = resolve_weights(weights, losses[:B])
        real = torch.ones_like(losses[:B]) if real is None else real
        return torch.cat([real, real.new_zeros(losses.shape[0] - B)])

    return padded


def fixed_min_rows(query):
    """Decorate an engine's query (``clipped_sum``, ``scaled_sum``, ``scaled_diff_sum``): a batch of
    fewer than :data:`MIN_BATCH_ROWS` records is answered on a fixed-size batch padded with
    zero-weight copies of its records.

    Why: multi-threaded CPU kernels pick their blocking from the matrix shapes, and for very small
    batches (observed: 8 rows, 2 threads) a record's computed gradient then depends on the batch
    size, so removing one record moved every other record's term by rounding; in a difference
    query that rounding is amplified by the cancellation, and the clipped sum moved by 1.03·C.
    With one shape for every small batch the other records' terms are computed by the same
    kernels whichever record is absent (``docs/engines.md``, "Float safety"). A padded row
    has weight 0 at both points, so its term is exactly 0.
    """

    @functools.wraps(query)
    def padded(self, model, loss_fn, inputs, targets, **kwargs):
        B = int(inputs.shape[0])
        if B == 0 or B >= MIN_BATCH_ROWS:
            return query(self, model, loss_fn, inputs, targets, **kwargs)
        rows = torch.arange(MIN_BATCH_ROWS, device=inputs.device) % B
        if "scale_prev" not in kwargs:  # scaled_diff_sum weighs only through its scales
            kwargs["weights"] = _pad_weights(kwargs.get("weights"), B, rows)
            if kwargs.get("params_prev") is not None:
                kwargs["weights_prev"] = _pad_weights(kwargs.get("weights_prev"), B, rows)
        for key in ("scale", "scale_prev"):
            if kwargs.get(key) is not None:
                kwargs[key] = _pad_scale(kwargs[key], B)
        res = query(self, model, loss_fn, inputs[rows], targets[rows], **kwargs)
        prev = None if res.losses_prev is None else res.losses_prev[:B]
        return ClippedSum(total=res.total, norms=res.norms[:B], losses=res.losses[:B], losses_prev=prev, clip=res.clip)

    return padded
