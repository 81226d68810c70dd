"""A ``replace_one`` run on a training split selected per record says its ε does not cover the source.

A carved split, ``train_fraction``, a dataset's thinning or a CSV ``missing: drop`` keeps or drops each
record on its own: a record replaced by another may enter or leave the training split, so the two
training splits differ in size, which a replace-one guarantee says nothing about (docs/data.md,
"Selection and the protected unit"). The record says so under ``privacy.not_accounted.selection``,
exactly then: not under ``add_remove``, not without such a step.
"""

from __future__ import annotations

import pytest

from _run_helpers import cfg_dict, read_record
from privopt.config import RunConfig
from privopt.data import load_dataset
from privopt.training import build_run, train
from privopt.training.outputs import privacy_section
from test_csv_dataset import HEADER, LABEL, _rows

FEATURES = {"age": {"range": [17, 90]}, "job": {"categories": ["Private", "Gov"], "unknown": "other"}}


def _dp_gd(neighbouring: str, **over):
    d = cfg_dict(algorithm="dp-gd", privacy={"neighbouring": neighbouring}, plots=False, **over)
    d["algorithm_params"] = {"epochs": 2, "lr": 0.5, "clip": 1.0}
    return RunConfig.from_dict(d)


def _selection_note(c) -> str | None:
    run = build_run(c)
    return privacy_section(c, run.ledger, run.data).get("not_accounted", {}).get("selection")


@pytest.fixture
def csv_files(tmp_path):
    train_file, test_file = tmp_path / "train.csv", tmp_path / "test.csv"
    train_file.write_text(HEADER + _rows(150, 0) + ",Gov,Male,>50K\n")  # one record with an empty age
    test_file.write_text(HEADER + _rows(60, 1))
    return train_file, test_file


def _csv(csv_files, missing: str) -> dict:
    train_file, test_file = csv_files
    params = {"path": str(train_file), "test_path": str(test_file), "label": LABEL, "features": FEATURES}
    return {"dataset": "csv", "dataset_params": {**params, "missing": missing}}


def test_a_csv_missing_drop_under_replace_one_is_named_in_the_record(csv_files, tmp_path):
    train(_dp_gd("replace_one", **_csv(csv_files, "drop")), out_dir=tmp_path / "run", progress=False)
    record = read_record(tmp_path / "run")
    assert record["privacy"]["neighbouring"] == "replace_one" and record["dataset"]["n_train"] == 150
    note = record["privacy"]["not_accounted"]["selection"]
    assert note.startswith("per-record selection of the training split (csv missing: drop) under neighbouring")
    assert "enter or leave the training split" in note and "NOT about a record of the source data" in note


def test_no_note_under_add_remove_or_without_per_record_selection(csv_files):
    assert _selection_note(_dp_gd("add_remove", **_csv(csv_files, "drop"))) is None
    train_file, _ = csv_files  # missing: error needs a file without an empty cell
    train_file.write_text(HEADER + _rows(150, 0))
    c = _dp_gd("replace_one", **_csv(csv_files, "error"))
    run = build_run(c)
    assert run.data.public_meta["selection"]["per_record"] == []
    assert "not_accounted" not in privacy_section(c, run.ledger, run.data)


def test_the_note_names_every_per_record_step_and_is_public(csv_files):
    note = _selection_note(_dp_gd("replace_one", dataset_params={"val_fraction": 0.1, "train_fraction": 0.5}))
    assert "(test carve: test_fraction 0.2; validation carve: val_fraction 0.1; train_fraction 0.5)" in note
    assert "imratio 0.1: label-1 records thinned" in _selection_note(_dp_gd("replace_one", dataset="digits-st"))
    # named whether or not a record was dropped: a public fact never depends on the data
    train_file, _ = csv_files
    train_file.write_text(HEADER + _rows(150, 0))
    ds = load_dataset("csv", **_csv(csv_files, "drop")["dataset_params"])
    assert ds.public_meta["selection"]["per_record"] == ["csv missing: drop"]
    assert _selection_note(_dp_gd("add_remove", dataset_params={"val_fraction": 0.1})) is None
