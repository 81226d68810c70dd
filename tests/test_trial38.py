"""Found by a practitioner's trial of the Python API (own model, own data, DRO)."""

import pytest
import torch
from torch import nn

from privopt.grads import get_engine

GHOST, VMAP = get_engine("ghost"), get_engine("vmap")


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


class TiedEmbedding(nn.Module):
    """Weight tying (as in language models): the embedding's table is also the output layer,
    used in the parent's forward while the embedding layer itself is called too."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(20, 8), nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.embed(x).mean(1)) @ self.embed.weight[:3].T


class TiedLinear(nn.Module):
    """A Linear layer called, and its weight used again by the parent with ``F.linear``."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.head(torch.tanh(nn.functional.linear(h, self.a.weight)))


def _reference_norms(model, x, y):
    rows = []
    for i in range(len(x)):
        g = torch.autograd.grad(ce(model(x[i : i + 1]), y[i : i + 1]).sum(), list(model.parameters()))
        rows.append(torch.cat([t.flatten() for t in g]).norm())
    return torch.stack(rows)


@pytest.mark.parametrize("make", [TiedEmbedding, TiedLinear])
def test_ghost_norms_count_a_parameter_also_used_outside_its_layer(make):
    # Before: the ghost engine saw only the layer call's use, so per-sample norms were too small
    # (12 % on TiedEmbedding), clipping let records through above the clip bound: not private.
    torch.manual_seed(0)
    model = make().double()
    x = torch.randint(0, 20, (40, 5)) if make is TiedEmbedding else torch.randn(40, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (40,))
    ref = _reference_norms(model, x, y)
    with pytest.warns(RuntimeWarning, match="used outside its module's forward"):
        got = GHOST.clipped_sum(model, ce, x, y, clip=0.5)
    assert torch.allclose(got.norms, ref, rtol=1e-9)
    assert torch.allclose(got.total, VMAP.clipped_sum(model, ce, x, y, clip=0.5).total, rtol=1e-9)
