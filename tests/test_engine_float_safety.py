"""Clipping must hold in floating point, on BOTH engines: every record's released term (the change of
the clipped sum when the record is removed) stays within the clip, whatever the inputs.

Regression tests for three attacks on the ghost engine: difference norms by expansion cancelled in
float32 (a released term reached 6,585x its clip; vmap 1.0x), a finite 1e37 feature made the sum
non-finite, and a non-finite per-sample norm poisoned the whole sum.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from privopt.grads import get_engine
from privopt.grads.ghost import TUNING, OuterProductGrads
from privopt.grads.ghost.engine import clip_terms
from privopt.grads.ghost.keep import Keep
from privopt.grads.ghost.terms import Float64DotsTerm, Float64GramTerm, build_term

ENGINES = ["vmap", "ghost"]
# Float32 sums of clipped terms round relative to the terms (the vmap engine's own slack).
SLACK = 1e-4


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def _drop(t, k):
    return torch.cat([t[:k], t[k + 1 :]])


def max_term_ratio(engine, model, x, y, clip, loss=ce, **kwargs):
    """max over records k of ||S(D) - S(D without k)|| / clip (add/remove-one bound: 1)."""
    full = engine.clipped_sum(model, loss, x, y, clip=clip, **kwargs).total.double()
    assert torch.isfinite(full).all()
    worst = 0.0
    for k in range(x.shape[0]):
        sub = {n: _drop(v, k) if n in ("weights", "weights_prev") else v for n, v in kwargs.items()}
        part = engine.clipped_sum(model, loss, _drop(x, k), _drop(y, k), clip=clip, **sub).total.double()
        worst = max(worst, float((full - part).norm()) / clip)
    return worst


def _near(model, step, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: p.detach() + step * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}


# Routes of the ghost engine: default; nothing kept or materialised when small (float64 Gram
# route for multi-term layers, chunked materialisation otherwise); after-backward processing.
ROUTES = {
    "default": {},
    "float64": {"keep_elems": 0, "small_keep_elems": 0},
    "after-backward": {"in_backward": False},
}


@pytest.fixture(params=list(ROUTES))
def route(request, monkeypatch):
    for k, v in ROUTES[request.param].items():
        monkeypatch.setattr(TUNING, k, v)
    return request.param


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("step", [1e-6, 1e-5])
def test_near_equal_points_with_huge_inputs_stay_within_clip(engine, step, route):
    # The attack: large inputs, a tiny step between the two points, a small clip. Before the fix
    # the ghost engine released terms up to 6,585x the clip here.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
    x, y = 1e2 * torch.randn(8, 20), torch.randint(0, 3, (8,))
    ratio = max_term_ratio(get_engine(engine), model, x, y, 1e-6, params_prev=_near(model, step))
    assert 0.5 < ratio <= 1 + SLACK  # the clip binds, and holds


@pytest.mark.parametrize("engine", ENGINES)
def test_weighted_near_equal_sequence_layer_stays_within_clip(engine, route):
    # Token sequences (several outer products per record: the float64 Gram route when nothing is
    # materialised), DRO-style weights, two near-equal points.
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 2))
    x = 50 * torch.randn(6, 5, 24)
    y = torch.randint(0, 2, (6, 5)).float()
    w = torch.logspace(0, 3, 6)

    def mse(out, t):
        return (out[..., 0] - t).pow(2).sum(1)

    kw = {"params_prev": _near(model, 1e-6), "weights": w, "weights_prev": w * (1 + 1e-7)}
    ratio = max_term_ratio(get_engine(engine), model, x, y, 1e-4, loss=mse, **kw)
    assert 0.5 < ratio <= 1 + SLACK


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("query", ["single", "difference"])
def test_huge_finite_feature_keeps_sum_finite_and_bounded(engine, query):
    # A finite 1e37 feature passes Dataset.validate(); its squared norm overflows float32.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = torch.randn(6, 5), torch.randint(0, 2, (6,))
    x[0, 0] = 1e37
    kw = {"params_prev": _near(model, 0.1)} if query == "difference" else {}
    res = get_engine(engine).clipped_sum(model, ce, x, y, clip=1.0, **kw)
    assert torch.isfinite(res.total).all() and torch.isfinite(res.norms).all()
    assert max_term_ratio(get_engine(engine), model, x, y, 1.0, **kw) <= 1 + SLACK


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("query", ["single", "difference"])
def test_non_finite_sample_is_dropped(engine, query, route):
    # Activations overflow to inf (no saturating layer), the loss and gradients become NaN: that
    # sample's norm is non-finite, its term is exactly zero, the others are untouched.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        model[0].weight.abs_().add_(0.3)  # 5 * 0.3 * 3e38 > float32 max: the hidden layer is inf
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    x[2] = 3e38
    kw = {"params_prev": _near(model, 0.1)} if query == "difference" else {}
    eng = get_engine(engine)
    res = eng.clipped_sum(model, ce, x, y, clip=0.5, **kw)
    assert not torch.isfinite(res.norms[2]) and torch.isfinite(res.norms[[0, 1, 3, 4, 5]]).all()
    assert torch.isfinite(res.total).all()
    without = eng.clipped_sum(model, ce, _drop(x, 2), _drop(y, 2), clip=0.5, **kw)
    torch.testing.assert_close(res.total, without.total, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_nan_weight_is_dropped(engine):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    x, y = torch.randn(5, 4), torch.randint(0, 2, (5,))
    w = torch.tensor([1.0, float("nan"), 2.0, float("inf"), 0.5])
    eng = get_engine(engine)
    res = eng.clipped_sum(model, ce, x, y, clip=0.3, weights=w)
    keep = [0, 2, 4]
    ref = eng.clipped_sum(model, ce, x[keep], y[keep], clip=0.3, weights=w[keep])
    torch.testing.assert_close(res.total, ref.total, rtol=1e-5, atol=1e-6)


def test_ghost_matches_vmap_on_near_equal_points_float32(route):
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))
    x, y = 10 * torch.randn(9, 12), torch.randint(0, 4, (9,))
    prev = _near(model, 1e-3)
    a = get_engine("ghost").clipped_sum(model, ce, x, y, clip=1e-3, params_prev=prev)
    b = get_engine("vmap").clipped_sum(model, ce, x, y, clip=1e-3, params_prev=prev)
    assert float((a.total - b.total).norm() / b.total.norm()) < 1e-5
    assert float((a.norms - b.norms).norm() / b.norms.norm()) < 1e-5


# ------------------------------------------------------------ the float64 routes' bound


def _pieces(G, A, scales):
    out = []
    for g, a, s in zip(G, A, scales):
        pc = OuterProductGrads(g, a, torch.Size((g.shape[2], a.shape[2])))
        pc.scale = s
        out.append(pc)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    T=st.integers(1, 4),
    eps=st.sampled_from([0.0, 1e-7, 1e-5, 1e-3]),
    magnitude=st.sampled_from([1.0, 1e6, 1e18]),
    clip=st.sampled_from([1e-12, 1e-6, 1.0]),
)
def test_float64_routes_bound_the_released_term(seed, T, eps, magnitude, clip):
    """Near-cancelling tokens and points: the norm bound is at least the exact norm, and each
    record's term in the computed sum is at most the clip."""
    g = torch.Generator().manual_seed(seed)
    B, p, q = 4, 16, 16
    G = magnitude * torch.randn(B, 1, p, T, generator=g)
    A = magnitude * torch.randn(B, 1, q, T, generator=g)
    G2 = G * (1 + eps * torch.randn(B, 1, p, T, generator=g))
    A2 = A * (1 + eps * torch.randn(B, 1, q, T, generator=g))
    term = build_term("w", _pieces([G, G2], [A, A2], [None, -torch.ones(B)]), Keep(0), B)
    assert isinstance(term, Float64DotsTerm if T == 1 else Float64GramTerm)
    norms, coef = clip_terms({"w": term}, clip, B)
    exact = (G.double() @ A.double().transpose(2, 3) - G2.double() @ A2.double().transpose(2, 3)).flatten(1)
    assert (norms >= exact.norm(dim=1) * (1 - 1e-15)).all()
    total = term.clipped_sum(coef).double()
    for k in range(B):
        others = coef.clone()
        others[k] = 0
        released = total - term.clipped_sum(others).double()
        assert float(released.norm()) <= clip * (1 + SLACK)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    eps=st.sampled_from([0.0, 1e-7, 1e-3]),
    magnitude=st.sampled_from([1.0, 1e18]),
    clip=st.sampled_from([1e-12, 1.0]),
)
def test_a_layer_called_many_times_keeps_the_float64_bound(seed, eps, magnitude, clip):
    """Six calls of one layer (a recurrent step), in near-cancelling pairs: the batched Gram form of
    the dot-product route bounds the exact norm and each record's released term."""
    g = torch.Generator().manual_seed(seed)
    B, p, q = 4, 16, 16
    G = [magnitude * torch.randn(B, 1, p, 1, generator=g) for _ in range(3)]
    A = [magnitude * torch.randn(B, 1, q, 1, generator=g) for _ in range(3)]
    G += [x * (1 + eps * torch.randn(x.shape, generator=g)) for x in G]
    A += [x * (1 + eps * torch.randn(x.shape, generator=g)) for x in A]
    scales = [None] * 3 + [-torch.ones(B)] * 3
    term = build_term("w", _pieces(G, A, scales), Keep(0), B)
    assert isinstance(term, Float64DotsTerm)
    norms, coef = clip_terms({"w": term}, clip, B)
    exact = sum((1 if s is None else -1) * (x.double() @ a.double().transpose(2, 3)) for x, a, s in zip(G, A, scales))
    assert (norms >= exact.flatten(1).norm(dim=1) * (1 - 1e-15)).all()
    total = term.clipped_sum(coef).double()
    for k in range(B):
        others = coef.clone()
        others[k] = 0
        assert float((total - term.clipped_sum(others).double()).norm()) <= clip * (1 + SLACK)


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("engine", ENGINES)
def test_small_batch_difference_query_within_clip_with_two_threads(engine, two_threads):
    # With 2 threads the kernels' blocking for an 8-row batch differs from a 7-row one, so removing a
    # record re-rounded every other record's gradient; the cancellation of a difference query
    # amplified that to 1.03x the clip (both engines). Small batches are now computed at one shape.
    worst = 0.0
    for seed in range(3):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
        x, y = 1e2 * torch.randn(8, 20), torch.randint(0, 3, (8,))
        for step in (1e-6, 1e-5):
            worst = max(worst, max_term_ratio(get_engine(engine), model, x, y, 1e-6, params_prev=_near(model, step)))
    assert 0.5 < worst <= 1 + SLACK


@pytest.mark.parametrize("engine", ENGINES)
def test_padded_small_batch_returns_the_unpadded_values(engine):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    x, y = torch.randn(5, 5), torch.randint(0, 3, (5,))
    prev = _near(model, 0.1)
    w = torch.rand(5)
    res = get_engine(engine).clipped_sum(
        model, ce, x, y, clip=0.3, params_prev=prev, weights=lambda losses: losses.exp(), weights_prev=w
    )
    assert res.norms.shape == res.losses.shape == res.losses_prev.shape == (5,)
    g = torch.stack(
        [torch.cat([t.flatten() for t in _grad(model, x[i], y[i], None, res.losses[i].exp())]) for i in range(5)]
    )
    gp = torch.stack([torch.cat([t.flatten() for t in _grad(model, x[i], y[i], prev, w[i])]) for i in range(5)])
    h = (g - gp).double()
    want = (h * torch.clamp(0.3 / h.norm(dim=1), max=1.0).unsqueeze(1)).sum(0)
    torch.testing.assert_close(res.total.double(), want, rtol=1e-5, atol=1e-6)


def _grad(model, x, y, params, weight):
    from torch.func import functional_call

    params = params or dict(model.named_parameters())
    ps = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    loss = ce(functional_call(model, ps, (x.unsqueeze(0),)), y.unsqueeze(0))[0] * weight
    return torch.autograd.grad(loss, list(ps.values()))
