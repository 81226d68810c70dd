"""Checks that a model is compatible with per-sample DP gradients."""

from __future__ import annotations

from torch import nn

from privopt.errors import ModelError

# Layers whose output for one sample depends on other samples in the batch (or running stats).
_SAMPLE_MIXING = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


def validate_model(model: nn.Module) -> None:
    """Raise :class:`ModelError` if ``model`` mixes samples across the batch.

    BatchNorm normalises with batch statistics, so one record influences every other record's
    gradient and per-sample clipping no longer bounds the sensitivity. Use GroupNorm or LayerNorm.

    Example:
        >>> from torch import nn
        >>> validate_model(nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4)))
        >>> validate_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
        Traceback (most recent call last):
        ...
        privopt.errors.ModelError: layer '1' (BatchNorm1d) mixes samples across the batch, ...
    """
    for name, module in model.named_modules():
        if isinstance(module, _SAMPLE_MIXING):
            raise ModelError(
                f"layer {name!r} ({type(module).__name__}) mixes samples across the batch, which breaks "
                "per-sample DP clipping; replace it with nn.GroupNorm or nn.LayerNorm"
            )
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError("model has no trainable parameters")
