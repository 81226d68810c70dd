"""Per-example losses from what users have at hand: a name, a torch loss module, or a function.

Per-sample clipping needs one loss value per example (``reduction="none"``). A torch loss module
(``nn.CrossEntropyLoss()``) is copied with ``reduction="none"``; a plain function must already
return one value per example (checked on two examples before training, see
:func:`privopt.training.builder.check_model_fits`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from privopt.errors import ConfigError
from privopt.training.metrics import build_loss

__all__ = ["per_sample_loss"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def per_sample_loss(criterion: Any = None) -> LossFn:
    """A per-example loss ``(outputs, targets) -> [B]``.

    Args:
        criterion: ``None`` or ``"cross_entropy"`` (the default loss of ``privopt train``), ``"logistic"``
            (one logit per example, labels 0/1), a torch loss module such as ``nn.CrossEntropyLoss()``
            (used with ``reduction="none"``; its other settings are kept), or a callable that returns
            one loss per example.

    Raises:
        ConfigError: anything else (e.g. a number or an unknown loss name).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> loss = per_sample_loss(nn.CrossEntropyLoss(label_smoothing=0.1))
        >>> loss(torch.zeros(3, 2), torch.tensor([0, 1, 1])).shape
        torch.Size([3])
    """
    if criterion is None:
        return build_loss("cross_entropy")
    if isinstance(criterion, str):
        return build_loss(criterion)
    if isinstance(criterion, nn.Module) and hasattr(criterion, "reduction"):
        per_example = copy.copy(criterion)  # the caller's module keeps its own reduction
        per_example.reduction = "none"
        return per_example
    if callable(criterion):
        return criterion
    raise ConfigError(
        f"criterion must be a loss name, a torch loss module or a callable (outputs, targets) -> per-example "
        f"losses, got {type(criterion).__name__}: {criterion!r}"
    )
