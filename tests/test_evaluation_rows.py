"""What an evaluation row and the progress line show: the ε during a run marked as the bound it is
(``eps=≤0.9``; only the last evaluation's ε is the one spent), and the records read counted once."""

import re

import torch
from torch import nn

from privopt.config import RunConfig
from privopt.data import Dataset
from privopt.training import train


def test_the_progress_line_marks_the_running_epsilon_as_a_bound(capsys, tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    data = Dataset.from_tensors(x[:400], y[:400], x_test=x[400:], y_test=y[400:], num_classes=2)
    cfg = RunConfig.from_dict(
        {
            "algorithm": "dp-sgd",
            "algorithm_params": {"epochs": 2, "batch_size": 40, "lr": 0.5},
            "privacy": {"epsilon": 1.0, "delta": 1e-4, "accountant": "rdp"},
            "eval_every": 4,
        }
    )
    capsys.readouterr()
    record = train(cfg, out_dir=tmp_path / "run", progress=True, dataset=data, model=nn.Linear(4, 2))
    shown = re.findall(r"eps=(≤?)([0-9.e-]+)", capsys.readouterr().err)  # stderr is not a terminal: lines
    assert len(shown) >= 3
    assert all(mark == "≤" for mark, _ in shown[:-1])  # while the run is going: the bound
    mark, value = shown[-1]
    assert mark == "" and value == f"{record['privacy']['epsilon_spent']:.3g}"  # at the end: what was spent


def test_an_evaluation_row_counts_its_records_once(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(300, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    data = Dataset.from_tensors(x[:200], y[:200], x_test=x[200:], y_test=y[200:], num_classes=2)
    cfg = RunConfig.from_dict({"algorithm": "sgd", "algorithm_params": {"epochs": 1, "batch_size": 50}})
    record = train(cfg, out_dir=tmp_path / "run", progress=False, dataset=data, model=nn.Linear(4, 2))
    row = record["history"][-1]
    assert row["test_records"] == 100 and isinstance(row["test_records"], int)
    assert not [k for k in row if "num_samples" in k]
