"""The ghost engine finds the batch dimension of every layer call from the model's structure, and its
per-layer rules live in a registry users can extend.

Regression test: the engine used to take "the dimension of size B" as the batch; in a
sequence-first layer whose sequence length equals the batch size, a replace-one change of the
clipped sum reached 1.2x its bound (3.4x in the original report).
"""

import dataclasses
import warnings

import pytest
import torch
from torch import nn

import privopt.grads.ghost.capture as capture_mod
import privopt.grads.ghost.rules as rules_mod
from privopt.grads import coefficients as coefficients_mod
from privopt.grads import get_engine
from privopt.grads.ghost import register_layer_rule, rule_for, unregister_layer_rule
from privopt.grads.ghost.layout import probe_layout

GHOST, VMAP = get_engine("ghost"), get_engine("vmap")


@pytest.fixture(autouse=True)
def exact_batch_shapes(monkeypatch):
    # These tests are about where the batch dimension is, with sizes chosen to collide (T == B);
    # small batches must reach the engine at their own size, not padded (tested elsewhere).
    monkeypatch.setattr(coefficients_mod, "MIN_BATCH_ROWS", 0)


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


class SeqFirst(nn.Module):
    """Input [B, T, D], a token-wise Linear applied sequence-first ([T, B, D]), mean over tokens."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x.transpose(0, 1)))
        return self.head(h.mean(0))


class Shift(nn.Module):
    """A layer without a rule (the vmap rule), taking a constant tensor as a second argument."""

    def __init__(self, n):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x, offset):
        return x * self.scale + offset


class SeqFirstCustom(nn.Module):
    def __init__(self):
        super().__init__()
        self.shift = Shift(4)
        self.head = nn.Linear(4, 2)
        self.register_buffer("offset", torch.linspace(-1, 1, 4))

    def forward(self, x):
        h = torch.tanh(self.shift(x.transpose(0, 1), self.offset))  # [T, B, 4]
        return self.head(h.mean(0))


class Folded(nn.Module):
    """Batch folded into the token dimension: [B*T, D] through a Linear (batch dimension unknown)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        B, T, D = x.shape
        h = torch.tanh(self.lin(x.reshape(B * T, D))).reshape(B, T, -1)
        return self.head(h.mean(1))


def _no_fallback(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the whole-query vmap fallback must not happen
        return fn()


def _same(model, x, y, clip=0.05, **kw):
    a = _no_fallback(lambda: GHOST.clipped_sum(model, ce, x, y, clip=clip, **kw))
    b = VMAP.clipped_sum(model, ce, x, y, clip=clip, **kw)
    assert float((a.total - b.total).norm() / b.total.norm()) < 1e-10
    assert float((a.norms - b.norms).norm() / b.norms.norm()) < 1e-10
    return a


def _replace_one_ratio(engine, model, x, y, clip):
    base = engine.clipped_sum(model, ce, x, y, clip=clip).total.double()
    worst = 0.0
    g = torch.Generator().manual_seed(7)
    for k in range(x.shape[0]):
        x2, y2 = x.clone(), y.clone()
        x2[k] = 5 * torch.randn(x.shape[1:], generator=g, dtype=x.dtype)
        y2[k] = 1 - y2[k]
        worst = max(worst, float((engine.clipped_sum(model, ce, x2, y2, clip=clip).total.double() - base).norm()))
    return worst / (2 * clip)  # replace-one bound: 2C


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
@pytest.mark.parametrize("model_cls", [SeqFirst, SeqFirstCustom])
def test_sequence_first_layer_with_T_equal_B_stays_within_bound(engine, model_cls):
    torch.manual_seed(0)
    model = model_cls()
    B = T = 6
    x, y = torch.randn(B, T, 4), torch.randint(0, 2, (B,))
    assert _replace_one_ratio(get_engine(engine), model, x, y, clip=0.01) <= 1 + 1e-5


@pytest.mark.parametrize("model_cls", [SeqFirst, SeqFirstCustom, Folded])
@pytest.mark.parametrize("B", [3, 5, 6])
def test_layouts_match_vmap_without_falling_back(model_cls, B):
    torch.manual_seed(1)
    model = model_cls().double()
    x, y = torch.randn(B, 5 if B != 5 else 6, 4, dtype=torch.float64), torch.randint(0, 2, (B,))
    prev = {n: p.detach() + 0.1 for n, p in model.named_parameters()}
    _same(model, x, y)
    _same(model, x, y, params_prev=prev, weights=torch.linspace(0.5, 2, B, dtype=torch.float64))
    _, ga = _no_fallback(lambda: GHOST.per_sample_grads(model, ce, x, y))
    _, gb = VMAP.per_sample_grads(model, ce, x, y)
    assert float((ga - gb).norm() / gb.norm()) < 1e-10


def test_sequence_first_linear_goes_through_its_rule(monkeypatch):
    original, seen = rule_for(nn.Linear(1, 1)), []

    def spy(m, x, g):
        seen.append(tuple(x.shape))
        return original.fn(m, x, g)

    monkeypatch.setitem(rules_mod._RULES, nn.Linear, dataclasses.replace(original, fn=spy))
    torch.manual_seed(2)
    model = SeqFirst().double()
    x, y = torch.randn(6, 6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    _same(model, x, y)
    assert (6, 6, 4) in seen  # the token-wise layer, batch moved to the front, not the vmap rule


def test_layout_is_probed_once_per_model_and_input_shape(monkeypatch):
    calls = []

    def counting(*args):
        calls.append(1)
        return probe_layout(*args)

    monkeypatch.setattr(capture_mod, "probe_layout", counting)
    torch.manual_seed(3)
    model = SeqFirst()
    for B in (4, 7, 6, 2, 1):  # Poisson sampling: the batch size changes every step
        x, y = torch.randn(B, 6, 4), torch.randint(0, 2, (B,))
        _no_fallback(lambda x=x, y=y: GHOST.clipped_sum(model, ce, x, y, clip=0.1))
    assert len(calls) == 1
    GHOST.clipped_sum(model, ce, torch.randn(3, 9, 4), torch.tensor([0, 1, 0]), clip=0.1)  # new sequence length
    assert len(calls) == 2


def test_layer_calls_that_depend_on_the_batch_size_fall_back_with_warning():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.small, self.large = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.large(x) if x.shape[0] > 4 else self.small(x)

    torch.manual_seed(4)
    model = Branchy().double()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 2, (6,))
    with pytest.warns(RuntimeWarning, match="layout probe"):
        a = GHOST.clipped_sum(model, ce, x, y, clip=0.1)
    b = VMAP.clipped_sum(model, ce, x, y, clip=0.1)
    assert float((a.total - b.total).norm()) < 1e-12


# ------------------------------------------------------------------------ the rule registry


class Gain(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.g = nn.Parameter(torch.linspace(0.5, 2.0, n))

    def forward(self, x):
        return x * self.g


class LoudGain(Gain):
    def forward(self, x):  # a subclass with its own forward: the base class rule does not apply
        return 2 * x * self.g


def test_registered_rule_is_used_and_matches_vmap():
    used = []

    @register_layer_rule(Gain, trailing_dims=1)
    def gain_rule(module, x, grad_out):
        used.append(module)
        return {"g": (x * grad_out).reshape(x.shape[0], -1, x.shape[-1]).sum(1)}

    try:
        torch.manual_seed(5)
        model = nn.Sequential(nn.Linear(3, 4), Gain(4), nn.Tanh(), nn.Linear(4, 2)).double()
        x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
        _same(model, x, y, params_prev={n: p.detach() * 1.1 for n, p in model.named_parameters()})
        assert used and rule_for(model[1]).fn is gain_rule
        assert rule_for(LoudGain(4)) is None
    finally:
        unregister_layer_rule(Gain)
    assert rule_for(Gain(4)) is None  # back to the vmap rule, still exact
    _same(model, x, y)


def test_rule_predicates_refuse_unsupported_configurations():
    assert rule_for(nn.Embedding(5, 3)) is not None
    assert rule_for(nn.Embedding(5, 3, max_norm=1.0)) is None
    assert rule_for(nn.Conv2d(1, 1, 3)).trailing_dims is None  # the batch must be dimension 0
