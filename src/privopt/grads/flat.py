"""Moving between flat gradient vectors and a module's parameters (engine order)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "trainable_parameters",
    "num_trainable",
    "zero_flat",
    "set_flat_grad",
    "flat_params",
    "params_from_flat",
    "set_flat_params",
]


def trainable_parameters(model: nn.Module) -> list[torch.nn.Parameter]:
    """Trainable parameters in ``named_parameters()`` order (the engines' flat order)."""
    return [p for p in model.parameters() if p.requires_grad]


def num_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in trainable_parameters(model))


def zero_flat(model: nn.Module) -> torch.Tensor:
    """A flat zero vector in the trainable parameters' dtype and device: the sum of an empty batch.

    Its dtype and device must be those of a non-empty batch's sum, or the release of an empty
    (private) Poisson batch would be told apart by them."""
    params = trainable_parameters(model)
    if not params:
        return torch.zeros(0)
    return torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)


def set_flat_grad(model: nn.Module, flat: torch.Tensor) -> None:
    """Write a flat gradient into each parameter's ``.grad`` (so any torch optimizer can step)."""
    params = trainable_parameters(model)
    expected = sum(p.numel() for p in params)
    if flat.numel() != expected:
        raise ValueError(f"flat gradient has {flat.numel()} entries, model has {expected} trainable")
    offset = 0
    for p in params:
        k = p.numel()
        p.grad = flat[offset : offset + k].view_as(p).to(p.dtype).clone()
        offset += k


def flat_params(model: nn.Module) -> torch.Tensor:
    """The trainable parameters as one detached flat vector."""
    return torch.cat([p.detach().reshape(-1) for p in trainable_parameters(model)])


def params_from_flat(model: nn.Module, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """A ``{name: tensor}`` dict (engine ``params=`` format) holding ``flat`` reshaped like the model."""
    out, offset = {}, 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[name] = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
    return out


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector (engine order) into the model's trainable parameters, in place."""
    offset = 0
    for p in trainable_parameters(model):
        k = p.numel()
        p.copy_(flat[offset : offset + k].view_as(p).to(p.dtype))
        offset += k
