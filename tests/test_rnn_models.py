"""privopt.models.rnn: GRU, LSTM and RNN return what torch's layers return, and both engines give
per-example gradients equal to an autograd loop, the ghost engine on its Linear rules alone."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import privopt
from privopt.data import Dataset
from privopt.errors import PrivoptRuntimeWarning
from privopt.grads import get_engine
from privopt.models.rnn import GRU, LSTM, RNN
from seq_helpers import ce_loss as _loss
from seq_helpers import ghost_and_seeded_forward, padded_tokens, per_example_grads

V, T, D = 30, 5, 6


def _tokens(n=8, seed=0):
    return padded_tokens(n, seed, vocab=V, length=T)


KINDS = {"gru": (nn.GRU, GRU), "lstm": (nn.LSTM, LSTM), "rnn": (nn.RNN, RNN)}


def _state(kind, n, *shape):
    h = torch.randn(n, *shape)
    return (h, torch.randn(n, *shape)) if kind == "lstm" else h


def _flat(result):
    out, last = result
    return [out, *(last if isinstance(last, tuple) else (last,))]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True), (2, False)])
@pytest.mark.parametrize("batch_first", [True, False])
def test_outputs_equal_torch(kind, layers, bidirectional, batch_first):
    torch.manual_seed(0)
    ref = KINDS[kind][0](4, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    ours = KINDS[kind][1].from_torch(ref)
    x = torch.randn(3, 7, 4) if batch_first else torch.randn(7, 3, 4)
    n = layers * (2 if bidirectional else 1)
    for hx in (None, _state(kind, n, 3, 5)):
        got, want = _flat(ours(x, hx)), _flat(ref(x, hx))
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    unbatched = x[0] if batch_first else x[:, 0]  # [T, in], state [n, hidden]
    got, want = _flat(ours(unbatched, _state(kind, n, 5))), _flat(ref(unbatched, _state(kind, n, 5)))
    assert [g.shape for g in got] == [w.shape for w in want]


def test_options_and_eval_mode_follow_torch():
    torch.manual_seed(0)
    for ref in (nn.RNN(4, 5, nonlinearity="relu", bias=False), nn.GRU(4, 5, 2, dropout=0.5)):
        ours = (RNN if isinstance(ref, nn.RNN) else GRU).from_torch(ref)
        ref.eval(), ours.eval()  # dropout between layers: off in eval mode, as in torch
        x = torch.randn(6, 2, 4)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(_flat(ours(x)), _flat(ref(x))))
    assert len(list(RNN(4, 5, bias=False).parameters())) == 2


def test_bad_arguments_fail_early_with_a_clear_error():
    with pytest.raises(ValueError, match="proj_size"):
        LSTM(4, 5, proj_size=2)
    with pytest.raises(ValueError, match="proj_size"):
        LSTM.from_torch(nn.LSTM(4, 5, proj_size=2))
    with pytest.raises(TypeError, match=r"GRU.from_torch needs an nn.GRU, got LSTM"):
        GRU.from_torch(nn.LSTM(4, 5))
    with pytest.raises(ValueError, match="nonlinearity"):
        RNN(4, 5, nonlinearity="sigmoid")
    gru, lstm = GRU(4, 5, batch_first=True), LSTM(4, 5)
    packed = pack_padded_sequence(torch.randn(2, 3, 4), torch.tensor([3, 2]), batch_first=True)
    with pytest.raises(ValueError, match="packed sequences.*mask the outputs"):
        gru(packed)
    with pytest.raises(ValueError, match=r"initial state must have shape \(1, 2, 5\)"):
        gru(torch.randn(2, 3, 4), torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match=r"a tuple \(h0, c0\)"):
        lstm(torch.randn(3, 2, 4), torch.zeros(1, 2, 5))
    with pytest.raises(ValueError, match=r"input must be"):
        gru(torch.randn(2, 3, 7))


@pytest.mark.parametrize("kind", list(KINDS))
def test_dropout_with_one_layer_warns_as_torch_does(kind):
    """torch warns that dropout between layers does nothing with one layer; so do the drop-ins."""
    with pytest.warns(UserWarning, match=r"dropout=0.5 .*num_layers=1"):
        KINDS[kind][0](4, 5, dropout=0.5)
    with pytest.warns(UserWarning, match=rf"{KINDS[kind][1].__name__}: dropout=0.5 has no effect with num_layers=1"):
        KINDS[kind][1](4, 5, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KINDS[kind][1](4, 5, num_layers=2, dropout=0.5), KINDS[kind][1](4, 5, dropout=0.0)


class Classifier(nn.Module):
    def __init__(self, kind, h0, **kw):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D, padding_idx=0), nn.Linear(D, 2)
        self.rnn, self.h0 = KINDS[kind][1](D, D, **kw), h0

    def forward(self, x):
        e, hx = self.emb(x), None
        if self.h0:  # a non-zero initial state, batched like the input
            h = (e[:, 0, :1] * 0 + torch.arange(D) / D).expand(
                self.rnn.num_layers * (1 + self.rnn.bidirectional), -1, -1
            )
            hx = (h, h.cos()) if isinstance(self.rnn, LSTM) else h
        out = self.rnn(e if self.rnn.batch_first else e.transpose(0, 1), hx)[0]
        out = out if self.rnn.batch_first else out.transpose(0, 1)
        keep = (x != 0).to(out.dtype).unsqueeze(-1)  # mask the padded positions instead of packing
        return self.head(((out[..., :D] + out[..., D:].sum(-1, keepdim=True)) * keep).sum(1) / keep.sum(1))


CASES = [
    ("gru", True, {"batch_first": True}),
    ("gru", False, {"num_layers": 2, "bidirectional": True}),
    ("lstm", True, {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("lstm", False, {}),
    ("rnn", False, {"num_layers": 2, "batch_first": True}),
]


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
@pytest.mark.parametrize("kind,h0,kw", CASES)
def test_per_example_gradients_equal_an_autograd_loop(kind, h0, kw, engine):
    torch.manual_seed(0)
    model, (x, y) = Classifier(kind, h0, **kw), _tokens()
    per = per_example_grads(model, x, y)
    clip = float(per.norm(dim=1).median())  # binds for half of the examples
    want = (per * (clip / per.norm(dim=1, keepdim=True)).clamp(max=1)).sum(0)
    with warnings.catch_warnings():
        if engine == "ghost":
            warnings.simplefilter("error")  # no fallback to the vmap engine or rule
        unclipped = get_engine(engine).clipped_sum(model, _loss, x, y, clip=1e10)
        clipped = get_engine(engine).clipped_sum(model, _loss, x, y, clip=clip)
    assert torch.allclose(unclipped.total, per.sum(0), atol=1e-5)
    assert torch.allclose(clipped.norms.float(), per.norm(dim=1), rtol=1e-4)
    assert torch.allclose(clipped.total, want, atol=1e-5)


def test_dropout_between_layers_gives_the_gradients_of_the_forward_that_drew_the_masks():
    torch.manual_seed(0)
    model, (x, y) = Classifier("gru", True, num_layers=2, dropout=0.4, batch_first=True), _tokens(n=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, losses, per = ghost_and_seeded_forward(model, x, y)
    assert torch.equal(got.losses, losses)  # the same masks
    assert torch.allclose(got.total, per.sum(0), atol=1e-5)


def test_fit_trains_a_model_with_the_gru_drop_in_on_ghost_rules():
    """privopt.fit end to end (calibration, clipped noisy steps, ledger, evaluation) on token ids: the
    training loss falls, within the budget, with no fallback of the ghost engine to vmap."""
    x, y = padded_tokens(500, 1, vocab=V, length=T)
    data = Dataset.from_tensors(x[:400], y[:400], x_test=x[400:], y_test=y[400:], num_classes=2)
    torch.manual_seed(0)
    model = Classifier("gru", False, batch_first=True)
    with torch.no_grad():
        before = _loss(model(x[:400]), y[:400]).mean().item()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivoptRuntimeWarning)  # e.g. a fallback to the vmap rule
        record = privopt.fit(
            model=model, dataset=data, epsilon=8.0, delta=1e-4, accountant="rdp", epochs=2, batch_size=100,
            lr=2.0, insecure_seed=0,
        )  # fmt: skip
    with torch.no_grad():
        after = _loss(model(x[:400]), y[:400]).mean().item()
    assert record["status"] == "finished" and record["engine"] == "ghost"
    assert 0 < record["privacy"]["epsilon_spent"] <= 8.0
    assert after < before - 0.03, (before, after)  # 0.70 -> 0.61-0.63 for insecure seeds 0-3
