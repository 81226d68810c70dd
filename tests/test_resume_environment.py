"""A resume continues the same run beyond its data, model and code: the module-level values the
user's code reads (or it refuses)."""

import pytest
import torch
from torch import nn

from _run_helpers import cfg
from privopt.errors import ModelError
from privopt.training import train
from privopt.training.fingerprints import loss_fingerprint, model_fingerprint


def _paused(run, **kw):
    return train(cfg(insecure_seed=0, **kw.pop("over", {})), out_dir=run, progress=False, max_steps=3, **kw)


def _resume(run, **kw):
    return train(None, out_dir=run, resume=True, progress=False, **kw)


# ------------------------------------------------------------------------- module-level values
SCALE = 1.0


def _scaled(x):
    return x * SCALE


class _Global(nn.Module):
    """A model whose forward reads a module-level value through a module-level function."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        return _scaled(self.lin(x.flatten(1)))


def _loss(out, y):
    return nn.functional.cross_entropy(out * SCALE, y, reduction="none")


def test_fingerprints_cover_the_module_level_values_user_code_reads(monkeypatch):
    model, loss = model_fingerprint(_Global()), loss_fingerprint(_loss)
    monkeypatch.setattr(f"{__name__}.SCALE", 3.0)  # e.g. edited in the script between two processes
    assert model_fingerprint(_Global()) != model and loss_fingerprint(_loss) != loss
    monkeypatch.setattr(f"{__name__}.SCALE", 1.0)
    assert model_fingerprint(_Global()) == model and loss_fingerprint(_loss) == loss


def test_a_method_replaced_on_the_instance_is_covered():
    a, b = _Global(), _Global()
    a.forward = lambda x: a.lin(x.flatten(1))
    b.forward = lambda x: torch.tanh(b.lin(x.flatten(1)))
    assert len({model_fingerprint(m) for m in (_Global(), a, b)}) == 3


def test_a_resume_refuses_a_model_or_loss_whose_module_level_value_changed(tmp_path, monkeypatch):
    run = tmp_path / "r"
    _paused(run, model=_Global(), loss=_loss)
    monkeypatch.setattr(f"{__name__}.SCALE", 3.0)
    with pytest.raises(ModelError, match="the model's architecture differs"):
        _resume(run, model=_Global(), loss=_loss)
    monkeypatch.setattr(f"{__name__}.SCALE", 1.0)
    assert _resume(run, model=_Global(), loss=_loss)["status"] == "finished"
