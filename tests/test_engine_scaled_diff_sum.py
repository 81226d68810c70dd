"""``GradEngine.scaled_diff_sum``: a difference of per-point scaled gradients, clipped as one vector,
with one pass per point in the built-in engines and the same numbers as the three-pass default."""

import warnings

import pytest
import torch

from privopt.errors import ConfigError
from privopt.grads import get_engine
from privopt.grads.engine import GradEngine, clip_factors
from test_ghost_engine import _case, _other_point, ce

GHOST, VMAP = get_engine("ghost"), get_engine("vmap")


def _scale(losses, norms):
    """A DRO-style scale at x: a capped weight from the losses times the clip factor of the norm."""
    return torch.exp(losses.double() - 1.0).clamp(0.0, 1.5) * clip_factors(norms, 0.2)


def _scale_prev(losses, norms):
    """A different scale at the previous point, so that the two cannot be confused."""
    return torch.sigmoid(losses.double()) * clip_factors(norms, 0.3)


def _reference(model, x, y, clip, params, params_prev):
    """``Σ Clip(s_i g_i − s'_i g'_i, clip)`` from per-sample gradients at both points."""
    losses, g = VMAP.per_sample_grads(model, ce, x, y, params=params)
    losses_p, g_p = VMAP.per_sample_grads(model, ce, x, y, params=params_prev)
    s = _scale(losses, torch.linalg.vector_norm(g, dim=1, dtype=torch.float64))
    s_p = _scale_prev(losses_p, torch.linalg.vector_norm(g_p, dim=1, dtype=torch.float64))
    h = g * s.to(g.dtype).unsqueeze(1) - g_p * s_p.to(g.dtype).unsqueeze(1)
    norms = torch.linalg.vector_norm(h, dim=1, dtype=torch.float64)
    return (h * clip_factors(norms, clip).to(h.dtype).unsqueeze(1)).sum(0), norms


def _answers(model, x, y, fallback=False, **kwargs):
    with warnings.catch_warnings():
        # the ghost path must be taken, except for "fallback", which answers through vmap by design
        warnings.simplefilter("ignore" if fallback else "error", RuntimeWarning)
        ghost = GHOST.scaled_diff_sum(model, ce, x, y, **kwargs)
    default = GradEngine.scaled_diff_sum(VMAP, model, ce, x, y, **kwargs)
    return {"ghost": ghost, "vmap": VMAP.scaled_diff_sum(model, ce, x, y, **kwargs), "default": default}


@pytest.mark.parametrize("name", ["mlp", "seq", "conv", "fallback", "reused"])
def test_every_engine_matches_the_per_sample_definition(name):
    model, x, y = _case(name)
    params, params_prev = _other_point(model, scale=0.1, seed=2), _other_point(model, scale=0.1)
    _, norms = _reference(model, x, y, 1.0, params, params_prev)
    clip = float(norms.median())  # binds for some samples and not for others, so both are tested
    want, want_norms = _reference(model, x, y, clip, params, params_prev)
    assert bool((want_norms > clip).any()) and bool((want_norms < clip).any())
    got = _answers(
        model,
        x,
        y,
        fallback=name == "fallback",
        clip=clip,
        scale=_scale,
        scale_prev=_scale_prev,
        params=params,
        params_prev=params_prev,
    )
    for res in got.values():
        assert torch.allclose(res.total, want, rtol=1e-9, atol=1e-12)
        assert torch.allclose(res.norms, want_norms, rtol=1e-6)
        assert res.clip == clip and res.losses_prev is not None and res.losses.shape == (x.shape[0],)


@pytest.mark.parametrize("B", [5, 40])  # below and above the padded minimum batch
def test_unit_scales_are_the_clipped_difference(B):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(B, 6), torch.randint(0, 3, (B,))
    prev = _other_point(model, scale=0.2)
    ones = lambda losses, norms: torch.ones_like(norms)
    for engine in (GHOST, VMAP):
        got = engine.scaled_diff_sum(model, ce, x, y, clip=0.05, scale=ones, scale_prev=ones, params_prev=prev)
        want = engine.clipped_sum(model, ce, x, y, clip=0.05, params_prev=prev)
        assert torch.allclose(got.total, want.total, rtol=1e-5, atol=1e-7)
        assert torch.allclose(got.norms, want.norms, rtol=1e-5)
        assert torch.equal(got.losses, want.losses) and torch.equal(got.losses_prev, want.losses_prev)


def _forward_counter(model):
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_built_in_engines_make_one_pass_per_point():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    prev = _other_point(model, scale=0.2)
    GHOST.clipped_sum(model, ce, x, y, clip=1.0)  # the ghost engine probes a new model's layout once
    calls = _forward_counter(model)
    kwargs = {"clip": 0.1, "scale": _scale, "scale_prev": _scale_prev, "params_prev": prev}
    GHOST.scaled_diff_sum(model, ce, x, y, **kwargs)
    assert calls[0] == 2
    calls[0] = 0
    GradEngine.scaled_diff_sum(GHOST, model, ce, x, y, **kwargs)
    assert calls[0] == 4  # the default: a norm pass at each point, then both points again


def test_a_non_finite_record_contributes_nothing_at_either_point():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    prev = _other_point(model, scale=0.2)
    kwargs = {"clip": 0.1, "scale": _scale, "scale_prev": _scale_prev, "params_prev": prev}
    bad = x.clone()
    bad[3] = float("inf")
    keep = torch.arange(40) != 3
    for engine in (GHOST, VMAP):
        want = engine.scaled_diff_sum(model, ce, x[keep], y[keep], **kwargs)
        got = engine.scaled_diff_sum(model, ce, bad, y, **kwargs)
        assert torch.isfinite(got.total).all()
        assert torch.allclose(got.total, want.total, rtol=1e-5, atol=1e-7)


def test_removing_a_record_moves_the_sum_by_at_most_the_clip():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.Tanh(), torch.nn.Flatten(), torch.nn.Linear(48, 2))
    x, y = torch.randn(40, 1, 6, 6) * 3, torch.randint(0, 2, (40,))
    prev = _other_point(model, scale=0.5)
    kwargs = {"clip": 0.05, "scale": _scale, "scale_prev": _scale_prev, "params_prev": prev}
    for engine in (GHOST, VMAP):
        full = engine.scaled_diff_sum(model, ce, x, y, **kwargs).total
        for i in (0, 17, 39):
            keep = torch.arange(40) != i
            moved = float((full - engine.scaled_diff_sum(model, ce, x[keep], y[keep], **kwargs).total).norm())
            assert moved <= 0.05 * (1 + 1e-5)


def test_bad_arguments_are_refused():
    model, x, y = _case("mlp")
    prev = _other_point(model)
    for engine in (GHOST, VMAP):
        with pytest.raises(ConfigError, match="clip threshold"):
            engine.scaled_diff_sum(model, ce, x, y, clip=0.0, scale=_scale, scale_prev=_scale, params_prev=prev)
        with pytest.raises(ConfigError, match="scale"):
            engine.scaled_diff_sum(model, ce, x, y, clip=1.0, scale=_scale, scale_prev=2.0, params_prev=prev)


@pytest.mark.parametrize("name", ["conv", "seq", "mlp"])
@pytest.mark.parametrize("kept", ["none", "after-backward"])
def test_every_term_form_gives_the_definition(monkeypatch, name, kept):
    """With no per-sample block kept during the backward pass, the terms come from the pieces
    (Gram, dot-product and chunked forms) or from blocks formed after it; both match vmap."""
    from privopt.grads.ghost import TUNING

    monkeypatch.setattr(TUNING, "small_keep_elems", 0)
    monkeypatch.setattr(TUNING, "extra_keep_fraction", (0.0, 0.0))
    monkeypatch.setattr(TUNING, "after_keep_fraction", 100.0 if kept == "after-backward" else 0.0)
    if kept == "none":
        monkeypatch.setattr(TUNING, "keep_elems", 0)
        monkeypatch.setattr(TUNING, "chunk_elems", 64)  # chunked materialisation in several slices
    model, x, y = _case(name)
    params, params_prev = _other_point(model, scale=0.1, seed=2), _other_point(model, scale=0.1)
    want, want_norms = _reference(model, x, y, 0.05, params, params_prev)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = GHOST.scaled_diff_sum(
            model, ce, x, y, clip=0.05, scale=_scale, scale_prev=_scale_prev, params=params, params_prev=params_prev
        )
    assert torch.allclose(got.total, want, rtol=1e-9, atol=1e-12)
    assert torch.allclose(got.norms, want_norms, rtol=1e-6)
