"""Two per-column options of the ``csv`` schema: a fixed per-record ``transform`` of a numeric column
(its ``range`` in the transformed units) and ``missing: category`` (empty cells of a categorical
column get a ``<missing>`` slot, overriding the dataset-wide ``missing`` for that column). Both encode
each record from the config alone, refuse bad cells without quoting them, and work in ``predict``."""

import math

import numpy as np
import pytest

from csv_helpers import train_csv_logreg
from privopt.data import load_dataset
from privopt.errors import DEBUG_ENV, ConfigError, DataError

HEADER = "gain,job,income\n"
LABEL = {"column": "income", "classes": ["low", "high"]}
GAIN = {"range": [0, 11.6], "transform": "log1p"}
JOB = {"categories": ["Private", "Gov"], "missing": "category"}


def _load(tmp_path, body: str, **params):
    path = tmp_path / "train.csv"
    path.write_text(HEADER + body)
    params = {"label": LABEL, "features": {"gain": GAIN, "job": JOB}, "test_path": str(path), **params}
    return load_dataset("csv", path=str(path), **params)


def test_the_transform_is_applied_per_record_before_the_range_in_its_units(tmp_path):
    ds = _load(tmp_path, "0,Gov,low\n99999,Gov,high\n1e9,Gov,high\n3,Gov,low\n", scaling="none")
    assert ds.x_train[:, 0].tolist() == pytest.approx([0.0, math.log1p(99999), math.log1p(1e9), math.log1p(3)])
    scaled = _load(tmp_path, "0,Gov,low\n99999,Gov,high\n1e9,Gov,high\n3,Gov,low\n")
    # the range [0, 11.6] is in log1p units: log1p(99999) = 11.51 is inside it, log1p(1e9) = 20.7 clipped
    assert scaled.x_train[:, 0].tolist() == pytest.approx([0.0, math.log1p(99999) / 11.6, 1.0, math.log1p(3) / 11.6])
    assert scaled.public_meta["scaling"]["constants"]["upper"][0] == pytest.approx(11.6)
    assert any("log1p(gain)" in step for step in scaled.public_meta["preprocessing"])
    root = _load(tmp_path, "4,Gov,low\n0,Gov,high\n", features={"gain": {"range": [0, 3], "transform": "sqrt"}})
    assert root.x_train[:, 0].tolist() == pytest.approx([2 / 3, 0.0])


@pytest.mark.parametrize("transform, cell", [("log1p", "-0.5"), ("sqrt", "-12345")])
def test_a_negative_value_under_a_transform_is_refused_without_quoting_it(tmp_path, monkeypatch, transform, cell):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    features = {"gain": {"range": [0, 11.6], "transform": transform}, "job": JOB}
    with pytest.raises(DataError) as err:
        _load(tmp_path, f"3,Gov,low\n{cell},Gov,high\n", features=features)
    said = str(err.value).split(": ", 1)[1]
    assert said.startswith(f"column 'gain' of some record is negative; its transform {transform}"), said
    assert cell.lstrip("-") not in said and "line" not in said
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(DataError, match="column 'gain' of line 3 is negative"):
        _load(tmp_path, f"3,Gov,low\n{cell},Gov,high\n", features=features)


SCHEMA_ERRORS = [  # (features, expected message)
    ({"gain": {"range": [0, 11.6], "transform": "log1pp"}},
     "features.gain.transform must be one of identity, log1p, sqrt, got 'log1pp' (did you mean 'log1p'?)"),
    ({"gain": {"range": [11.6, 0], "transform": "log1p"}},
     "features.gain.range needs lower < upper (in log1p units: transform: log1p), got [11.6, 0]"),
    ({"gain": {"range": [0, 1], "trasform": "log1p"}}, "key 'trasform' in dataset_params.features.gain (did you mean"),
    ({"job": {"categories": ["a"], "transform": "log1p"}}, "features.job.transform applies to numeric columns"),
    ({"gain": {"range": [0, 1], "missing": "category"}}, "features.gain.missing applies to categorical columns"),
    ({"job": {"categories": ["a"], "missing": "drop"}},
     "features.job.missing must be category (empty cells get a '<missing>' slot), got 'drop'"),
    ({"job": {"categories": ["a"], "missing": "categroy"}}, "got 'categroy' (did you mean 'category'?)"),
    ({"job": {"categories": ["a", "<missing>"], "missing": "category"}}, "'<missing>' is the slot"),
]  # fmt: skip


@pytest.mark.parametrize("features, problem", SCHEMA_ERRORS)
def test_a_bad_transform_or_missing_option_is_refused_before_the_file_is_read(tmp_path, features, problem):
    with pytest.raises(ConfigError) as err:
        load_dataset("csv", path=str(tmp_path / "never-read.csv"), label=LABEL, features=features)
    assert problem in str(err.value)


def test_empty_cells_of_a_missing_category_column_get_their_own_slot(tmp_path):
    job = {**JOB, "unknown": "other"}
    ds = _load(tmp_path, "1,Gov,low\n2,,high\n3,Self,low\n4,Private,high\n", features={"gain": GAIN, "job": job})
    names = ds.public_meta["feature_names"]
    assert names == ["gain", "job=Private", "job=Gov", "job=<other>", "job=<missing>"]
    assert ds.x_train[:, 1:].tolist() == [[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [1, 0, 0, 0]]
    # the layout is the schema's: the same names for a file with no empty cell at all
    assert _load(tmp_path, "1,Gov,low\n", features={"gain": GAIN, "job": job}).public_meta["feature_names"] == names


def test_a_column_missing_category_overrides_the_dataset_wide_missing_for_that_column_only(tmp_path, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    body = "1,Gov,low\n2,,high\n,Gov,low\n4,Private,high\n"  # an empty job (slotted), an empty gain (not)
    dropped = _load(tmp_path, body, missing="drop")
    assert dropped.n_train == 3 and dropped.private_stats["rows_dropped_missing"]["train"] == 1
    assert dropped.x_train[:, 3].tolist() == [0, 1, 0]  # the empty job kept, in its <missing> slot
    with pytest.raises(DataError, match="column 'gain' of some record is missing"):
        _load(tmp_path, body)  # missing: error (the default) still refuses the empty gain
    ok = _load(tmp_path, "1,Gov,low\n2,,high\n")  # ... but not the empty job
    assert ok.x_train[:, 3].tolist() == [0, 1]
    with pytest.raises(DataError, match="column 'job' of some record is missing"):
        _load(tmp_path, "1,Gov,low\n2,,high\n", features={"gain": GAIN, "job": {"categories": ["Private", "Gov"]}})


def test_predict_encodes_new_rows_with_the_transform_and_the_missing_slot(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("train.csv", 200), ("test.csv", 60)):
        rows = [HEADER.strip()]
        for _ in range(n):
            gain, job = float(rng.choice([0.0, rng.exponential(5000)])), rng.choice(["Private", "Gov", ""])
            rows.append(f"{gain:.1f},{job},{'high' if gain > 2000 else 'low'}")
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    params = {"path": str(tmp_path / "train.csv"), "test_path": str(tmp_path / "test.csv"), "label": LABEL,
              "features": {"gain": GAIN, "job": JOB}}  # fmt: skip
    run = train_csv_logreg(tmp_path, params)
    (tmp_path / "new.csv").write_text("gain,job\n99999,\n0,Gov\n")  # no label; an empty job is its slot
    x, y = run.read_csv(tmp_path / "new.csv")
    assert y is None and x.numpy() == pytest.approx(np.array([[math.log1p(99999) / 11.6, 0, 0, 1], [0, 0, 1, 0]]))
    assert run.predict_proba(x).shape == (2, 2)
    # the test file read for scoring is encoded exactly as training encoded it
    x_test, y_test = run.read_csv(tmp_path / "test.csv")
    ds = load_dataset("csv", **params)
    assert x_test.numpy().tolist() == ds.x_test.tolist() and y_test.tolist() == ds.y_test.tolist()
    (tmp_path / "bad.csv").write_text("gain,job\n-1,Gov\n")
    with pytest.raises(DataError, match="column 'gain' of some record is negative"):
        run.read_csv(tmp_path / "bad.csv")
