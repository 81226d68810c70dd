"""Text / sequence models (embeddings with padding, RNNs, attention) on token ids: per-example
gradients of both engines equal an autograd loop; a recurrent layer torch.func cannot batch gets a
hint naming it and the fix; the ghost engine does not retry a capture that failed on the same model."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import privopt
import privopt.grads.ghost.capture as capture_mod
from privopt.data import Dataset
from privopt.errors import ConfigError, ModelError, PrivoptRuntimeWarning
from privopt.grads import get_engine
from privopt.grads.ghost import register_layer_rule, unregister_layer_rule
from privopt.models.attention import MultiheadAttention
from seq_helpers import ce_loss as _loss
from seq_helpers import ghost_and_seeded_forward, padded_tokens, per_example_grads

V, T, D = 40, 6, 8


def _tokens(n=8, seed=0):
    return padded_tokens(n, seed, vocab=V, length=T)


def _masked_mean(h, x):
    keep = (x != 0).to(h.dtype).unsqueeze(-1)
    return (h * keep).sum(1) / keep.sum(1).clamp(min=1)


class Recurrent(nn.Module):
    def __init__(self, cell=nn.GRU, h0=True, **kw):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D, padding_idx=0), nn.Linear(D, 2)
        self.rnn, self.h0 = cell(D, D, batch_first=True, **kw), h0

    def forward(self, x):
        e = self.emb(x)
        if not self.h0:
            return self.head(_masked_mean(self.rnn(e)[0], x))
        layers = self.rnn.num_layers * (2 if self.rnn.bidirectional else 1)
        h0 = torch.zeros_like(e[:, 0, :1]).expand(layers, -1, D)  # from the input: batched under torch.func
        out, _ = self.rnn(e, (h0, h0) if isinstance(self.rnn, nn.LSTM) else h0)
        return self.head(_masked_mean(out[..., :D] + out[..., D:].sum(-1, keepdim=True), x))


class Attention(nn.Module):
    """A TransformerEncoderLayer, or nn.MultiheadAttention called directly, with a padding mask."""

    def __init__(self, encoder=True):
        super().__init__()
        self.emb, self.pos, self.head = nn.Embedding(V, D, padding_idx=0), nn.Embedding(T, D), nn.Linear(D, 2)
        if encoder:
            self.att = nn.TransformerEncoderLayer(D, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        else:
            self.att = nn.MultiheadAttention(D, 2, batch_first=True)

    def forward(self, x):
        positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)  # per example: the Embedding rule applies
        e, pad = self.emb(x) + self.pos(positions), x == 0
        if isinstance(self.att, nn.MultiheadAttention):
            h = self.att(e, e, e, key_padding_mask=pad, need_weights=False)[0]
        else:
            h = self.att(e, src_key_padding_mask=pad)
        return self.head(_masked_mean(h, x))


MODELS = {
    "rnn": lambda: Recurrent(nn.RNN),
    "gru": lambda: Recurrent(nn.GRU),
    "gru-2-layers-bidirectional": lambda: Recurrent(nn.GRU, num_layers=2, bidirectional=True),
    "lstm": lambda: Recurrent(nn.LSTM),
    "lstm-without-h0": lambda: Recurrent(nn.LSTM, h0=False),
    "transformer-encoder-layer": lambda: Attention(encoder=True),
    "multihead-attention": lambda: Attention(encoder=False),
}


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
@pytest.mark.parametrize("name", list(MODELS))
def test_per_example_gradients_equal_an_autograd_loop(name, engine):
    torch.manual_seed(0)
    model = MODELS[name]()
    x, y = _tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's vmap fallbacks; the ghost engine's answer by vmap
        unclipped = get_engine(engine).clipped_sum(model, _loss, x, y, clip=1e10)
        clipped = get_engine(engine).clipped_sum(model, _loss, x, y, clip=0.05)
        reference = get_engine("vmap").clipped_sum(model, _loss, x, y, clip=0.05)
    assert torch.allclose(unclipped.total, per_example_grads(model, x, y).sum(0), atol=1e-5)
    assert (clipped.norms > 0.05).all()  # the clip binds: the norms are compared too
    assert torch.allclose(clipped.total, reference.total, atol=1e-6)
    assert torch.allclose(clipped.norms.float(), reference.norms.float(), rtol=1e-4)


@pytest.mark.parametrize("cell", [nn.GRU, nn.RNN])
def test_a_recurrent_layer_without_initial_state_gets_a_hint_naming_it(cell):
    x, y = _tokens(n=60)
    model = Recurrent(cell, h0=False)
    with pytest.raises(ModelError, match=rf"the model has {cell.__name__}: pass the initial hidden state.*h0 = "):
        privopt.PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=(x, y),
            batch_size=20, epochs=1, epsilon=2.0, delta=1e-3, max_grad_norm=1.0,
        )  # fmt: skip


class _Counting(Attention):
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x)


class _Unused(nn.Module):
    pass


def test_the_ghost_engine_does_not_retry_a_capture_that_failed_on_the_same_model(monkeypatch):
    torch.manual_seed(0)
    model, (x, y) = _Counting(encoder=False), _tokens()
    ghost = get_engine("ghost")
    with pytest.warns(PrivoptRuntimeWarning, match="out_proj.weight' is used outside its module's forward"):
        first = ghost.clipped_sum(model, _loss, x, y, clip=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _Counting.calls = 0
        again = ghost.clipped_sum(model, _loss, x, y, clip=0.1)
        assert _Counting.calls == 1  # the vmap engine's forward only: no layout probe, no capture
        reference = get_engine("vmap").clipped_sum(model, _loss, x, y, clip=0.1)
        assert torch.allclose(again.total, reference.total, atol=1e-6) and torch.equal(first.total, again.total)
        register_layer_rule(_Unused)(lambda m, x, g: {})  # a new rule may make the model supported: retried
        try:
            captures, run = [], capture_mod.Capture.run
            counted = lambda self, *a, **k: captures.append(1) or run(self, *a, **k)
            monkeypatch.setattr(capture_mod.Capture, "run", counted)
            ghost.clipped_sum(model, _loss, x, y, clip=0.1)
            assert captures  # (its finding that out_proj.weight is used outside out_proj is cached per structure)
        finally:
            unregister_layer_rule(_Unused)


def test_sequence_models_train_in_an_own_loop_and_with_fit():
    x, y = _tokens(n=300, seed=1)
    data = Dataset.from_tensors(x[:250], y[:250], x_test=x[250:], y_test=y[250:], num_classes=2)
    torch.manual_seed(0)
    gru = Recurrent(nn.GRU)
    record = privopt.fit(
        model=gru, dataset=data, algorithm="dp-double-spider", epsilon=2.0, delta=1e-4, accountant="rdp",
        epochs=1, q=5, N1=50, N2=25, N3=50, N4=25, lr=0.5, insecure_seed=0,
    )  # fmt: skip
    assert record["status"] == "finished" and record["privacy"]["epsilon_spent"] <= 2.0
    model = Attention(encoder=True)
    engine = privopt.PrivacyEngine(engine="vmap", insecure_seed=0)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), dataset=(x[:250], y[:250]),
        batch_size=50, epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=1.0,
    )  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    for _batch in loader:
        optimizer.step()
    assert engine.steps_taken == 5 and engine.get_epsilon() <= 2.0
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_an_engine_passed_to_make_private_says_where_it_goes():
    x, y = _tokens(n=60)
    model = Recurrent(nn.GRU)
    with pytest.raises(ConfigError, match=r"takes no argument 'engine': .*PrivacyEngine\(engine=\.\.\.\)"):
        privopt.PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=(x, y),
            batch_size=20, epochs=1, epsilon=2.0, delta=1e-3, max_grad_norm=1.0, engine="vmap",
        )  # fmt: skip


def _privopt_attention(model):
    """``model`` with every nn.MultiheadAttention replaced by privopt's (same weights)."""
    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if isinstance(child, nn.MultiheadAttention):
                setattr(m, name, MultiheadAttention.from_torch(child))
    return model


@pytest.mark.parametrize("batch_first", [True, False])
def test_privopt_attention_returns_what_torch_attention_returns(batch_first):
    torch.manual_seed(0)
    B, L, S, E, H = 3, 5, 4, 8, 2
    ref = nn.MultiheadAttention(E, H, batch_first=batch_first, kdim=6, vdim=7)
    ours = MultiheadAttention.from_torch(ref)
    q, k, v = torch.randn(B, L, E), torch.randn(B, S, 6), torch.randn(B, S, 7)
    if not batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    pad = torch.tensor([[False, False, True, True], [False] * 4, [False, True, False, False]])
    blocked = torch.rand(L, S) > 0.7
    blocked[:, 0] = False
    for kw in (
        {},
        {"key_padding_mask": pad},
        {"attn_mask": blocked},
        {"attn_mask": torch.randn(B * H, L, S), "key_padding_mask": pad.float() * -1e4},
        {"need_weights": False, "key_padding_mask": pad},
        {"average_attn_weights": False, "key_padding_mask": pad},
    ):
        (got, got_w), (want, want_w) = ours(q, k, v, **kw), ref(q, k, v, **kw)
        assert torch.allclose(got, want, atol=1e-6), kw
        assert (got_w is None and want_w is None) or torch.allclose(got_w, want_w, atol=1e-6), kw


def test_privopt_attention_in_an_encoder_layer_is_answered_by_ghost_rules_alone():
    torch.manual_seed(0)
    model, (x, y) = _privopt_attention(Attention(encoder=True)), _tokens()
    reference = per_example_grads(model, x, y).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback of the ghost engine, no vmap of torch's kernels
        got = get_engine("ghost").clipped_sum(model, _loss, x, y, clip=1e10)
    assert torch.allclose(got.total, reference, atol=1e-5)
    model.eval()  # torch's fast path (eval) must not be taken: it would read weights this module does not have
    assert isinstance(model.att.self_attn, MultiheadAttention) and model(x).shape == (8, 2)


def test_dropout_with_ghost_rules_gives_the_gradients_of_the_forward_that_drew_the_masks():
    torch.manual_seed(0)
    model = _privopt_attention(Attention(encoder=True))
    model.att.dropout.p = model.att.dropout1.p = model.att.dropout2.p = model.att.self_attn.dropout = 0.3
    x, y = _tokens(n=32)  # 32 rows: the engines pad no rows, so the forward's masks are a plain forward's
    got, losses, per = ghost_and_seeded_forward(model, x, y)
    assert torch.equal(got.losses, losses)  # the same masks
    assert torch.allclose(got.total, per.sum(0), atol=1e-5)
    assert torch.allclose(got.norms.float(), per.norm(dim=1), rtol=1e-5)


def test_the_fallback_warning_for_torch_attention_names_the_replacement():
    model, (x, y) = Attention(encoder=False), _tokens()
    with pytest.warns(PrivoptRuntimeWarning, match=r"nn.MultiheadAttention .*privopt.models.attention"):
        get_engine("ghost").clipped_sum(model, _loss, x, y, clip=1.0)
