"""The ghost engine's fast paths against a per-example autograd loop and the vmap engine:
Linear biases fused into their weight's outer-product term, the folded GroupNorm rule, chunked
float64 row norms."""

import gc

import pytest
import torch
from torch import nn

from privopt.grads import get_engine
from privopt.grads.ghost import terms as ghost_terms
from privopt.grads.ghost.terms import BiasOfTerm, row_sq


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def loop_grads(model, x, y):
    """Oracle: one autograd call per example, flat gradients of all parameters."""
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        ce(model(x[i : i + 1]), y[i : i + 1]).sum().backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return torch.stack(rows)


def clipped_loop(model, x, y, clip, prev=None, w=None, w_prev=None):
    """Oracle of a clipped (weighted, differenced) sum from per-example gradients."""
    g = loop_grads(model, x, y) * (1.0 if w is None else w.unsqueeze(1))
    if prev is not None:
        saved = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(prev[n])
        g = g - loop_grads(model, x, y) * (1.0 if w_prev is None else w_prev.unsqueeze(1))
        with torch.no_grad():
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)
    norms = g.double().norm(dim=1)
    return (g * torch.clamp(clip / norms, max=1.0).float().unsqueeze(1)).sum(0), norms


@pytest.fixture
def fused_built(monkeypatch):
    """Records every term that fuse_bias returns."""
    built = []
    original = ghost_terms.fuse_bias

    def spy(pieces, done):
        term = original(pieces, done)
        built.append(term)
        return term

    monkeypatch.setattr(ghost_terms, "fuse_bias", spy)
    return built


def mlp(seed=0, out=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, out))


@pytest.mark.parametrize("difference", [False, True])
def test_fused_linear_bias_matches_per_example_loop(fused_built, difference):
    model = mlp()
    x, y = torch.randn(40, 2, 3), torch.randint(0, 3, (40,))
    prev = {n: p.detach() + 0.3 * torch.randn_like(p) for n, p in model.named_parameters()} if difference else None
    w, w_prev = torch.rand(40) + 0.5, torch.rand(40) + 0.5
    kwargs = dict(weights=w, params_prev=prev, weights_prev=w_prev if difference else None)
    res = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.05, **kwargs)
    want, norms = clipped_loop(model, x, y, 0.05, prev, w, w_prev if difference else None)
    # the first layer's bias is fused at one point and also at two points (same input: merged rows)
    assert any(isinstance(t, BiasOfTerm) for t in fused_built)
    torch.testing.assert_close(res.total, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.norms, norms, rtol=1e-5, atol=1e-7)
    assert bool((res.norms * torch.clamp(0.05 / res.norms, max=1.0) <= 0.05 * (1 + 1e-6)).all())


def test_fused_bias_matches_vmap_and_keeps_clipping_exact():
    model = mlp(seed=1, out=4)
    x, y = 10 * torch.randn(33, 6), torch.randint(0, 4, (33,))
    for clip in (1e-3, 1.0, 1e6):
        ghost = get_engine("ghost").clipped_sum(model, ce, x, y, clip=clip)
        ref = get_engine("vmap").clipped_sum(model, ce, x, y, clip=clip)
        torch.testing.assert_close(ghost.total, ref.total, rtol=1e-5, atol=1e-6 * clip)
        torch.testing.assert_close(ghost.norms, ref.norms, rtol=1e-6, atol=0)


def test_bias_without_a_single_outer_weight_term_is_not_fused(fused_built):
    """out_features = 1 materialises the weight (one product is not cheaper): the bias falls back
    to its own dense term and the numbers do not change."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))
    x, y = torch.randn(32, 4), torch.randn(32)
    loss = lambda out, t: (out - t) ** 2
    res = get_engine("ghost").clipped_sum(model, loss, x, y, clip=0.5)
    ref = get_engine("vmap").clipped_sum(model, loss, x, y, clip=0.5)
    torch.testing.assert_close(res.total, ref.total, rtol=1e-5, atol=1e-6)
    assert not any(isinstance(t, BiasOfTerm) for t in fused_built)


def test_tied_linear_called_twice_keeps_exact_per_sample_gradients():
    """A Linear applied twice gets two bias pieces with different partners: no fusion, exact sums."""
    torch.manual_seed(3)
    lin = nn.Linear(4, 4)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    model = Twice()
    x, y = torch.randn(32, 4), torch.randint(0, 4, (32,))
    _, g = get_engine("ghost").per_sample_grads(model, ce, x, y)
    torch.testing.assert_close(g, loop_grads(model, x, y), rtol=1e-5, atol=1e-6)
    res = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.1)
    want, _ = clipped_loop(model, x, y, 0.1)
    torch.testing.assert_close(res.total, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(5, 6), (5, 6, 7), (5, 6, 3, 4)])
@pytest.mark.parametrize("affine_groups", [1, 2, 3])
def test_group_norm_rule_matches_per_example_loop(shape, affine_groups):
    torch.manual_seed(4)
    C = shape[1]
    model = nn.Sequential(nn.GroupNorm(affine_groups, C), nn.Flatten(), nn.LazyLinear(3))
    x = torch.randn(*shape) * 3 + 1
    model(x)  # materialise the lazy layer
    with torch.no_grad():  # non-trivial affine parameters
        model[0].weight.normal_()
        model[0].bias.normal_()
    y = torch.randint(0, 3, (shape[0],))
    _, g = get_engine("ghost").per_sample_grads(model, ce, x, y)
    torch.testing.assert_close(g, loop_grads(model, x, y), rtol=1e-4, atol=1e-5)


def test_group_norm_rule_in_a_difference_query_matches_vmap():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    x, y = torch.randn(32, 2, 6, 6), torch.randint(0, 3, (32,))
    prev = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in model.named_parameters()}
    ghost = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.2, params_prev=prev)
    ref = get_engine("vmap").clipped_sum(model, ce, x, y, clip=0.2, params_prev=prev)
    torch.testing.assert_close(ghost.total, ref.total, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cols", [3, 5000, 300_000])
def test_chunked_row_norms_equal_one_float64_pass(cols):
    m = torch.randn(7, cols) * 1e20  # squares overflow float32: the accumulation must be float64
    want = torch.linalg.vector_norm(m.double(), dim=1).square()
    got = row_sq(m)
    assert got.dtype == torch.float64 and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e-17, 1e-30, 1e15, 1e25])
def test_large_block_row_norms_bound_the_float64_norm(scale):
    """Large float32 blocks get their row norms from float32 slice norms, inflated by the worst
    case of their rounding: never below the exact norm, at most 8e-6 above it; rows in float32's
    subnormal range (tiny) or whose squares overflow it (huge) are recomputed exactly."""
    torch.manual_seed(7)
    m = torch.randn(40, 9000) * scale
    m[3] *= torch.rand(9000) ** 8  # widely spread magnitudes within a row
    m[5, :100] = 3e30  # squares overflow float32 in this row only
    m[6] = 0.0
    want = torch.linalg.vector_norm(m.double(), dim=1).square()
    got = row_sq(m)
    assert got.dtype == torch.float64 and bool(torch.isfinite(got).all())
    assert bool((got >= want).all()) and bool((got <= want * (1 + 8e-6)).all())
    assert got[5] == want[5] and got[6] == 0


def test_clipped_sums_leave_no_reference_cycles():
    """Everything a query allocates is freed by reference counting: a cycle (e.g. a piece that
    refers to itself) would keep captured activations alive until a full garbage collection,
    which on a small model costs more than the step itself."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    x, y = torch.randn(32, 1, 6, 6), torch.randint(0, 3, (32,))
    prev = {n: p.detach() + 0.1 for n, p in model.named_parameters()}
    engine = get_engine("ghost")
    engine.clipped_sum(model, ce, x, y, clip=1.0, params_prev=prev)  # structure and layout caches
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            engine.clipped_sum(model, ce, x, y, clip=1.0)
            engine.clipped_sum(model, ce, x, y, clip=1.0, params_prev=prev)
        found = gc.collect()
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert found == 0


@pytest.mark.parametrize("difference", [False, True])
@pytest.mark.parametrize("saved", [True, False])
def test_group_norm_reuses_the_forward_statistics_and_matches_per_example_loop(monkeypatch, difference, saved):
    """The GroupNorm rule reads the mean/rstd its forward saved in the autograd node (no second
    normalisation pass); without them (``saved=False``: forced) it recomputes them. Both give the
    per-example oracle's clipped sums, at one point and for a difference."""
    from privopt.grads.ghost import rules

    taken = []
    original = rules._saved_group_stats

    def spy(*args):
        stats = original(*args) if saved else None
        taken.append(stats is not None)
        return stats

    monkeypatch.setattr(rules, "_saved_group_stats", spy)
    torch.manual_seed(6)
    model = nn.Sequential(
        nn.GroupNorm(1, 2), nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    )
    with torch.no_grad():
        for gn in (model[0], model[2]):
            gn.weight.normal_()
            gn.bias.normal_()
    x, y = torch.randn(32, 2, 6, 6) * 2 + 1, torch.randint(0, 3, (32,))
    prev = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in model.named_parameters()} if difference else None
    res = get_engine("ghost").clipped_sum(model, ce, x, y, clip=0.3, params_prev=prev)
    want, norms = clipped_loop(model, x, y, 0.3, prev=prev)
    torch.testing.assert_close(res.total, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(res.norms, norms, rtol=1e-4, atol=1e-6)
    # both GroupNorms (the lowest one too: its own node never runs) at every point
    assert taken == [saved] * (4 if difference else 2)
