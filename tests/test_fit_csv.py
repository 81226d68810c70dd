"""A CSV file of your own through ``privopt.fit`` (``dataset="csv", dataset_params={...}``, as in a run
config), and what ``load_run(...).read_csv`` / ``privopt predict`` say for a run whose CSV dataset was
loaded first and passed in as a ``Dataset`` (its record holds no schema)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import privopt
from privopt.cli import main
from privopt.data import load_dataset
from privopt.errors import ConfigError

SCHEMA = {
    "label": {"column": "income", "classes": ["low", "high"]},
    "group": {"column": "sex", "groups": ["F", "M"]},
    "features": {"age": {"range": [17, 90]}, "sex": {"categories": ["F", "M"]}},
}
TRAIN = {"epochs": 1, "batch_size": 50, "lr": 0.5, "clip": 1.0}


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # dataset_params paths given from Python are read from the current directory
    rng = np.random.default_rng(0)
    for name, n in (("train.csv", 300), ("test.csv", 100)):
        rows = ["age,sex,income"]
        for _ in range(n):
            age = int(rng.integers(17, 91))
            rows.append(f"{age},{rng.choice(['F', 'M'])},{'high' if age > 50 else 'low'}")
        Path(name).write_text("\n".join(rows) + "\n")
    Path("new.csv").write_text("age,sex\n23,F\n67,M\n")
    return tmp_path


def test_fit_takes_dataset_params_and_its_run_predicts_new_csv_rows(files, capsys):
    params = {"path": "train.csv", "test_path": "test.csv", **SCHEMA}
    record = privopt.fit(
        model="logreg", dataset="csv", dataset_params=params, epsilon=2.0, delta=1e-4, out_dir="run", progress=False,
        **TRAIN,
    )  # fmt: skip
    assert record["status"] == "finished" and record["dataset"]["n_train"] == 300
    assert record["config"]["dataset_params"]["path"] == "train.csv"  # as given, relative
    assert "test_worst_group_accuracy" in record["metrics"]
    x, y = privopt.load_run("run").read_csv("new.csv")
    assert tuple(x.shape) == (2, 3) and y is None
    assert main(["predict", "--run", "run", "--input", "new.csv", "--out", "preds.csv", "--quiet"]) == 0
    assert Path("preds.csv").read_text().splitlines()[0] == "prediction,p_low,p_high"


def test_fit_refuses_dataset_params_other_than_those_a_dataset_passed_in_was_loaded_with(files):
    data = load_dataset("csv", path="train.csv", test_path="test.csv", **SCHEMA)
    with pytest.raises(ConfigError, match=r"dataset_params \['path'\] would be ignored"):
        privopt.fit(model="logreg", dataset=data, dataset_params={"path": "test.csv"}, epsilon=2.0, delta=1e-4, **TRAIN)


def test_a_run_on_a_csv_dataset_passed_in_says_why_it_cannot_read_csv_rows(files, capsys):
    data = load_dataset("csv", path="train.csv", test_path="test.csv", **SCHEMA)
    privopt.fit(model="logreg", dataset=data, epsilon=2.0, delta=1e-4, out_dir="run", progress=False, **TRAIN)
    run = privopt.load_run("run")
    with pytest.raises(ConfigError, match="holds no CSV schema") as e:
        run.read_csv("new.csv")
    assert "privopt.fit(dataset_params=...)" in str(e.value)
    capsys.readouterr()
    assert main(["predict", "--run", "run", "--input", "new.csv", "--out", "preds.csv"]) == 2  # not 4: no TypeError
    err = capsys.readouterr().err
    assert "privopt: error: the run's record holds no CSV schema" in err and not Path("preds.csv").exists()
    assert run.predict(data.x_test).shape == (100,)  # its encoded arrays still predict
