"""Checks that a model is compatible with per-sample DP gradients.

Two kinds of layers break per-sample clipping or the end-to-end guarantee:

* layers that mix samples across the batch (BatchNorm in all its variants: 1d/2d/3d, lazy,
  sync): one record changes every other record's output and gradient, so clipping each record's
  gradient no longer bounds its influence;
* layers that keep running statistics of the batch (``track_running_stats=True`` on InstanceNorm
  and its lazy variants, or any module with ``running_*`` buffers): those buffers are learnt from
  private data without noise and published with the model.

The engines also refuse, at run time, any buffer that a forward pass modifies (a custom module
updating its own statistics). See ``docs/engines.md``.
"""

from __future__ import annotations

from torch import nn

from privopt.errors import ModelError

__all__ = ["validate_model"]

# Layers whose output for one sample depends on other samples in the batch (train mode), by type.
_SAMPLE_MIXING = (nn.modules.batchnorm._BatchNorm,)  # BatchNorm1d/2d/3d, SyncBatchNorm, LazyBatchNorm*
_FIX = "replace it with nn.GroupNorm or nn.LayerNorm"


def _running_stat_buffers(module: nn.Module) -> list[str]:
    return [n for n, b in module.named_buffers(recurse=False) if b is not None and n.startswith("running_")]


def _problem(module: nn.Module) -> str | None:
    """Why ``module`` (itself, not its children) cannot be trained with per-sample DP, or ``None``."""
    if isinstance(module, _SAMPLE_MIXING):
        return f"mixes samples across the batch, which breaks per-sample DP clipping; {_FIX}"
    buffers = _running_stat_buffers(module)
    if getattr(module, "track_running_stats", False) or buffers:
        held = f" (buffers {', '.join(repr(b) for b in buffers)})" if buffers else ""
        return (
            f"keeps running statistics of the batch{held}, learnt from private data without noise and "
            f"released with the model; set track_running_stats=False or {_FIX}"
        )
    return None


def validate_model(model: nn.Module) -> None:
    """Raise :class:`ModelError` if ``model`` mixes samples across the batch or keeps running statistics.

    Example:
        >>> from torch import nn
        >>> validate_model(nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4)))
        >>> validate_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
        Traceback (most recent call last):
        ...
        privopt.errors.ModelError: layer '1' (BatchNorm1d) mixes samples across the batch, ...
        >>> validate_model(nn.Sequential(nn.Conv1d(2, 4, 3), nn.InstanceNorm1d(4, track_running_stats=True)))
        Traceback (most recent call last):
        ...
        privopt.errors.ModelError: layer '1' (InstanceNorm1d) keeps running statistics of the batch ...
    """
    for name, module in model.named_modules():
        problem = _problem(module)
        if problem is not None:
            where = f"layer {name!r}" if name else "the model"
            raise ModelError(f"{where} ({type(module).__name__}) {problem}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError("model has no trainable parameters")
