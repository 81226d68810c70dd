"""A resume must refuse another architecture even when its parameters have the same names and
shapes: the resumed run replays the interrupted run's noise, which must fall on the same sums."""

import pytest
import torch
from torch import nn

from _run_helpers import cfg, read_record
from privopt.errors import ModelError
from privopt.training import train


def _net(act):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), act(), nn.Linear(8, 10))


@pytest.mark.parametrize(
    "other",
    [lambda: _net(nn.Tanh), lambda: nn.Sequential(*list(_net(nn.ReLU))[:2], nn.Dropout(0.5), *list(_net(nn.ReLU))[3:])],
)
def test_resume_with_another_activation_or_layer_of_the_same_shapes_is_refused(tmp_path, other):
    run = tmp_path / "run"
    train(
        cfg(insecure_seed=0, algorithm_params={"epochs": 1}),
        out_dir=run,
        progress=False,
        max_steps=2,
        model=_net(nn.ReLU),
    )
    before = (run / "record.json").read_bytes()
    with pytest.raises(ModelError, match="architecture differs"):
        train(None, out_dir=run, resume=True, progress=False, model=other())
    assert (run / "record.json").read_bytes() == before  # refused before writing anything
    done = train(None, out_dir=run, resume=True, progress=False, model=_net(nn.ReLU))
    assert done["status"] == "finished" and read_record(run)["status"] == "finished"
