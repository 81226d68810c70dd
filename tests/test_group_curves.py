"""Group metrics at every evaluation, not only at the end: a run on data with groups has its
worst-group accuracy in every metrics.csv row and in curves.png."""

import csv

import pytest
import torch
from torch import nn

from privopt.config import RunConfig
from privopt.data import Dataset
from privopt.training import train


def _grouped(n=600, n_test=400):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n + n_test, 3, generator=g)
    groups = (torch.rand(n + n_test, generator=g) < 0.25).long()
    y = torch.where(groups == 1, x[:, 0] < 0.5, x[:, 0] > 0.5).long()
    return Dataset.from_tensors(
        x[:n], y[:n], x_test=x[n:], y_test=y[n:], groups=groups[:n], groups_test=groups[n:],
        num_classes=2, group_names=["big", "small"], name="grouped",
    )  # fmt: skip


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("groups") / "run"
    cfg = RunConfig.from_dict(
        {
            "algorithm": "dp-sgd",
            "algorithm_params": {"epochs": 2, "batch_size": 100, "lr": 0.5},
            "privacy": {"epsilon": 2.0, "delta": 1e-4, "accountant": "rdp"},
            "eval_every": 3,
            "eval_subsample": 150,  # fewer than the 400 test records: the evaluations before the last subsample
        }
    )
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    record = train(cfg, out_dir=out, progress=False, dataset=_grouped(), model=model)
    with open(out / "metrics.csv") as f:
        return record, list(csv.DictReader(f)), out


def test_every_evaluation_row_has_the_group_accuracies(grouped_run):
    record, rows, _ = grouped_run
    assert len(rows) >= 3
    for row in rows:
        per_group = [float(row["test_group0_accuracy"]), float(row["test_group1_accuracy"])]
        assert float(row["test_worst_group_accuracy"]) == min(per_group)
        assert float(row["test_mean_group_accuracy"]) == pytest.approx(sum(per_group) / 2)
    # the evaluations before the last read the public subsample, the last one the whole split
    assert [int(r["test_records"]) for r in rows[:-1]] == [150] * (len(rows) - 1)
    assert int(rows[-1]["test_records"]) == 400
    assert "test_worst_group_accuracy" in record["metrics"]


def test_the_group_accuracies_of_a_subsample_are_its_own(grouped_run):
    # Accuracy on 150 records is a multiple of 1/n_g for the subsample's n_g records of group g:
    # computed on the whole split's 400 it would (almost surely) not be.
    _, rows, _ = grouped_run
    data = _grouped()
    idx = torch.linspace(0, 399, 150).round().long()
    sizes = [int((data.g_test[idx] == k).sum()) for k in (0, 1)]
    for row in rows[:-1]:
        for k, n_k in enumerate(sizes):
            acc = float(row[f"test_group{k}_accuracy"])
            assert acc * n_k == pytest.approx(round(acc * n_k), abs=1e-6)


def test_the_curves_show_the_worst_group(grouped_run, monkeypatch):
    from privopt import plots

    _, rows, out = grouped_run
    assert (out / "curves.png").stat().st_size > 0
    labels = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: labels.extend(
        line.get_label() for ax in fig.axes for line in ax.get_lines()
    ))  # fmt: skip
    history = [{k: float(v) for k, v in r.items() if v != ""} for r in rows]
    plots.plot_training_curves(out / "again.png", history)
    assert {"all records", "worst group"} <= set(labels)
