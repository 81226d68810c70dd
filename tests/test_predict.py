"""A finished run's released model, used: ``privopt.load_run`` and ``privopt predict`` rebuild it from the
run's public files, predict exactly as the run's evaluation did, and refuse what they cannot do."""

from __future__ import annotations

import csv
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import privopt
from privopt.cli import main
from privopt.errors import ConfigError, DataError

FEATURES = {
    "age": {"range": [17, 90]},
    "work": {"categories": ["Private", "Gov"], "unknown": "other"},
    "sex": {"categories": ["F", "M"]},
}


def _write_csv(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = ["age,work,sex,income"]
    for _ in range(n):
        age = int(rng.integers(17, 91))
        work, sex = rng.choice(["Private", "Gov", "Other"]), rng.choice(["F", "M"])
        rows.append(f"{age},{work},{sex},{'high' if age + rng.normal(0, 10) > 50 else 'low'}")
    path.write_text("\n".join(rows) + "\n")


def _csv_config(folder: Path, **extra) -> dict:
    return {
        "algorithm": "dp-sgd",
        "algorithm_params": {"epochs": 2, "batch_size": 50, "lr": 0.5, "clip": 1.0},
        "model": "logreg",
        "privacy": {"epsilon": 2.0, "delta": 1e-4},
        "dataset": "csv",
        "dataset_params": {
            "path": str(folder / "train.csv"),
            "test_path": str(folder / "test.csv"),
            "label": {"column": "income", "classes": ["low", "high"]},
            "features": FEATURES,
        },
        "plots": False,
        **extra,
    }


def _cli_train(folder: Path, cfg: dict, out: Path) -> None:
    (folder / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(folder / "cfg.yaml"), "--out", str(out), "--quiet"]) == 0


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("csvrun")
    _write_csv(folder / "train.csv", 300, 0)
    _write_csv(folder / "test.csv", 120, 1)
    _cli_train(folder, _csv_config(folder), folder / "run")
    return folder


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """digits with a logit adjustment from a public (lopsided) prior: the record holds its offsets."""
    folder = tmp_path_factory.mktemp("digitsrun")
    cfg = {
        "algorithm": "dp-sgd",
        "algorithm_params": {"epochs": 1, "batch_size": 128, "lr": 0.5, "clip": 1.0},
        "model": "logreg",
        "dataset": "digits",
        "privacy": {"epsilon": 4.0, "delta": 1e-4},
        "logit_adjustment": {"prior": [0.5, *([0.5 / 9] * 9)], "tau": 2.0},
        "plots": False,
    }
    _cli_train(folder, cfg, folder / "run")
    return folder / "run"


def test_load_run_reproduces_the_recorded_test_accuracy_of_a_csv_run(csv_run):
    run = privopt.load_run(csv_run / "run")
    x, y = run.read_csv(csv_run / "test.csv")
    assert not run.model.training
    assert float((run.predict(x) == y).mean()) == run.record["metrics"]["test_accuracy"]
    proba = run.predict_proba(x)
    assert proba.shape == (120, 2) and np.allclose(proba.sum(1), 1.0)
    assert run.class_names == ["low", "high"]


def test_load_run_applies_the_logit_offsets_as_the_run_did(digits_run):
    from privopt.data import load_dataset

    run = privopt.load_run(digits_run)
    offsets = torch.tensor(run.record["prediction"]["logit_offsets"])
    assert run.logit_offsets is not None and torch.equal(run.logit_offsets, offsets)
    x = load_dataset("digits", seed=0).x_test
    assert float((run.predict(x) == load_dataset("digits", seed=0).y_test.numpy()).mean()) == pytest.approx(
        run.record["metrics"]["test_accuracy"], abs=0
    )
    with torch.no_grad():
        raw = run.model(x)
    expected = torch.softmax((raw - offsets).double(), dim=1).numpy()
    assert np.allclose(run.predict_proba(x), expected, atol=1e-6)
    assert not np.allclose(run.predict_proba(x), torch.softmax(raw.double(), dim=1).numpy(), atol=1e-3)


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_predict_cli_on_a_csv_with_and_without_the_label(csv_run, tmp_path, capsys):
    acc = json.loads((csv_run / "run" / "record.json").read_text())["metrics"]["test_accuracy"]
    args = ["predict", "--run", str(csv_run / "run"), "--input", str(csv_run / "test.csv")]
    assert main([*args, "--out", str(tmp_path / "a.csv"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 120 and summary["accuracy"] == acc
    rows = _read(tmp_path / "a.csv")
    assert len(rows) == 120 and list(rows[0]) == ["prediction", "p_low", "p_high"]
    assert {r["prediction"] for r in rows} <= {"low", "high"}
    assert all(abs(float(r["p_low"]) + float(r["p_high"]) - 1) < 1e-5 for r in rows)
    labels = [r["income"] for r in _read(csv_run / "test.csv")]
    assert np.mean([r["prediction"] == lab for r, lab in zip(rows, labels)]) == acc

    nolabel = tmp_path / "new.csv"
    nolabel.write_text(
        "".join(line.rsplit(",", 1)[0] + "\n" for line in (csv_run / "test.csv").read_text().splitlines())
    )
    assert (
        main(["predict", "--run", str(csv_run / "run"), "--input", str(nolabel), "--out", str(tmp_path / "b.csv")]) == 0
    )
    out = capsys.readouterr().out
    assert "predicted 120 records" in out and "accuracy" not in out
    assert (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()


def test_predict_cli_refuses_bad_input_before_writing(csv_run, tmp_path, capsys):
    run_dir = str(csv_run / "run")
    missing = tmp_path / "missing.csv"
    missing.write_text("age,work,income\n30,Gov,low\n")
    empty_cell = tmp_path / "empty.csv"
    empty_cell.write_text("age,work,sex\n30,Gov,\n")
    all_empty = tmp_path / "all_empty.csv"  # a record whose every cell is empty is a record, not a blank line:
    all_empty.write_text("age,work,sex\n30,Gov,F\n,,\n\n45,Gov,M\n")  # skipping it shifted later predictions
    cases = ((missing, "column 'sex' is not in the header"), (empty_cell, "needs every feature"))
    for bad, needle in (*cases, (all_empty, "column 'age' of some record is missing")):
        out = tmp_path / "p.csv"
        assert main(["predict", "--run", run_dir, "--input", str(bad), "--out", str(out)]) == 2
        assert needle in capsys.readouterr().err and not out.exists()
    existing = tmp_path / "taken.csv"
    existing.write_text("keep\n")
    argv = ["predict", "--run", run_dir, "--input", str(csv_run / "test.csv"), "--out", str(existing)]
    assert main(argv) == 2
    assert "exists" in capsys.readouterr().err and existing.read_text() == "keep\n"
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((2, 7)))
    assert main(["predict", "--run", run_dir, "--input", str(npy), "--out", str(tmp_path / "q.csv")]) == 2
    assert "dataset: csv" in capsys.readouterr().err and not (tmp_path / "q.csv").exists()


def test_predict_cli_on_npy_records(digits_run, tmp_path, capsys):
    from privopt.data import load_dataset

    x = load_dataset("digits", seed=0).x_test[:10].numpy()
    good, nan, wrong = tmp_path / "x.npy", tmp_path / "nan.npy", tmp_path / "wrong.npy"
    np.save(good, x.astype(np.float64))
    np.save(nan, np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x))
    np.save(wrong, x.reshape(10, -1)[:, :50])
    assert main(["predict", "--run", str(digits_run), "--input", str(good), "--out", str(tmp_path / "p.csv")]) == 0
    rows = _read(tmp_path / "p.csv")
    expected = privopt.load_run(digits_run).predict(x)
    assert [int(r["prediction"]) for r in rows] == expected.tolist() and len(rows[0]) == 11
    for bad, needle in ((nan, "NaN"), (wrong, "shape")):
        out = tmp_path / f"{bad.stem}.csv"
        assert main(["predict", "--run", str(digits_run), "--input", str(bad), "--out", str(out)]) == 2
        assert needle in capsys.readouterr().err and not out.exists()


def test_a_paused_run_is_refused_with_how_to_resume(csv_run, tmp_path):
    from privopt.config import RunConfig
    from privopt.training import train

    cfg = RunConfig.from_dict(_csv_config(csv_run))
    train(cfg, out_dir=tmp_path / "paused", progress=False, max_steps=1)
    with pytest.raises(ConfigError, match=r"has not finished \(status 'paused'.*privopt train --resume"):
        privopt.load_run(tmp_path / "paused")


def test_a_run_on_a_module_passed_in_is_refused_with_how_to_load_it(tmp_path):
    from privopt.data import Dataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(200, 4, generator=g), torch.randint(0, 2, (200,), generator=g)
    data = Dataset.from_tensors(x[:150], y[:150], x_test=x[150:], y_test=y[150:], num_classes=2)
    net = torch.nn.Linear(4, 2)
    privopt.fit(model=net, dataset=data, epsilon=2.0, delta=1e-3, epochs=1, batch_size=50, out_dir=tmp_path / "r")
    with pytest.raises(ConfigError, match=r"build the module yourself.*load_state_dict\(torch\.load\("):
        privopt.load_run(tmp_path / "r")


def _copy_run(csv_run: Path, dest: Path) -> Path:
    shutil.copytree(csv_run / "run", dest, ignore=shutil.ignore_patterns("checkpoint.pt"))
    return dest


class _Payload:
    """Unpickling this would create a file: a weights_only load must refuse it instead."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_missing_corrupt_and_non_tensor_model_files_are_refused(csv_run, tmp_path):
    gone = _copy_run(csv_run, tmp_path / "gone")
    (gone / "model.pt").unlink()
    with pytest.raises(DataError, match="model.pt is missing"):
        privopt.load_run(gone)
    evil = _copy_run(csv_run, tmp_path / "evil")
    marker = tmp_path / "executed"
    (evil / "model.pt").write_bytes(pickle.dumps({"weight": _Payload(marker)}, protocol=2))
    with pytest.raises(DataError, match="weights_only=True"):
        privopt.load_run(evil)
    assert not marker.exists()
    torch.save({"weight": "not a tensor"}, evil / "model.pt")
    with pytest.raises(DataError, match="not a model state_dict|weights_only"):
        privopt.load_run(evil)
    torch.save({"weight": torch.zeros(3)}, evil / "model.pt")
    with pytest.raises(DataError, match="does not fit the model the record names"):
        privopt.load_run(evil)
    bad = _copy_run(csv_run, tmp_path / "bad")
    (bad / "record.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupt"):
        privopt.load_run(bad)
    with pytest.raises(DataError, match="not a privopt run folder"):
        privopt.load_run(tmp_path)


def test_load_run_never_reads_the_checkpoint(csv_run, tmp_path):
    run_dir = _copy_run(csv_run, tmp_path / "r")
    (run_dir / "checkpoint.pt").mkdir()  # any attempt to read it would fail
    x, y = privopt.load_run(run_dir).read_csv(csv_run / "test.csv")
    assert privopt.load_run(run_dir).predict(x).shape == y.shape


def test_a_run_on_scattering_features_takes_raw_images(tmp_path):
    from privopt.config import RunConfig
    from privopt.data import load_dataset
    from privopt.training import train

    cfg = {"model": "logreg", "dataset": "digits", "features": {"name": "scattering", "J": 1, "cache": False}}
    cfg |= {"algorithm_params": {"epochs": 1, "batch_size": 128}, "plots": False}
    record = train(RunConfig.from_dict(cfg), out_dir=tmp_path / "r", progress=False)
    run, test = privopt.load_run(tmp_path / "r"), load_dataset("digits", seed=0)
    assert run.record["dataset"]["input_shape"] == [144] and list(test.x_test.shape[1:]) == [1, 8, 8]
    assert float((run.predict(test.x_test) == test.y_test.numpy()).mean()) == record["metrics"]["test_accuracy"]
    with pytest.raises(DataError, match="feature map"):
        run.predict(test.x_test.reshape(-1, 64))


def _digits_test_arrays(folder: Path) -> tuple[Path, np.ndarray]:
    from privopt.data import load_dataset

    test = load_dataset("digits", seed=0)
    np.save(folder / "x.npy", test.x_test.numpy())
    return folder / "x.npy", test.y_test.numpy()


def test_predict_labels_give_the_recorded_accuracy_and_balanced_accuracy(digits_run, csv_run, tmp_path, capsys):
    metrics = json.loads((digits_run / "record.json").read_text())["metrics"]
    x, y = _digits_test_arrays(tmp_path)
    np.save(tmp_path / "ids.npy", y)
    np.save(tmp_path / "names.npy", np.array([str(int(v)) for v in y]))  # the run's class names, as text
    for i, labels in enumerate(("ids.npy", "names.npy")):
        argv = ["predict", "--run", str(digits_run), "--input", str(x), "--labels", str(tmp_path / labels)]
        assert main([*argv, "--out", str(tmp_path / f"p{i}.csv"), "--json", "--device", "cpu"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["records"] == len(y) and summary["accuracy"] == metrics["test_accuracy"]
        assert summary["balanced_accuracy"] == metrics["test_balanced_accuracy"]
    assert main([*argv, "--out", str(tmp_path / "p2.csv")]) == 0
    assert "(balanced " in capsys.readouterr().out
    csv_metrics = json.loads((csv_run / "run" / "record.json").read_text())["metrics"]
    argv = ["predict", "--run", str(csv_run / "run"), "--input", str(csv_run / "test.csv"), "--json"]
    assert main([*argv, "--out", str(tmp_path / "c.csv")]) == 0  # a CSV's label column: the same scores
    assert json.loads(capsys.readouterr().out)["balanced_accuracy"] == csv_metrics["test_balanced_accuracy"]


def test_predict_refuses_bad_labels_before_writing(digits_run, csv_run, tmp_path, capsys):
    x, y = _digits_test_arrays(tmp_path)
    cases = {
        "short.npy": (y[:-1], f"has shape [{len(y) - 1}]; expected [{len(y)}]"),
        "column.npy": (y[:, None], f"has shape [{len(y)}, 1]; expected [{len(y)}]"),
        "range.npy": (np.where(np.arange(len(y)) < 3, 10, y), f"3 of {len(y)} labels are not one of the run's 10"),
        "negative.npy": (np.where(np.arange(len(y)) < 1, -1, y), "1 of"),
        "float.npy": (y.astype(np.float64), "holds float64 values"),
        "names.npy": (np.array(["cat"] + [str(int(v)) for v in y[1:]]), f"1 of {len(y)} labels are not one"),
        "objects.npy": (np.array([{"a": 1}] * len(y), dtype=object), "not a NumPy .npy array"),
    }
    for name, (labels, needle) in cases.items():
        np.save(tmp_path / name, labels, allow_pickle=True)
        out = tmp_path / f"{name}.csv"
        argv = ["predict", "--run", str(digits_run), "--input", str(x), "--labels", str(tmp_path / name)]
        assert main([*argv, "--out", str(out)]) == 2, name
        assert needle in capsys.readouterr().err and not out.exists(), name
    out = tmp_path / "q.csv"
    argv = ["predict", "--run", str(digits_run), "--input", str(x), "--labels", str(tmp_path / "absent.npy")]
    assert main([*argv, "--out", str(out)]) == 2
    assert "give an existing .npy file" in capsys.readouterr().err and not out.exists()
    argv = ["predict", "--run", str(csv_run / "run"), "--input", str(csv_run / "test.csv")]
    assert main([*argv, "--labels", str(tmp_path / "short.npy"), "--out", str(out)]) == 2
    assert "--labels applies to a .npy --input" in capsys.readouterr().err and not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_predict_on_an_unavailable_device_is_refused_before_writing(digits_run, tmp_path, capsys):
    x, _ = _digits_test_arrays(tmp_path)
    out = tmp_path / "p.csv"
    assert main(["predict", "--run", str(digits_run), "--input", str(x), "--out", str(out), "--device", "cuda"]) == 2
    assert "device 'cuda' requested but CUDA is not available" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ConfigError, match="CUDA is not available"):  # before the (missing) folder is read
        privopt.load_run(tmp_path / "no-such-run", device="cuda")
    with pytest.raises(ConfigError, match="device must be"):
        privopt.load_run(digits_run, device="gpu")
    assert privopt.load_run(digits_run, device="cpu").device == torch.device("cpu")
