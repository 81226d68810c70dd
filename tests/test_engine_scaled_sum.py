"""``GradEngine.scaled_sum``: one pass, the same numbers as the two-pass definition and as vmap."""

import math
import warnings

import pytest
import torch

from privopt.errors import ConfigError
from privopt.grads import get_engine
from privopt.grads.engine import GradEngine, clip_factors
from test_ghost_engine import _case, _other_point, ce

GHOST, VMAP = get_engine("ghost"), get_engine("vmap")


def _capped(losses, norms, clip=0.2, cap=1.5):
    """A DRO-style scale: a weight from the losses, capped, times the clip factor of the norm."""
    return torch.exp(losses.double() - 1.0).clamp(0.0, cap) * clip_factors(norms, clip)


def _reference(model, x, y, scale, params=None, weights=None):
    """``Σ s_i w_i ∇ℓ_i`` from per-sample gradients, s from the losses and the norms of ``w_i ∇ℓ_i``."""
    losses, g = VMAP.per_sample_grads(model, ce, x, y, params=params)
    if weights is not None:
        g = g * (weights(losses) if callable(weights) else weights).unsqueeze(1)
    norms = torch.linalg.vector_norm(g, dim=1, dtype=torch.float64)
    return (g * scale(losses, norms).to(g.dtype).unsqueeze(1)).sum(0)


@pytest.mark.parametrize("name", ["mlp", "seq", "conv", "fallback", "reused"])
@pytest.mark.parametrize("weighted", [False, True])
def test_every_engine_matches_the_per_sample_definition(name, weighted):
    model, x, y = _case(name)
    params = _other_point(model, scale=0.1)
    weights = (lambda losses: torch.softmax(losses, 0) * len(losses)) if weighted else None
    want = _reference(model, x, y, _capped, params=params, weights=weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "fallback" answers through vmap by design
        ghost = GHOST.scaled_sum(model, ce, x, y, scale=_capped, params=params, weights=weights)
    two_pass = GradEngine.scaled_sum(VMAP, model, ce, x, y, scale=_capped, params=params, weights=weights)
    one_pass = VMAP.scaled_sum(model, ce, x, y, scale=_capped, params=params, weights=weights)
    for res in (ghost, two_pass, one_pass):
        assert torch.allclose(res.total, want, rtol=1e-9, atol=1e-12)
        assert res.clip == math.inf and res.losses_prev is None and res.norms.shape == (x.shape[0],)
    # the scale must bind for some samples and not others, or the test checks nothing
    s = _capped(one_pass.losses, one_pass.norms)
    assert bool((s < 1).any()) and bool((s > 0).all())


@pytest.mark.parametrize("B", [5, 40])  # below and above the padded minimum batch
def test_clip_factor_scale_is_the_clipped_sum(B):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(B, 6), torch.randint(0, 3, (B,))
    for engine in (GHOST, VMAP):
        got = engine.scaled_sum(model, ce, x, y, scale=lambda losses, norms: clip_factors(norms, 0.05))
        want = engine.clipped_sum(model, ce, x, y, clip=0.05)
        assert torch.allclose(got.total, want.total, rtol=1e-5, atol=1e-7)
        assert torch.equal(got.norms, want.norms) and torch.equal(got.losses, want.losses)


def test_non_finite_scale_or_gradient_contributes_nothing():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 1, 0])
    ones = VMAP.scaled_sum(model, ce, x, y, scale=lambda losses, norms: torch.ones_like(norms))
    _, g = VMAP.per_sample_grads(model, ce, x, y)

    def nan_first(losses, norms):
        s = torch.ones_like(norms)
        s[0] = float("nan")
        return s

    for engine in (GHOST, VMAP):
        got = engine.scaled_sum(model, ce, x, y, scale=nan_first)
        assert torch.allclose(got.total, ones.total - g[0], atol=1e-6)
    bad = x.clone()
    bad[2] = float("inf")
    for engine in (GHOST, VMAP):
        got = engine.scaled_sum(model, ce, bad, y, scale=lambda losses, norms: torch.ones_like(norms))
        assert bool(torch.isfinite(got.total).all())
        assert torch.allclose(got.total, ones.total - g[2], atol=1e-5)


def test_bad_scales_are_refused():
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    for engine in (GHOST, VMAP):
        with pytest.raises(ConfigError, match="scale must return one value per example"):
            engine.scaled_sum(model, ce, x, y, scale=lambda losses, norms: torch.ones(3))
        with pytest.raises(ConfigError, match="scale must be a function"):
            engine.scaled_sum(model, ce, x, y, scale=torch.ones(4))
