"""A layer without a ghost rule is re-run per sample (the vmap rule); a layer that draws random
numbers (dropout inside a custom block) would draw new ones in that re-run, so its per-sample
gradients would not be those of the forward pass the loss came from. Such a query is answered by
the vmap engine instead (one consistent forward per sample), with a warning.

Regression test: the ghost engine returned a gradient mixing two dropout masks (the sum of
``grad_s`` was 992 where the forward's loss implied 2040).
"""

import warnings

import pytest
import torch
from torch import nn

from privopt.errors import PrivoptRuntimeWarning
from privopt.grads import get_engine


class DropScale(nn.Module):
    """``dropout(x * s)``: no ghost rule, so its parameter goes through the vmap rule."""

    def __init__(self, n):
        super().__init__()
        self.s = nn.Parameter(torch.ones(n))
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x * self.s)


class Pair(nn.Module):
    """Returns a tuple: the batch dimension of its output is not known, so the ghost engine
    re-runs the whole model (a vmap over it) for its parameter."""

    def __init__(self, n):
        super().__init__()
        self.s = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.s, x


class PairThenDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair, self.drop = Pair(16), nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.pair(x)[0])


def half_square(out, y):
    return 0.5 * (out**2).sum(1)


@pytest.mark.parametrize("build", [lambda: nn.Sequential(DropScale(16)), PairThenDropout], ids=["layer", "model"])
@pytest.mark.parametrize("engine_name", ["ghost", "vmap"])
def test_random_layer_gradient_is_that_of_the_forward_pass(engine_name, build):
    """With x = 1 and s = 1 the block outputs 2 where kept, 0 where dropped: the loss of a sample
    is 2·(kept), and its gradient in s is 4 per kept coordinate — if the mask of the gradient is
    the mask of the forward, the sum of the gradient is exactly twice the sum of the losses."""
    model = build().train()
    x, y = torch.ones(64, 16), torch.zeros(64)
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = get_engine(engine_name).clipped_sum(model, half_square, x, y, clip=1e9)
    assert got.total.sum().item() == pytest.approx(2 * got.losses.sum().item())
    assert 0 < got.losses.sum().item() < 2 * 16 * 64  # dropout was active
    fallbacks = [w for w in caught if issubclass(w.category, PrivoptRuntimeWarning) and "random" in str(w.message)]
    assert len(fallbacks) == (1 if engine_name == "ghost" else 0)


def test_a_layer_without_randomness_stays_on_the_vmap_rule(recwarn):
    """In eval mode dropout draws nothing: no fallback, no warning, and the same numbers."""
    model = nn.Sequential(DropScale(16), nn.Linear(16, 2)).eval()
    x, y = torch.randn(40, 16), torch.randint(0, 2, (40,))
    ce = lambda out, t: nn.functional.cross_entropy(out, t, reduction="none")
    got = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.1)
    ref = get_engine("vmap").clipped_sum(model, ce, x, y, clip=0.1)
    assert torch.allclose(got.total, ref.total, atol=1e-6)
    assert not [w for w in recwarn if issubclass(w.category, PrivoptRuntimeWarning)]
