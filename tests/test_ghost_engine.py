"""The ghost engine must answer every query exactly like the reference vmap engine."""

import warnings
import weakref

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import privopt.grads.ghost.capture as capture_mod
import privopt.grads.ghost.rules as rules_mod
from privopt.errors import ConfigError, ModelError
from privopt.grads import GhostEngine, get_engine
from privopt.grads.ghost import TUNING

GHOST, VMAP = get_engine("ghost"), get_engine("vmap")


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def mse(out, y):
    return (out - y).pow(2).flatten(1).sum(1)


class SeqModel(nn.Module):
    """Embedding (with padding row) -> token-wise Linear -> LayerNorm -> pooled head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(9, 6, padding_idx=0)
        self.lin = nn.Linear(6, 5)
        self.ln = nn.LayerNorm(5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.ln(torch.tanh(self.lin(self.emb(x)))).mean(1))


class ConvModel(nn.Module):
    """Conv2d (stride, grouped 'same' reflect-padded), in-place ReLU, GroupNorm, Conv1d, PReLU (fallback)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.c2 = nn.Conv2d(8, 8, 3, groups=4, padding="same", padding_mode="reflect", bias=False)
        self.act = nn.PReLU()
        self.c3 = nn.Conv1d(8, 4, 2, dilation=2)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu_(self.gn(self.c1(x)))  # in-place on a captured output: grads must be pre-ReLU
        h = self.act(self.c2(h)).flatten(2)
        return self.fc(self.c3(h).mean(2))


class Scaled(nn.Module):
    """A custom layer owning a parameter (vmap-per-layer fallback) around a supported child."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        return self.inner(x) * self.scale


class Reused(nn.Module):
    """One Linear called twice and an embedding tied to the output layer (shared parameters)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.mid = nn.Linear(4, 4)
        self.out = nn.Linear(4, 7, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        h = self.emb(x).mean(1)
        return self.out(self.mid(torch.tanh(self.mid(h))))


def _case(name, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    B = 7
    if name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 3))
        x = torch.randn(B, 3, 4, generator=g)
    elif name == "seq":
        model = SeqModel()
        x = torch.randint(0, 9, (B, 5), generator=g)
        x[0, :2] = 0
    elif name == "conv":
        model = ConvModel()
        x = torch.randn(B, 3, 9, 9, generator=g)
    elif name == "fallback":
        model = nn.Sequential(Scaled(), nn.Tanh(), nn.Linear(4, 3))
        x = torch.randn(B, 4, generator=g)
    elif name == "reused":
        model = Reused()
        x = torch.randint(0, 7, (B, 3), generator=g)
    else:
        raise AssertionError(name)
    model = model.to(dtype)
    if x.is_floating_point():
        x = x.to(dtype)
    y = torch.randint(0, model(x).shape[1], (B,), generator=g)
    return model, x, y


def _other_point(model, scale=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {
        n: p.detach() + scale * torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters()
    }


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check_same(kwargs, model, x, y, tol, loss=ce, clip=0.2):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the ghost path must be taken, not the vmap fallback
        a = GHOST.clipped_sum(model, loss, x, y, clip=clip, **kwargs)
    b = VMAP.clipped_sum(model, loss, x, y, clip=clip, **kwargs)
    assert _rel(a.norms, b.norms) < tol
    assert _rel(a.total, b.total) < tol
    assert torch.allclose(a.losses, b.losses)
    assert (a.losses_prev is None) == (b.losses_prev is None)
    return a, b


def test_auto_prefers_ghost():
    assert isinstance(get_engine("auto"), GhostEngine)


@pytest.mark.parametrize("name", ["mlp", "seq", "conv", "fallback", "reused"])
@pytest.mark.parametrize("query", ["single", "weights", "callable", "difference", "difference-weights"])
def test_matches_vmap_float64(name, query):
    model, x, y = _case(name)
    w = torch.linspace(0.2, 2.0, x.shape[0], dtype=torch.float64)
    kwargs = {
        "single": {},
        "weights": {"weights": w},
        "callable": {"weights": lambda losses: torch.softmax(losses, 0) * len(losses)},
        "difference": {"params_prev": _other_point(model)},
        "difference-weights": {
            "params_prev": _other_point(model),
            "weights": w,
            "weights_prev": w.flip(0),
        },
    }[query]
    a, _ = _check_same(kwargs, model, x, y, tol=1e-10)
    # clip 0.2 must actually bind for some samples, otherwise clipping is not being tested
    assert bool((a.norms > 0.2).any())


@pytest.mark.parametrize("name", ["mlp", "conv"])
def test_matches_vmap_float32_to_1e5(name):
    model, x, y = _case(name, dtype=torch.float32)
    _check_same({}, model, x, y, tol=1e-5)
    _check_same({"params_prev": _other_point(model)}, model, x, y, tol=1e-5)


def test_explicit_params_point_and_no_side_effects():
    model, x, y = _case("conv")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    point = _other_point(model, seed=5)
    _check_same(
        {"params": point, "params_prev": _other_point(model, seed=6)},
        model,
        x,
        y,
        tol=1e-10,
    )
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_hooks_with_kwargs


def test_per_sample_grads_match_vmap():
    for name in ["seq", "conv", "reused"]:
        model, x, y = _case(name)
        la, ga = GHOST.per_sample_grads(model, ce, x, y)
        lb, gb = VMAP.per_sample_grads(model, ce, x, y)
        assert torch.allclose(la, lb) and ga.shape == gb.shape
        assert _rel(ga, gb) < 1e-10


def test_frozen_parameters_are_excluded():
    model, x, y = _case("mlp")
    model[1].bias.requires_grad_(False)
    a, _b = _check_same({}, model, x, y, tol=1e-10)
    assert a.total.numel() == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_chunked_norms_agree(monkeypatch):
    model, x, y = _case("conv")
    full = GHOST.clipped_sum(model, ce, x, y, clip=0.2, params_prev=_other_point(model))
    monkeypatch.setattr(TUNING, "chunk_elems", 64)  # forces one sample per chunk
    monkeypatch.setattr(TUNING, "keep_elems", 0)
    chunked = GHOST.clipped_sum(model, ce, x, y, clip=0.2, params_prev=_other_point(model))
    assert _rel(chunked.norms, full.norms) < 1e-12 and _rel(chunked.total, full.total) < 1e-12


def test_attention_falls_back_to_vmap_with_warning():
    # MultiheadAttention uses out_proj.weight without calling out_proj: must not be silently wrong.
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.att = nn.MultiheadAttention(4, 2, batch_first=True)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.att(x, x, x, need_weights=False)[0].mean(1))

    torch.manual_seed(0)
    model = Attn().double()
    x, y = torch.randn(5, 3, 4, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    with pytest.warns(RuntimeWarning, match="vmap engine"):
        a = GHOST.clipped_sum(model, ce, x, y, clip=0.1)
    b = VMAP.clipped_sum(model, ce, x, y, clip=0.1)
    assert _rel(a.total, b.total) < 1e-10


def test_in_place_modified_input_is_rejected():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 2)

        def forward(self, x):
            h = self.a(x) + 0.0
            out = self.b(h)
            h.mul_(2.0)  # corrupts the activation ``b`` read (autograd's weight gradient would fail too)
            return out + h[:, :2]

    torch.manual_seed(0)
    model = Bad().double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0])
    with pytest.raises(ModelError, match="modified in place"):
        GHOST.clipped_sum(model, ce, x, y, clip=0.1)


def test_bad_inputs_raise_config_errors():
    model, x, y = _case("mlp")
    with pytest.raises(ConfigError, match="per-sample losses"):
        GHOST.clipped_sum(model, lambda o, t: ce(o, t).mean(), x, y, clip=1.0)
    with pytest.raises(ConfigError, match="clip"):
        GHOST.clipped_sum(model, ce, x, y, clip=0.0)
    with pytest.raises(ConfigError, match="nope"):
        GHOST.clipped_sum(model, ce, x, y, clip=1.0, params={"nope": torch.zeros(1)})
    with pytest.raises(ConfigError, match="shape"):
        GHOST.clipped_sum(model, ce, x, y, clip=1.0, weights=torch.ones(3))


# ---------------------------------------------------------------- property tests over shapes

_SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(
    b=st.integers(1, 5),
    fin=st.integers(1, 12),
    fout=st.integers(1, 12),
    seq=st.sampled_from([None, 1, 2, 7]),
    bias=st.booleans(),
    diff=st.booleans(),
    weighted=st.booleans(),
    clip=st.floats(0.01, 10.0),
)
def test_property_linear(b, fin, fout, seq, bias, diff, weighted, clip):
    torch.manual_seed(b * 1000 + fin * 10 + fout)
    model = nn.Sequential(nn.Linear(fin, fout, bias=bias), nn.Tanh(), nn.Linear(fout, 2)).double()
    shape = (b, fin) if seq is None else (b, seq, fin)
    x = torch.randn(*shape, dtype=torch.float64)
    y = torch.randn(*shape[:-1], 2, dtype=torch.float64)
    kwargs = {}
    if diff:
        kwargs["params_prev"] = _other_point(model)
    if weighted:
        kwargs["weights"] = torch.rand(b, dtype=torch.float64) * 2
    _check_same(kwargs, model, x, y, tol=1e-9, loss=mse, clip=clip)


@_SETTINGS
@given(
    b=st.integers(1, 4),
    cin_g=st.integers(1, 3),
    cout_g=st.integers(1, 3),
    groups=st.sampled_from([1, 2]),
    k=st.integers(1, 4),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    size=st.integers(8, 11),  # >= the largest dilated kernel (7)
    one_d=st.booleans(),
    diff=st.booleans(),
)
def test_property_conv(b, cin_g, cout_g, groups, k, stride, padding, dilation, size, one_d, diff):
    torch.manual_seed(b + 10 * k + 100 * size)
    conv = (nn.Conv1d if one_d else nn.Conv2d)(
        cin_g * groups,
        cout_g * groups,
        k,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
    )
    model = nn.Sequential(conv, nn.Tanh(), nn.Flatten(), nn.LazyLinear(2)).double()
    x = torch.randn(b, cin_g * groups, *((size,) if one_d else (size, size)), dtype=torch.float64)
    model(x)  # materialise the lazy head
    y = torch.randn(b, 2, dtype=torch.float64)
    kwargs = {"params_prev": _other_point(model)} if diff else {}
    _check_same(kwargs, model, x, y, tol=1e-9, loss=mse, clip=0.5)


@_SETTINGS
@given(
    b=st.integers(1, 4),
    t=st.integers(1, 6),
    vocab=st.integers(2, 6),
    diff=st.booleans(),
    pad=st.booleans(),
)
def test_property_embedding_and_norms(b, t, vocab, diff, pad):
    torch.manual_seed(b + 7 * t + 31 * vocab)
    model = nn.Sequential(
        nn.Embedding(vocab, 4, padding_idx=0 if pad else None),
        nn.LayerNorm(4),
        nn.Flatten(),
        nn.Unflatten(1, (4, t)),
        nn.GroupNorm(2, 4),
        nn.Flatten(),
        nn.Linear(4 * t, 2),
    ).double()
    x = torch.randint(0, vocab, (b, t))
    y = torch.randn(b, 2, dtype=torch.float64)
    kwargs = {"params_prev": _other_point(model)} if diff else {}
    _check_same(kwargs, model, x, y, tol=1e-9, loss=mse, clip=0.3)


@pytest.mark.parametrize("fin,fout,seq", [(2, 3, 10), (20, 30, 3)])
def test_sequence_linear_both_norm_routes(fin, fout, seq):
    # (2,3,T=10): materialising G^T A is cheaper; (20,30,T=3): the Gram route is.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(fin, fout), nn.Tanh(), nn.Linear(fout, 2)).double()
    x = torch.randn(4, seq, fin, dtype=torch.float64)
    y = torch.randn(4, seq, 2, dtype=torch.float64)
    _check_same({}, model, x, y, tol=1e-10, loss=mse)
    _check_same({"params_prev": _other_point(model)}, model, x, y, tol=1e-10, loss=mse)


@pytest.mark.parametrize("name", ["mlp", "seq", "conv", "fallback", "reused"])
def test_book_keeping_sum_without_kept_blocks(monkeypatch, name):
    # With no budget for kept per-sample blocks every clipped sum is rebuilt from the captures
    # (one matmul / weight-gradient kernel per layer) — the path large models take.
    monkeypatch.setattr(TUNING, "keep_elems", 0)
    model, x, y = _case(name)
    w = torch.linspace(0.2, 2.0, x.shape[0], dtype=torch.float64)
    _check_same({}, model, x, y, tol=1e-10)
    _check_same(
        {"params_prev": _other_point(model), "weights": w, "weights_prev": w.flip(0)},
        model,
        x,
        y,
        tol=1e-10,
    )


def test_rmsnorm_even_kernel_same_padding_and_no_grad_context():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 3, 4, padding="same")  # even kernel: asymmetric implicit padding
            self.rms = nn.RMSNorm(3)
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            h = self.conv(x).transpose(1, 2)  # [B, L, 3]
            return self.fc(self.rms(torch.tanh(h)).mean(1))

    torch.manual_seed(0)
    model = Net().double()
    x, y = torch.randn(5, 2, 7, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    with torch.no_grad():  # callers inside no_grad (e.g. evaluation code) still get gradients
        _check_same({"params_prev": _other_point(model)}, model, x, y, tol=1e-10)


# --------------------------------------------------------------------------------------------
# Layers processed inside the backward pass (output-node pre-hooks) vs after it.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "seq", "conv", "fallback", "reused"])
def test_after_backward_path_matches_vmap(monkeypatch, name):
    # The older path (every output-gradient requested, layers processed after the backward pass)
    # must stay exact; it is the reference the in-backward path is compared with below.
    monkeypatch.setattr(TUNING, "in_backward", False)
    model, x, y = _case(name)
    _check_same({}, model, x, y, tol=1e-10)
    _check_same({"params_prev": _other_point(model)}, model, x, y, tol=1e-10)


@pytest.mark.parametrize(("name", "expected"), [("mlp", 1), ("conv", 2), ("reused", 1)])
def test_only_lowest_layers_are_requested(monkeypatch, name, expected):
    # Every handled layer above another one is processed in a pre-hook inside the backward pass;
    # only the lowest ones (and vmap-fallback layers) have their output-gradients requested.
    seen = []
    original = capture_mod.attach

    def spy(total, calls, *rest):
        direct = original(total, calls, *rest)
        seen.append((len(calls), len(direct)))
        return direct

    monkeypatch.setattr(capture_mod, "attach", spy)
    model, x, y = _case(name)
    _check_same({}, model, x, y, tol=1e-10)
    n_calls, n_direct = seen[0]
    # one bottom layer each, plus the PReLU that the conv model routes through vmap
    assert n_direct == expected < n_calls


def test_in_backward_releases_activations():
    # A layer's input must not be held by the engine once its per-sample block is formed: the
    # captured input of the hidden Linear becomes unreachable before clipped_sum returns.
    refs = []

    class Probe(nn.Module):
        def forward(self, h):
            h = h * 1.0  # a fresh activation tensor, referenced only by the graph and the capture
            refs.append(weakref.ref(h))
            return h

    model = nn.Sequential(nn.Linear(5, 40), nn.Tanh(), Probe(), nn.Linear(40, 40), nn.Tanh(), nn.Linear(40, 3)).double()
    x = torch.randn(6, 5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    res = GHOST.clipped_sum(model, ce, x, y, clip=0.1)
    assert refs and refs[0]() is None
    ref = VMAP.clipped_sum(model, ce, x, y, clip=0.1)
    assert _rel(res.total, ref.total) < 1e-10


def test_error_inside_backward_hook_falls_back(monkeypatch):
    # A layer that turns out not to be attributable while the backward pass runs (its handler
    # fails inside the pre-hook) must still end in the exact vmap answer, with the warning.
    def picky(m, x, gout):
        if m.out_features == 3:  # the top layer: processed inside the backward pass
            raise rules_mod.Unsupported("picky layer")
        return rules_mod._linear(m, x, gout)

    monkeypatch.setitem(rules_mod._RULES, nn.Linear, rules_mod.LayerRule(nn.Linear, picky, lambda m: True, lambda m: 1))
    model, x, y = _case("mlp")
    with pytest.warns(RuntimeWarning, match="picky layer"):
        a = GHOST.clipped_sum(model, ce, x, y, clip=0.2)
    b = VMAP.clipped_sum(model, ce, x, y, clip=0.2)
    assert _rel(a.total, b.total) < 1e-10
    for m in model.modules():  # no hook left behind on the module
        assert not m._forward_hooks_with_kwargs


def test_norms_are_float64_like_vmap():
    # Large DRO-style weights: the norms are accumulated and returned in float64 like vmap's.
    # (Each layer's own contribution is still computed in the model dtype.)
    model, x, y = _case("mlp", dtype=torch.float32)
    w = torch.logspace(10, 15, 7)
    a = GHOST.clipped_sum(model, ce, x, y, clip=0.2, weights=w)
    b = VMAP.clipped_sum(model, ce, x, y, clip=0.2, weights=w)
    assert a.norms.dtype == b.norms.dtype == torch.float64
    assert torch.isfinite(a.norms).all() and _rel(a.norms, b.norms) < 1e-5
    assert _rel(a.total, b.total) < 1e-5


def test_grouped_one_position_conv_difference_uses_float64_dots(monkeypatch):
    # A grouped convolution whose output is 1x1 reads different inputs at the two points of a
    # difference query: one outer product per group and point (the float64 dot-product route).
    import privopt.grads.ghost.terms as terms_mod

    built = []
    original = terms_mod.Float64DotsTerm.__init__

    def spy(self, pieces):
        built.append(pieces[0].key)
        original(self, pieces)

    monkeypatch.setattr(terms_mod.Float64DotsTerm, "__init__", spy)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 6, 3, groups=2), nn.Flatten(), nn.Linear(6, 3)
    ).double()
    x, y = torch.randn(5, 2, 3, 3, dtype=torch.float64), torch.randint(0, 3, (5,))
    _check_same({"params_prev": _other_point(model)}, model, x, y, tol=1e-10)
    assert (2, 3, 18) in built  # groups=2: 3 outputs and 2*3*3 inputs per group
