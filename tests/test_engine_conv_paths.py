"""The ghost engine's convolution paths against a per-example autograd loop and the vmap engine:
per-sample gradients by patches (thin inputs) or by the grouped weight-gradient kernel, and
large per-sample blocks kept within the excess budget (materialised once) or chunked (twice)."""

import pytest
import torch
from torch import nn

from privopt.grads import get_engine
from privopt.grads.ghost import TUNING
from privopt.grads.ghost.pieces import ConvOuterProducts
from test_engine_fast_paths import ce, clipped_loop, loop_grads


def conv_net(cin, cout, groups=1, seed=0, stride=1):
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, 3, padding=1, stride=stride, groups=groups)
    return nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))


@pytest.mark.parametrize(
    ("cin", "groups", "stride", "patches"),
    [(1, 1, 1, True), (3, 1, 2, True), (4, 2, 1, True), (8, 1, 1, False), (8, 2, 2, False)],
)
def test_conv_per_sample_routes_match_per_example_loop(cin, groups, stride, patches):
    model = conv_net(cin, 4, groups=groups, stride=stride)
    x, y = torch.randn(32, cin, 6, 6), torch.randint(0, 3, (32,))
    model(x)  # materialise the lazy layer
    conv = model[0]
    piece = ConvOuterProducts(x, torch.zeros(32, 4, 6, 6), conv.weight, (1, 1), (1, 1), (1, 1), groups)
    assert piece.patches_are_faster() is patches
    _, g = get_engine("ghost").per_sample_grads(model, ce, x, y)
    torch.testing.assert_close(g, loop_grads(model, x, y), rtol=1e-4, atol=1e-5)
    total, norms = clipped_loop(model, x, y, clip=0.05)
    res = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.05)
    torch.testing.assert_close(res.total, total, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(res.norms, norms, rtol=1e-5, atol=1e-7)


def test_patches_and_grouped_kernel_give_the_same_per_sample_gradients():
    torch.manual_seed(1)
    x, go, w = torch.randn(40, 3, 9, 9), torch.randn(40, 5, 5, 5), torch.randn(5, 3, 3, 3)
    piece = ConvOuterProducts(x, go, w, (2, 2), (1, 1), (1, 1), 1)
    assert piece.patches_are_faster()
    sl = slice(3, 29)
    by_patches = piece.materialize_raw(sl)
    by_kernel = piece._wgrad(go[sl].reshape(1, -1, 5, 5), x[sl].reshape(1, -1, 9, 9), 26).reshape(26, -1)
    torch.testing.assert_close(by_patches, by_kernel, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("difference", [False, True])
def test_large_conv_blocks_are_kept_within_the_excess_budget(monkeypatch, difference):
    """A per-sample block bigger than the layer's captures is kept when the excess budget allows,
    else chunked (materialised again for the sum): same numbers either way."""
    model = conv_net(8, 16)
    x, y = torch.randn(32, 8, 6, 6), torch.randint(0, 3, (32,))
    model(x)
    prev = {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in model.named_parameters()} if difference else None
    calls = []
    original = ConvOuterProducts.materialize_raw

    def counting(self, sl):
        calls.append(sl)
        return original(self, sl)

    monkeypatch.setattr(ConvOuterProducts, "materialize_raw", counting)
    monkeypatch.setattr(TUNING, "small_keep_elems", 0)  # every block is "large" here
    results = {}
    for fraction in (0.0, 100.0):
        monkeypatch.setattr(TUNING, "extra_keep_fraction", (fraction, fraction))
        monkeypatch.setattr(TUNING, "after_keep_fraction", fraction)
        calls.clear()
        results[fraction] = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.1, params_prev=prev)
        # one point: kept once, chunked twice (norms, then sum); a difference of a first layer:
        # kept once per point, chunked twice with both points' output-gradients merged first
        assert len(calls) == (2 if difference or not fraction else 1)
    ref = get_engine("vmap").clipped_sum(model, ce, x, y, clip=0.1, params_prev=prev)
    for res in results.values():
        torch.testing.assert_close(res.total, ref.total, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(res.norms, ref.norms, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("difference", [False, True])
def test_large_blocks_formed_after_the_backward_pass_are_kept(monkeypatch, difference):
    """With no excess budget during the backward pass, a large block is formed from the retained
    captures once the last backward is over (its activations freed): once per point instead of
    twice (norms, then sum); a hidden convolution of a difference query reads different inputs
    at the two points, so 2 calls instead of 4. Same numbers as the vmap engine."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Tanh(), conv_net(16, 16, seed=4))
    # 4x4 maps: the hidden layer's block is bigger than its captures and cheaper than Gram norms
    x, y = torch.randn(32, 3, 4, 4), torch.randint(0, 3, (32,))
    model(x)
    prev = {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in model.named_parameters()} if difference else None
    hidden = model[2][0]
    calls = []
    original = ConvOuterProducts.materialize_raw

    def counting(self, sl):
        if self.shape == hidden.weight.shape:
            calls.append(sl)
        return original(self, sl)

    monkeypatch.setattr(ConvOuterProducts, "materialize_raw", counting)
    monkeypatch.setattr(TUNING, "small_keep_elems", 0)
    monkeypatch.setattr(TUNING, "extra_keep_fraction", (0.0, 0.0))
    ref = get_engine("vmap").clipped_sum(model, ce, x, y, clip=0.1, params_prev=prev)
    for after, expected in ((0.0, 4 if difference else 2), (100.0, 2 if difference else 1)):
        monkeypatch.setattr(TUNING, "after_keep_fraction", after)
        calls.clear()
        res = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.1, params_prev=prev)
        assert len(calls) == expected
        torch.testing.assert_close(res.total, ref.total, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(res.norms, ref.norms, rtol=1e-5, atol=1e-7)
