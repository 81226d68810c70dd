"""Where a csv run reads its files: a relative ``dataset_params.path``/``test_path`` written in a config
file is relative to that file's folder, one given with ``--set`` or through the Python API to the
current directory; a resumed run reads the files it started with from any directory; the record
keeps the paths as written (no machine path)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from privopt.cli import main
from privopt.config import RunConfig, file_folders, load_config
from privopt.errors import DataError
from privopt.training import train
from test_csv_dataset import YAML, _rows

HEADER = "age,job,sex,income\n"


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """``tmp/exp/{run.yaml, train.csv, test.csv}``, the current directory ``tmp/elsewhere``."""
    exp, elsewhere = tmp_path / "exp", tmp_path / "elsewhere"
    exp.mkdir()
    elsewhere.mkdir()
    (exp / "train.csv").write_text(HEADER + _rows(200, 0))
    (exp / "test.csv").write_text(HEADER + _rows(80, 1))
    (exp / "run.yaml").write_text(YAML.format(train="train.csv", test="test.csv"))
    monkeypatch.chdir(elsewhere)
    return tmp_path


def _record(run_dir) -> dict:
    return json.loads((run_dir / "record.json").read_text())


def test_relative_paths_of_a_config_file_are_read_from_its_folder(layout, capsys):
    assert main(["train", "--config", "../exp/run.yaml", "--out", "run", "--quiet"]) == 0
    record = _record(layout / "elsewhere" / "run")
    assert record["status"] == "finished" and record["dataset"]["n_train"] > 0
    params = record["config"]["dataset_params"]
    assert (params["path"], params["test_path"]) == ("train.csv", "test.csv")  # as written
    assert str(layout) not in (layout / "elsewhere" / "run" / "record.json").read_text()


def test_set_paths_are_read_from_the_current_directory(layout, capsys):
    argv = ["train", "--config", "../exp/run.yaml", "--quiet", "--set", "dataset_params.path=train.csv"]
    assert main([*argv, "--out", "a"]) == 2  # train.csv is not in the current directory
    err = capsys.readouterr().err
    assert (
        f"dataset_params.path: file train.csv ({layout / 'elsewhere' / 'train.csv'}, from the current directory)" in err
    )
    assert not (layout / "elsewhere" / "a").exists()
    shutil.copy(layout / "exp" / "train.csv", layout / "elsewhere" / "train.csv")
    assert main([*argv, "--out", "b"]) == 0  # test_path, not overridden, still from the config's folder
    assert _record(layout / "elsewhere" / "b")["config"]["dataset_params"]["path"] == "train.csv"


def test_a_missing_file_of_a_config_is_named_as_resolved(layout, capsys):
    (layout / "exp" / "bad.yaml").write_text(YAML.format(train="sub/nope.csv", test="test.csv"))
    assert main(["train", "--config", "../exp/bad.yaml", "--out", "run", "--quiet"]) == 2
    err = capsys.readouterr().err
    resolved = layout / "exp" / "sub" / "nope.csv"
    assert f"file sub/nope.csv ({resolved}, relative to the folder of the config file ../exp/bad.yaml)" in err
    assert not (layout / "elsewhere" / "run").exists()


def test_which_options_are_relative_to_the_config_file(layout):
    cfg_file = layout / "exp" / "run.yaml"
    folder = str(cfg_file.parent)
    assert file_folders(load_config(cfg_file)) == {
        "path": (folder, str(cfg_file)),
        "test_path": (folder, str(cfg_file)),
    }
    only_test = load_config(cfg_file, ["dataset_params.path=x.csv"])
    assert set(file_folders(only_test)) == {"test_path"}
    assert file_folders(load_config(cfg_file, ["dataset_params={path: a.csv}"])) == {}
    assert "_file_folders" not in json.dumps(load_config(cfg_file).to_dict())
    api = RunConfig.from_dict({"dataset": "csv", "dataset_params": {"path": "train.csv"}})
    assert file_folders(api) == {}  # the Python API: the current directory


def test_a_resume_reads_the_files_it_started_with_from_any_directory(layout, monkeypatch, capsys):
    cfg = load_config(layout / "exp" / "run.yaml")
    run_dir = layout / "run"
    assert train(cfg, out_dir=run_dir, max_steps=2, progress=False)["status"] == "paused"
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["data_files"] == {
        "path": str(layout / "exp" / "train.csv"),
        "test_path": str(layout / "exp" / "test.csv"),
    }
    assert str(layout) not in json.dumps(ckpt["record"]) and str(layout) not in (run_dir / "record.json").read_text()
    other = layout / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    (other / "train.csv").write_text(HEADER + _rows(50, 9))  # a file of the same name here is not read
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    record = _record(run_dir)
    assert record["status"] == "finished" and str(layout) not in (run_dir / "record.json").read_text()


def test_a_resume_whose_file_moved_names_where_the_run_read_it(layout, capsys):
    cfg = load_config(layout / "exp" / "run.yaml")
    run_dir = layout / "run"
    assert train(cfg, out_dir=run_dir, max_steps=1, progress=False)["status"] == "paused"
    (layout / "exp" / "train.csv").rename(layout / "exp" / "moved.csv")
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"({layout / 'exp' / 'train.csv'}, where the run read it when it started" in err
    with pytest.raises(DataError, match="where the run read it when it started"):
        train(None, out_dir=run_dir, resume=True, progress=False)
