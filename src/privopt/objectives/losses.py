"""Per-example losses: a name (``cross_entropy``, ``logistic``), a torch loss module, or a function.

Per-sample clipping needs one loss value per example (``reduction="none"``). A torch loss module
(``nn.CrossEntropyLoss()``) is copied with ``reduction="none"``; an element-wise one (``nn.MSELoss()``
on several outputs) then gives one loss per output element, which are reduced per example as the
module's own reduction would (mean, or sum). A plain function must already return one value per
example (checked on two examples before training, see
:func:`privopt.training.builder.check_model_fits`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from privopt.errors import ConfigError, ModelError

__all__ = ["LossFn", "PerExampleLoss", "build_loss", "per_sample_loss"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def build_loss(name: str) -> LossFn:
    """Per-sample loss ``(outputs, targets) -> [B]`` by name: ``cross_entropy`` (one logit per
    class) or ``logistic`` (binary labels 0/1 and a single logit, the model of the linear ERM
    algorithms: ``log(1 + exp(-(2y - 1)·out))``).

    Example:
        >>> build_loss("cross_entropy")(torch.zeros(2, 3), torch.tensor([0, 2])).shape
        torch.Size([2])
        >>> build_loss("logistic")(torch.tensor([[0.0], [2.0]]), torch.tensor([1, 0]))
        tensor([0.6931, 2.1269])
    """
    if name == "cross_entropy":
        return lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    if name == "logistic":
        return _logistic_loss
    raise ConfigError(f"unknown loss {name!r}; available: cross_entropy, logistic")


def _readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read: not inside a ``torch.func`` transform (the vmap engine's
    ``vmap(grad(.))``), where they are per-example; the labels are checked where the loss sees a
    batch or split (the ghost engine, evaluation, a dataset's validation)."""
    return not torch._C._functorch.is_functorch_wrapped_tensor(t)


def _logistic_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.dim() > 2 or (out.dim() == 2 and out.shape[1] != 1):
        # The shape per example only: the batch's size is the secret sampling's.
        raise ValueError(
            f"the logistic loss needs one logit per example, got {tuple(out.shape[1:])} per example "
            "(model logreg: model_params {single_logit: true, bias: false} for the linear ERM algorithms)"
        )
    if y.is_floating_point() or (_readable(y) and bool(((y != 0) & (y != 1)).any())):
        raise ValueError("the logistic loss needs integer labels 0 or 1")
    return nn.functional.softplus(-(2 * y - 1).to(out.dtype) * out.reshape(-1))


class PerExampleLoss(nn.Module):
    """A torch loss module with ``reduction="none"``; per-element losses ``[B, ...]`` are reduced to
    ``[B]`` by the module's own reduction (``"sum"``: summed, else averaged) over each example's.

    Per-element losses must have the targets' shape: otherwise torch broadcast the outputs against
    the targets, possibly across examples (``[B, 1]`` outputs, ``[B]`` targets: ``[B, B]``), and one
    example's loss would read other examples' targets.
    """

    def __init__(self, criterion: nn.Module):
        super().__init__()
        self.per_element = copy.copy(criterion)  # the caller's module keeps its own reduction
        self.per_element.reduction = "none"
        self.summed = criterion.reduction == "sum"

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses = self.per_element(outputs, targets)
        if not isinstance(losses, torch.Tensor) or losses.dim() <= 1:
            return losses
        if not isinstance(targets, torch.Tensor) or losses.shape != targets.shape:
            per_example = lambda t: tuple(getattr(t, "shape", ())[1:])  # not the batch size: the sampling's
            raise ModelError(
                f"{type(self.per_element).__name__} gives per-element losses of shape {per_example(losses)} per "
                f"example for outputs of {per_example(outputs)} and targets of {per_example(targets)} per example: "
                "torch broadcast them, possibly across examples; give the targets the outputs' shape "
                "(e.g. y.unsqueeze(1) for one output)"
            )
        flat = losses.flatten(1)
        return flat.sum(1) if self.summed else flat.mean(1)


def per_sample_loss(criterion: Any = None) -> LossFn:
    """A per-example loss ``(outputs, targets) -> [B]``.

    Args:
        criterion: ``None`` or ``"cross_entropy"`` (the default loss of ``privopt train``), ``"logistic"``
            (one logit per example, labels 0/1), a torch loss module such as ``nn.CrossEntropyLoss()``
            or ``nn.MSELoss()`` (used with ``reduction="none"``, its other settings kept; per-element
            losses are reduced per example, :class:`PerExampleLoss`), or a callable that returns
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
        return PerExampleLoss(criterion)
    if callable(criterion):
        return criterion
    raise ConfigError(
        f"criterion must be a loss name, a torch loss module or a callable (outputs, targets) -> per-example "
        f"losses, got {type(criterion).__name__}: {criterion!r}"
    )
