"""A resume must refuse data whose group structure changed: the worst-group algorithms size their
draws and weights by the number of groups, so a resume on the same tensors with another number of
groups would replay the run's noise on other statistics."""

import warnings

import pytest
import torch
from torch import nn

from _run_helpers import read_record
from privopt.config import RunConfig
from privopt.data import Dataset
from privopt.errors import DataError
from privopt.training import train


def _dataset(group_names):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 3, generator=g) - 0.5
    y = (x[:, 0] > 0).long()
    grp = torch.randint(0, 3, (500,), generator=g)
    return Dataset.from_tensors(
        x[:400], y[:400], x_test=x[400:], y_test=y[400:], groups=grp[:400], groups_test=grp[400:],
        num_classes=2, group_names=group_names, name="mine",
    )  # fmt: skip


def _model():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def test_resume_with_another_number_of_groups_is_refused(tmp_path):
    cfg = RunConfig.from_dict(
        {"algorithm": "dp-oco-exp3", "algorithm_params": {"batch_size": 10}, "insecure_seed": 3,
         "privacy": {"epsilon": 2.0, "delta": 1e-5}, "checkpoint_every": 1, "eval_every": 1}
    )  # fmt: skip
    run = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, out_dir=run, progress=False, max_steps=2, dataset=_dataset(["a", "b", "c"]), model=_model())
        before = (run / "record.json").read_bytes()
        with pytest.raises(DataError, match="the dataset differs"):
            other = _dataset(["a", "b", "c", "d"])  # the same tensors, another number of groups
            train(None, out_dir=run, resume=True, progress=False, dataset=other, model=_model())
        assert (run / "record.json").read_bytes() == before  # refused before writing anything
        done = train(None, out_dir=run, resume=True, progress=False, dataset=_dataset(["a", "b", "c"]), model=_model())
    assert done["status"] == "finished" and read_record(run)["status"] == "finished"
