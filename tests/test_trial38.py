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


def _make_private(**data):
    import privopt

    model = nn.Linear(4, 2)
    return privopt.PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), batch_size=16, epochs=1,
        epsilon=1.0, delta=1e-4, max_grad_norm=1.0, **data,
    )  # fmt: skip


def test_a_data_loaders_own_sampler_is_not_replaced_silently():
    # A user balancing a rare class with a WeightedRandomSampler would otherwise train unbalanced unawares.
    import warnings

    from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

    from privopt.errors import PrivoptWarning

    x, y = torch.rand(100, 4), (torch.arange(100) % 5 == 0).long()
    records = TensorDataset(x, y)
    weighted = DataLoader(records, batch_size=16, sampler=WeightedRandomSampler(torch.ones(100), 100))
    with pytest.warns(PrivoptWarning, match=r"WeightedRandomSampler is not used.*Poisson.*weight=") as caught:
        _make_private(data_loader=weighted)
    assert "0.2" not in str(caught[0].message)  # nothing of the data (the rare class's share)
    for plain in (DataLoader(records, batch_size=16), DataLoader(records, batch_size=16, shuffle=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", PrivoptWarning)  # batch size and shuffling: replaced as documented
            _make_private(data_loader=plain)


def test_float64_inputs_for_a_float32_model_get_a_hint():
    from privopt.errors import ModelError

    x, y = torch.rand(100, 4, dtype=torch.float64), (torch.arange(100) % 2).long()  # e.g. torch.tensor(numpy array)
    hint = r"inputs are torch.float64 and the model's parameters torch.float32: pass x.to\("
    with pytest.raises(ModelError, match=hint):
        _make_private(dataset=(x, y))
