"""The record says when the ghost engine sent queries to the vmap engine (engine_fallback), with
structural reasons only: nothing in it may depend on the secret sampling (batch sizes)."""

import json

import pytest
import torch
from torch import nn

import privopt
from privopt.data import Dataset
from privopt.errors import PrivoptRuntimeWarning
from privopt.grads import get_engine
from privopt.grads.ghost.rules import Unsupported, rule_for

TIED = "parameter 'a.weight' is used outside its module's forward"


class TiedLinear(nn.Module):
    """A Linear layer called, and its weight used again by the parent (as in tests/test_trial38.py)."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.tanh(nn.functional.linear(torch.tanh(self.a(x)), self.a.weight)))


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    return Dataset.from_tensors(x[:400], y[:400], x_test=x[400:], y_test=y[400:], num_classes=2)


def _fit(model, out, insecure_seed):
    torch.manual_seed(0)
    return privopt.fit(
        model=model, dataset=_data(), epsilon=1.0, delta=1e-4, accountant="rdp", epochs=1, batch_size=50,
        insecure_seed=insecure_seed, out_dir=out,
    )  # fmt: skip


def test_a_run_that_fell_back_says_so_with_the_same_content_whatever_its_sampling(tmp_path):
    fields = []
    for seed in (1, 2):  # only the secret sampling (and noise) differ: Poisson batches of other sizes
        with pytest.warns(PrivoptRuntimeWarning, match="used outside its module's forward"):
            rec = _fit(TiedLinear(), tmp_path / str(seed), seed)
        on_disk = json.loads((tmp_path / str(seed) / "record.json").read_text())
        assert on_disk["engine"] == rec["engine"] == "ghost"  # unchanged: a resume compares it
        assert on_disk["engine_fallback"] == rec["engine_fallback"] == {"to": "vmap", "reasons": [TIED]}
        keys = list(on_disk)
        assert keys[keys.index("engine") + 1] == "engine_fallback"
        fields.append(json.dumps(on_disk["engine_fallback"]))
    assert fields[0] == fields[1]


def test_a_run_the_ghost_engine_answered_has_no_fallback_field(tmp_path):
    rec = _fit(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), tmp_path / "r", 1)
    assert rec["engine"] == "ghost" and "engine_fallback" not in rec
    assert "engine_fallback" not in (tmp_path / "r" / "record.json").read_text()


def test_fallback_reasons_are_kept_per_engine_instance():
    ce = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    model, first, second = TiedLinear(), get_engine("ghost"), get_engine("ghost")
    assert first.fallback() is None and get_engine("vmap").fallback() is None
    for b in (20, 37):  # two batch sizes, the second failure from the model's cached failure
        with pytest.warns(PrivoptRuntimeWarning):
            first.clipped_sum(model, ce, torch.rand(b, 4), torch.zeros(b, dtype=torch.long), clip=1.0)
    assert first.fallback() == {"to": "vmap", "reasons": [TIED]}
    assert second.fallback() is None  # another run's engine: its own state
    with pytest.warns(PrivoptRuntimeWarning):
        second.clipped_sum(model, ce, torch.rand(9, 4), torch.zeros(9, dtype=torch.long), clip=1.0)
    assert second.fallback() == first.fallback()


def test_an_unbatched_convolution_input_is_reported_without_its_shape():
    conv = nn.Conv1d(3, 2, 2)
    x = torch.rand(3, 17)  # 17: stands for a size the batch could have had
    with pytest.raises(Unsupported) as err:
        rule_for(conv).fn(conv, x, torch.rand(2, 16))
    assert err.value.reason == "Conv1d: unbatched input"
    assert "17" not in str(err.value) and "3" not in err.value.reason


def test_a_plugins_reason_defaults_to_a_fixed_category():
    assert Unsupported("input of shape (37, 4)").reason == "a layer call the ghost engine cannot attribute to samples"


def test_a_resumed_run_keeps_the_field(tmp_path):
    from privopt.config import RunConfig
    from privopt.training import train

    cfg = RunConfig.from_dict(
        {"algorithm": "dp-sgd", "privacy": {"epsilon": 1.0, "delta": 1e-4, "accountant": "rdp"}, "plots": False,
         "algorithm_params": {"epochs": 1, "batch_size": 50}, "insecure_seed": 3}
    )  # fmt: skip
    model, data, run = TiedLinear(), _data(), tmp_path / "run"
    with pytest.warns(PrivoptRuntimeWarning):
        paused = train(cfg, out_dir=run, progress=False, max_steps=1, model=model, dataset=data)
        done = train(None, out_dir=run, resume=True, progress=False, model=model, dataset=data)
    assert paused["status"] == "paused" and done["status"] == "finished"
    assert paused["engine_fallback"] == done["engine_fallback"] == {"to": "vmap", "reasons": [TIED]}


def test_a_resume_whose_engine_has_not_fallen_back_yet_keeps_the_earlier_reasons():
    from privopt.training.outputs import with_engine_fallback

    earlier = {"to": "vmap", "reasons": [TIED]}
    base = {"algorithm": "dp-sgd", "engine": "ghost", "total_steps": 8}
    rec = with_engine_fallback(base, get_engine("ghost"), earlier)
    assert list(rec) == ["algorithm", "engine", "engine_fallback", "total_steps"] and rec["engine_fallback"] == earlier
    assert with_engine_fallback(base, get_engine("ghost"), None) == base
