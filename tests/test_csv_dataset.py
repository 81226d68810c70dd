"""The ``csv`` dataset: a user's CSV file trained on from the command line, encoded with the public
schema of the config (declared classes, groups, ranges and categories; nothing read from the file),
and every kind of bad input refused before anything is written, without quoting a cell."""

import json
import math

import numpy as np
import pytest

from privopt.cli import main
from privopt.config import load_config
from privopt.data import load_dataset
from privopt.errors import DEBUG_ENV, ConfigError, DataError

HEADER = "age,job,sex,income\n"
LABEL = {"column": "income", "classes": ["<=50K", ">50K"]}
GROUP = {"column": "sex", "groups": ["Female", "Male"]}
FEATURES = {"age": {"range": [17, 90]}, "job": {"categories": ["Private", "Gov"]}}
YAML = """\
algorithm: dp-sgd
algorithm_params: {{epochs: 1, batch_size: 40, lr: 0.5, clip: 1.0}}
model: logreg
privacy: {{epsilon: 1.0, delta: 1.0e-5}}
plots: false
dataset: csv
dataset_params:
  path: {train}
  test_path: {test}
  label: {{column: income, classes: ["<=50K", ">50K"]}}
  group: {{column: sex, groups: [Female, Male]}}
  features:
    age: {{range: [17, 90]}}
    job: {{categories: [Private, Gov], unknown: other}}
    sex: {{categories: [Female, Male]}}
"""


def _rows(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        age = int(rng.integers(17, 91))
        job, sex = rng.choice(["Private", "Gov", "Self-emp"]), rng.choice(["Female", "Male"])
        out.append(f"{age},{job},{sex},{'>50K' if age > 45 else '<=50K'}\n")
    return "".join(out)


def _write(tmp_path, body: str, name: str = "train.csv"):
    path = tmp_path / name
    path.write_text(body)
    return path


def _load(path, **params):
    params = {"label": LABEL, "features": FEATURES, **params}
    return load_dataset("csv", path=str(path), **params)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- end to end


def test_privopt_train_on_a_csv_file_writes_a_record_with_metrics_groups_and_a_finite_epsilon(capsys, tmp_path):
    train, test = _write(tmp_path, HEADER + _rows(160, 0)), _write(tmp_path, HEADER + _rows(60, 1), "test.csv")
    config = _write(tmp_path, YAML.format(train=train, test=test), "run.yaml")
    code, _, err = run(capsys, "train", "--config", str(config), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 0, err
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["status"] == "finished" and record["dataset"]["n_train"] == 160
    eps = record["privacy"]["epsilon_spent"]
    assert math.isfinite(eps) and 0 < eps <= 1.0
    metrics = record["metrics"]
    assert 0 <= metrics["test_accuracy"] <= 1 and metrics["test_records"] == 60
    # the group column gives the group metrics (worst group and each declared group)
    assert {"test_worst_group_accuracy", "test_group0_accuracy", "test_group1_accuracy"} <= set(metrics)


def test_a_json_config_declares_the_same_dataset(tmp_path):
    train = _write(tmp_path, HEADER + _rows(30, 0))
    features = {**FEATURES, "job": {"categories": ["Private", "Gov"], "unknown": "other"}}
    params = {"path": str(train), "label": LABEL, "group": GROUP, "features": features, "test_fraction": 0.3}
    config = _write(tmp_path, json.dumps({"dataset": "csv", "dataset_params": params}), "run.json")
    cfg = load_config(config)
    ds = load_dataset(cfg.dataset, seed=cfg.seed, **cfg.dataset_params)
    assert ds.n_train + len(ds.y_test) == 30 and ds.group_names == ["Female", "Male"]
    assert ds.public_meta["feature_names"] == ["age", "job=Private", "job=Gov", "job=<other>"]
    assert "keyed hash" in ds.public_meta["test_split"]  # a per-record split with the public seed
    again = load_dataset(cfg.dataset, seed=cfg.seed, **cfg.dataset_params)
    assert again.y_test.tolist() == ds.y_test.tolist()


# --------------------------------------------------------------------------- public encoding


def test_features_use_only_the_declared_constants(tmp_path):
    rows = ["20,Private,Male,<=50K\n", "55,Gov,Female,>50K\n", "90,Gov,Male,>50K\n"]
    test = _write(tmp_path, HEADER + rows[0], "test.csv")
    ds = _load(_write(tmp_path, HEADER + "".join(rows)), test_path=str(test))
    age = ds.x_train[:, 0].tolist()
    assert age == pytest.approx([(20 - 17) / 73, (55 - 17) / 73, 1.0])
    assert ds.x_train[:, 1:].tolist() == [[1, 0], [0, 1], [0, 1]]
    # one record's value moved far outside the range: it is clipped; no other record moves
    moved = _load(_write(tmp_path, HEADER + rows[0] + "9000,Private,Female,<=50K\n" + rows[2]), test_path=str(test))
    assert moved.x_train[1].tolist() == [1.0, 1.0, 0.0]
    assert moved.x_train[[0, 2]].tolist() == ds.x_train[[0, 2]].tolist()
    assert moved.public_meta["scaling"] == ds.public_meta["scaling"]  # public facts: the config's, not the file's


def test_unknown_category_goes_to_the_other_slot_when_declared(tmp_path):
    path = _write(tmp_path, HEADER + "30,Self-emp,Male,<=50K\n40,Gov,Female,>50K\n")
    features = {"age": {"range": [17, 90]}, "job": {"categories": ["Private", "Gov"], "unknown": "other"}}
    ds = _load(path, features=features, test_path=str(path))
    assert ds.public_meta["feature_names"] == ["age", "job=Private", "job=Gov", "job=<other>"]
    assert ds.x_train[:, 1:].tolist() == [[0, 0, 1], [0, 1, 0]]


def test_missing_drop_skips_the_records_with_an_empty_cell(tmp_path):
    path = _write(tmp_path, HEADER + "30,Gov,Male,<=50K\n,Gov,Male,>50K\n41,,Male,>50K\n50,Gov,Male,>50K\n")
    ds = _load(path, missing="drop", test_path=str(path))
    assert ds.n_train == 2 and ds.private_stats["rows_dropped_missing"]["train"] == 2


# --------------------------------------------------------------------------- bad input

GOOD = "30,Gov,Male,<=50K\n"
DATA_ERRORS = [  # (file body, expected message after the path, the secret value that must not be quoted)
    (HEADER + GOOD + "41,Gov,Male,rich\n", "label column 'income' of some record is not one of the declared", "rich"),
    (HEADER + GOOD + "41,Pirate,Male,>50K\n", "column 'job' of some record is not one of its declared", "Pirate"),
    (HEADER + GOOD + "forty-one,Gov,Male,>50K\n", "column 'age' of some record is not a number", "forty"),
    (HEADER + GOOD + "nan,Gov,Male,>50K\n", "column 'age' of some record is missing", "nan"),
    (HEADER + GOOD + "41,,Male,>50K\n", "column 'job' of some record is missing", None),
    (HEADER + GOOD + "inf,Gov,Male,>50K\n", "column 'age' of some record is not finite", None),
    (HEADER + GOOD + "41,Gov,Male\n", "some line does not have 4 fields", "3"),
    (HEADER + GOOD + '41,"Gov,Male,>50K\n' + GOOD, "some line is not valid CSV (an unclosed quote", "Gov"),
    ("", "the file is empty", None),
    (HEADER, "no records after the header line", None),
    ("agee,job,sex,income\n" + GOOD, "column 'age' is not in the header line (the first line must name", "agee"),
    (GOOD + GOOD, "column 'income' is not in the header line", "Gov"),  # no header: its first line is a record
]  # fmt: skip


@pytest.mark.parametrize("body, problem, secret", DATA_ERRORS)
def test_bad_data_is_refused_naming_the_column_never_the_value(tmp_path, monkeypatch, body, problem, secret):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    path = _write(tmp_path, body)
    with pytest.raises(DataError) as err:
        _load(path, test_path=str(path))
    said = str(err.value)
    assert said.startswith(f"{path}: {problem}"), said
    assert secret is None or secret not in said[len(str(path)) :]
    assert "line 3" not in said


def test_under_debug_the_error_names_the_file_line_and_the_header(tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    path = _write(tmp_path, HEADER + "\n" + GOOD + "41,Pirate,Male,>50K\n")  # line 2 blank
    with pytest.raises(DataError, match="column 'job' of line 4 is not one of its declared categories"):
        _load(path, test_path=str(path))
    path = _write(tmp_path, "agee,job,sex,income\n" + GOOD)
    with pytest.raises(DataError, match=r"'age' is not in the header line \(did you mean 'agee'\?\); the header line"):
        _load(path, test_path=str(path))


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"csv file .*nope\.csv .*does not exist"):
        _load(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match="needs dataset_params.path"):
        load_dataset("csv", label=LABEL, features=FEATURES)


CONFIG_ERRORS = [  # (dataset_params beyond path/label/features, expected message)
    ({"features": {"age": {"range": [90, 17]}}}, "features.age.range needs lower < upper, got [90, 17]"),
    ({"features": {"age": {"range": [5, 5]}}}, "needs lower < upper"),
    ({"test_fracton": 0.2}, "unknown option(s) ['test_fracton'] for dataset 'csv' (did you mean 'test_fraction'?)"),
    ({"features": {"age": {"rnage": [17, 90]}}}, "key 'rnage' in dataset_params.features.age (did you mean 'range'?)"),
    ({"label": {"colum": "income", "classes": ["a", "b"]}}, "'colum' in dataset_params.label (did you mean 'column'?)"),
    ({"label": {"column": "income", "classes": ["a"]}}, "label.classes must be a list of at least 2 names"),
    ({"features": {"income": {"categories": ["a"]}}}, "'income' is the label column"),
    ({"missing": "ignore"}, "missing must be one of error, drop"),
    ({"features": {"job": {"categories": ["a"], "unknown": "skip"}}}, "unknown must be one of error, other"),
    ({"test_fraction": 0.2, "test_path": "x.csv"}, "give dataset_params.test_path or test_fraction, not both"),
]  # fmt: skip


@pytest.mark.parametrize("params, problem", CONFIG_ERRORS)
def test_a_bad_schema_is_refused_before_the_file_is_read(tmp_path, params, problem):
    path = tmp_path / "never-read.csv"  # does not exist: the schema is checked first
    with pytest.raises(ConfigError) as err:
        _load(path, **params)
    assert problem in str(err.value)


def test_the_cli_refuses_bad_data_in_one_line_and_writes_nothing(capsys, tmp_path):
    train = _write(tmp_path, HEADER + GOOD + "41,Gov,Male,rich\n")
    config = _write(tmp_path, YAML.format(train=train, test=train), "run.yaml")
    out = tmp_path / "run"
    code, _, err = run(capsys, "train", "--config", str(config), "--out", str(out), "--quiet")
    assert code == 2 and err.startswith("privopt: error: ") and len(err.strip().splitlines()) == 1
    assert "label column 'income'" in err and "rich" not in err
    assert not out.exists()
    code, _, err = run(capsys, "train", "--config", str(config), "--set", "dataset={name: csv}", "--out", str(out))
    assert code == 2 and "put its options under dataset_params" in err and not out.exists()
