"""privopt.models.pooling.MaxPool2d returns what nn.MaxPool2d returns: values, argmax and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from privopt.grads import get_engine
from privopt.models import build_model
from privopt.models.pooling import MaxPool2d

SETTINGS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)),
]


def _tied(shape, seed=0):
    """Small integers: most windows hold ties, the case where two kernels could pick different argmaxes."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).float()


@pytest.mark.parametrize("kw", SETTINGS)
@pytest.mark.parametrize("shape", [(4, 3, 9, 7), (2, 16, 28, 28), (1, 1, 5, 5)])
def test_values_and_gradients_match_torch_on_tied_inputs(kw, shape):
    x = _tied(shape).requires_grad_()
    ref, ours = nn.MaxPool2d(**kw), MaxPool2d(**kw)
    out_ref, out = ref(x), ours(x)
    assert torch.equal(out, out_ref) and out.is_contiguous()
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(out_ref, x, g)[0])


def test_the_argmax_indices_match_torch():
    x = _tied((3, 5, 12, 12), seed=3)
    _, idx_ref = nn.functional.max_pool2d_with_indices(x, 2)
    # The fast route returns the values only; its indices are what its backward routes by.
    from privopt.models.pooling import _MaxPool2dCPU

    _, idx = _MaxPool2dCPU.apply(x, (2, 2), (2, 2), (0, 0), (1, 1), False)
    assert torch.equal(idx, idx_ref)


def test_nan_propagates_as_in_torch():
    x = torch.randn(2, 3, 6, 6)
    x[0, 1, 2, 3] = float("nan")
    assert torch.allclose(MaxPool2d(2)(x), nn.MaxPool2d(2)(x), equal_nan=True)


def test_double_backward_matches_torch():
    """Hessian-vector products (the SOSP diagnostics) go through the pool's backward."""
    torch.manual_seed(0)
    conv, lin = nn.Conv2d(2, 4, 3, padding=1), nn.Linear(4 * 4 * 4, 3)
    x, v = torch.randn(5, 2, 8, 8), [torch.randn_like(p) for p in conv.parameters()]

    def hvp(pool):
        loss = lin(pool(conv(x).tanh()).flatten(1)).square().sum()
        g = torch.autograd.grad(loss, list(conv.parameters()), create_graph=True)
        return torch.autograd.grad(sum((a * b).sum() for a, b in zip(g, v)), list(conv.parameters()))

    for ours, ref in zip(hvp(MaxPool2d(2)), hvp(nn.MaxPool2d(2))):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_inside_vmap_and_for_other_inputs_it_is_the_plain_layer():
    pool, ref = MaxPool2d(2), nn.MaxPool2d(2)
    xs = torch.randn(4, 3, 8, 8)
    per_sample = vmap(grad(lambda xi: pool(xi.unsqueeze(0)).square().sum()))(xs)
    assert torch.equal(per_sample, vmap(grad(lambda xi: ref(xi.unsqueeze(0)).square().sum()))(xs))
    x3 = torch.randn(3, 8, 8)  # unbatched input
    assert torch.equal(pool(x3), ref(x3))
    out, idx = MaxPool2d(2, return_indices=True)(xs)
    assert (out, idx)[1].dtype == torch.int64 and torch.equal(out, ref(xs))


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_the_cnn_per_sample_gradients_are_those_of_torch_max_pool(engine):
    model = build_model("cnn", input_shape=(1, 12, 12), num_classes=3)
    assert sum(isinstance(m, MaxPool2d) for m in model.modules()) == 2
    plain = build_model("cnn", input_shape=(1, 12, 12), num_classes=3)
    plain.load_state_dict(model.state_dict())
    for i, m in enumerate(plain):
        if isinstance(m, MaxPool2d):
            plain[i] = nn.MaxPool2d(2)
    x, y = torch.randn(6, 1, 12, 12), torch.tensor([0, 1, 2, 0, 1, 2])

    def loss(out, target):
        return nn.functional.cross_entropy(out, target, reduction="none")

    eng = get_engine(engine)
    ours = eng.clipped_sum(model, loss, x, y, clip=0.5).total
    ref = eng.clipped_sum(plain, loss, x, y, clip=0.5).total
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
