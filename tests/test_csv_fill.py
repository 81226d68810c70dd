"""``fill`` of a numeric ``csv`` column: its empty (or NaN) cells take a public constant declared in the
config, record by record, instead of dropping the record (``missing: drop``) or refusing the file; new
rows to score are filled the same way. Nothing about the file (how many cells were empty) is published."""

import numpy as np
import pytest

from csv_helpers import train_csv_logreg
from privopt.data import load_dataset
from privopt.errors import ConfigError

LABEL = {"column": "income", "classes": ["low", "high"]}
HOURS = {"range": [0, 100], "fill": 40}


def _load(tmp_path, body: str, **features):
    path = tmp_path / "train.csv"
    path.write_text("hours,gain,income\n" + body)
    feats = {"hours": HOURS, **features}
    return load_dataset("csv", path=str(path), test_path=str(path), label=LABEL, features=feats, scaling="none")


def test_empty_and_nan_cells_of_a_numeric_column_take_its_declared_fill(tmp_path):
    ds = _load(tmp_path, "10,0,low\n,0,high\nnan,0,low\n80,0,high\n")
    assert ds.n_train == 4 and ds.x_train[:, 0].tolist() == [10.0, 40.0, 40.0, 80.0]
    steps = ds.public_meta["preprocessing"]
    assert any("the declared public constant (per column: fill) in hours = 40" in s for s in steps)
    assert "rows_dropped_missing" in ds.private_stats  # the count stays a private statistic
    assert ds.private_stats["rows_dropped_missing"] == {"train": 0, "test": 0}
    same = _load(tmp_path, "10,0,low\n20,0,high\n30,0,low\n80,0,high\n")
    assert same.public_meta == ds.public_meta  # whether a cell was empty changes no public fact


def test_fill_goes_through_the_transform_and_another_column_still_follows_missing(tmp_path):
    gain = {"range": [0, 11.6], "transform": "log1p", "fill": 0}
    ds = _load(tmp_path, ",,low\n5,99,high\n", gain=gain)
    assert ds.x_train.numpy() == pytest.approx(np.array([[40.0, 0.0], [5.0, np.log1p(99)]]))
    path = tmp_path / "train.csv"
    path.write_text("hours,gain,income\n,1,low\n5,,high\n7,2,low\n")
    kept = load_dataset(
        "csv", path=str(path), test_path=str(path), label=LABEL, missing="drop", scaling="none",
        features={"hours": HOURS, "gain": {"range": [0, 11.6]}},
    )  # fmt: skip
    assert kept.x_train[:, 0].tolist() == [40.0, 7.0]  # the empty gain is dropped, the empty hours filled


@pytest.mark.parametrize(
    ("feature", "problem"),
    [
        ({"categories": ["a", "b"], "fill": 1}, "fill applies to numeric columns"),
        ({"range": [0, 1], "fill": "median"}, "fill must be a finite number"),
        ({"range": [0, 1], "fill": float("nan")}, "fill must be a finite number"),
        ({"range": [0, 3], "transform": "sqrt", "fill": -1}, "fill must be >= 0"),
        ({"range": [0, 1], "missing": "category"}, "a numeric column's empty cells take fill"),
        ({"range": [0, 1], "fil": 0}, "did you mean 'fill'"),
    ],
)
def test_a_bad_fill_is_refused_before_the_file_is_read(tmp_path, feature, problem):
    with pytest.raises(ConfigError, match=problem):
        load_dataset("csv", path=str(tmp_path / "absent.csv"), label=LABEL, features={"hours": feature})


def test_predict_fills_new_rows_as_training_did(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("train.csv", 200), ("test.csv", 60)):
        rows = ["hours,income"]
        for _ in range(n):
            hours = "" if rng.random() < 0.1 else str(int(rng.integers(1, 99)))
            rows.append(f"{hours},{'high' if hours and int(hours) > 45 else 'low'}")
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    params = {"path": "train.csv", "test_path": "test.csv", "label": LABEL, "features": {"hours": HOURS}}
    run = train_csv_logreg(tmp_path, params)
    assert run.record["dataset"]["n_train"] == 200  # no record dropped
    (tmp_path / "new.csv").write_text("hours,income\n,low\n60,high\n")
    x, y = run.read_csv(tmp_path / "new.csv")
    assert x[:, 0].tolist() == pytest.approx([0.4, 0.6]) and y.tolist() == [0, 1]
    (tmp_path / "one.csv").write_text('hours\n""\n\n60\n')  # one column: "" is an empty cell, not a blank line
    assert run.read_csv(tmp_path / "one.csv")[0][:, 0].tolist() == pytest.approx([0.4, 0.6])


def test_lines_of_empty_fields_are_skipped_in_training_files(tmp_path):
    """A spreadsheet export's trailing ``,,`` rows hold no record to train on (no label): skipped, as
    blank lines are, whatever ``missing`` says (privopt predict keeps them: tests/test_predict.py)."""
    ds = _load(tmp_path, "10,0,low\n,,\n , ,\n80,0,high\n,,\n")
    assert ds.n_train == 2 and ds.x_train[:, 0].tolist() == [10.0, 80.0]
