"""Shared by the sequence-model tests (``tests/test_sequence_models.py``, ``tests/test_rnn_models.py``):
padded token data, the per-example loss and the autograd-loop reference."""

from __future__ import annotations

import torch
from torch import nn

from privopt.grads import get_engine


def padded_tokens(n: int, seed: int, *, vocab: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids (0 = padding) and a label: whether a token below 6 is present."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (n, length), generator=g)
    lengths = torch.randint(2, length + 1, (n,), generator=g)
    x[torch.arange(length)[None, :] >= lengths[:, None]] = 0
    return x, ((x >= 1) & (x < 6)).any(1).long()


def ce_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


def per_example_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The reference, [n, params]: each example's own autograd gradient, one example at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = [torch.autograd.grad(ce_loss(model(x[i : i + 1]), y[i : i + 1]).sum(), params) for i in range(len(x))]
    return torch.stack([torch.cat([g.flatten() for g in r]) for r in rows])


def ghost_and_seeded_forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, seed: int = 5):
    """The ghost engine's unclipped query and, with the same random state (dropout masks), one plain
    forward's per-example losses and autograd gradients [n, params]."""
    torch.manual_seed(seed)
    got = get_engine("ghost").clipped_sum(model, ce_loss, x, y, clip=1e10)
    torch.manual_seed(seed)
    losses = ce_loss(model(x), y)
    params = [p for p in model.parameters() if p.requires_grad]
    per = [torch.cat([g.flatten() for g in torch.autograd.grad(li, params, retain_graph=True)]) for li in losses]
    return got, losses.detach(), torch.stack(per)
