"""A practitioner's first journeys on their own data: group metrics, Ctrl-C and resume, error hints."""

import csv
import json
import os
import re
import signal
import threading

import numpy as np
import pytest
import torch
from torch import nn

import privopt
from privopt.data import Dataset, load_dataset
from privopt.errors import ConfigError, DataError
from privopt.eval.worst_group import evaluate_groups
from privopt.training import train


def grouped_data(n=600, n_test=300):
    """Two groups that disagree on the label's direction; the second one small."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n + n_test, 3, generator=g)
    groups = (torch.rand(n + n_test, generator=g) < 0.2).long()
    y = torch.where(groups == 1, x[:, 0] < 0.5, x[:, 0] > 0.5).long()
    return Dataset.from_tensors(
        x[:n], y[:n], x_test=x[n:], y_test=y[n:], groups=groups[:n], groups_test=groups[n:],
        num_classes=2, group_names=["big", "small"], name="grouped",
    )  # fmt: skip


def test_a_run_on_grouped_data_publishes_its_worst_group_accuracy(tmp_path):
    data, model = grouped_data(), nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    rec = privopt.fit(
        model=model, dataset=data, algorithm="noisy-sgd-ags", epsilon=2.0, delta=1e-4, accountant="rdp",
        out_dir=tmp_path / "run", epochs=1, batch_size=100,
    )  # fmt: skip
    m = evaluate_groups(model, data.x_test, data.y_test, data.g_test, num_groups=2)
    per_group = [g["accuracy"] for g in m["per_group"].values()]
    metrics = rec["metrics"]
    assert [metrics["test_group0_accuracy"], metrics["test_group1_accuracy"]] == pytest.approx(per_group)
    assert metrics["test_worst_group_accuracy"] == pytest.approx(min(per_group))
    assert metrics["test_mean_group_accuracy"] == pytest.approx(sum(per_group) / 2)
    with open(tmp_path / "run" / "metrics.csv") as f:  # its last row: the last iterate (the output averages them)
        last = list(csv.DictReader(f))[-1]
    worst = min(float(last["test_group0_accuracy"]), float(last["test_group1_accuracy"]))
    assert float(last["test_worst_group_accuracy"]) == worst


def test_a_run_without_groups_has_no_group_metrics():
    data = grouped_data()
    plain = Dataset.from_tensors(data.x_train, data.y_train, x_test=data.x_test, y_test=data.y_test, num_classes=2)
    rec = privopt.fit(model=nn.Linear(3, 2), dataset=plain, algorithm="sgd", epochs=1, batch_size=100)
    assert "test_accuracy" in rec["metrics"]
    assert not [k for k in rec["metrics"] if "group" in k]


def test_the_cli_summary_line_shows_the_worst_group_accuracy(capsys, tmp_path):
    from privopt.cli import main

    argv = ["train", "--set", "algorithm=sgd", "--set", "dataset=synthetic-groups", "--set", "model=logreg"]
    argv += ["--set", "dataset_params={n_train: 400, n_test_per_group: 50}", "--set", "algorithm_params={epochs: 1}"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--set", "plots=false"]) == 0
    out = capsys.readouterr().out
    assert "worst-group" in out and out.count("\n") == 1, out


@pytest.fixture
def ctrl_c_at_step_2(monkeypatch):
    """A real SIGINT (Ctrl-C) delivered to this process once a run has taken two steps."""
    import privopt.training.run as run_module

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")

    class CtrlC(run_module.DivergenceGuard):
        def on_step_end(self, state, logs):
            super().on_step_end(state, logs)
            if state.step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(run_module, "DivergenceGuard", CtrlC)
    return monkeypatch


def test_a_fit_with_a_loss_module_interrupted_by_ctrl_c_resumes_as_documented(tmp_path, ctrl_c_at_step_2):
    """docs/api.md: a fit interrupted in out_dir resumes with train(None, ..., resume=True, dataset=,
    model=, loss=) and the same objects: also a torch loss module, as fit took it."""
    data, model, run = grouped_data(), nn.Linear(3, 2), tmp_path / "run"
    kw = dict(algorithm="dp-sgd", epsilon=1.0, delta=1e-4, accountant="rdp", epochs=1, batch_size=100)
    with pytest.raises(KeyboardInterrupt) as err:
        privopt.fit(model=model, loss=nn.CrossEntropyLoss(), dataset=data, out_dir=run, **kw)
    message = str(err.value)
    assert "interrupted at step 2/" in message and "privopt train --resume" not in message  # the CLI cannot
    assert "train(None, out_dir=" in message and "dataset=..., model=..., loss=..." in message
    ctrl_c_at_step_2.undo()
    with pytest.raises(ConfigError, match=r"from Python: train\(None, out_dir=\.\.\., resume=True\)"):
        privopt.fit(model=nn.Linear(3, 2), dataset=data, out_dir=run, **kw)  # the same folder again
    rec = train(None, out_dir=run, resume=True, progress=False, dataset=data, model=model, loss=nn.CrossEntropyLoss())
    assert rec["status"] == "finished" and rec["steps_done"] == rec["total_steps"] == 6
    assert rec["privacy"]["epsilon_spent"] <= 1.0


def test_the_resume_call_a_fit_names_prints_what_fit_printed(tmp_path, ctrl_c_at_step_2, capsys):
    """fit's progress is auto (None: nothing on a stream that is not a terminal); train's default is
    True (lines). The hinted call passes progress=None, so, run as written, it prints nothing either."""
    data, model, run = grouped_data(), nn.Linear(3, 2), tmp_path / "run"
    kw = dict(algorithm="dp-sgd", epsilon=1.0, delta=1e-4, accountant="rdp", epochs=1, batch_size=100)
    with pytest.raises(KeyboardInterrupt) as err:
        privopt.fit(model=model, dataset=data, out_dir=run, **kw)
    call = re.search(r"resume with: (privopt\.training\.train\(.*\)) with the same dataset, model$", str(err.value))
    assert call and call.group(1).endswith("dataset=..., model=..., progress=None)")
    ctrl_c_at_step_2.undo()
    capsys.readouterr()
    rec = eval(call.group(1).replace("dataset=...", "dataset=data").replace("model=...", "model=model"))
    assert rec["status"] == "finished" and "dp-sgd: step" not in capsys.readouterr().err


@pytest.mark.parametrize(("progress", "shown"), [(True, ""), (False, ", progress=False")])
def test_a_train_call_interrupted_names_its_own_progress(tmp_path, ctrl_c_at_step_2, progress, shown):
    from privopt.config import RunConfig

    cfg = RunConfig.from_dict(
        {"algorithm": "sgd", "plots": False, "algorithm_params": {"epochs": 1, "batch_size": 100}}
    )
    with pytest.raises(
        KeyboardInterrupt, match=re.escape(f"resume=True, dataset=...{shown}) with the same dataset") + "$"
    ):
        train(cfg, out_dir=tmp_path / "run", progress=progress, dataset=grouped_data())


def test_a_config_run_interrupted_by_ctrl_c_is_resumed_by_the_cli(tmp_path, ctrl_c_at_step_2):
    from privopt.config import RunConfig

    cfg = RunConfig.from_dict(
        {"algorithm": "sgd", "dataset": "breast-cancer", "model": "logreg", "plots": False,
         "algorithm_params": {"epochs": 1, "batch_size": 100}}
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt, match=f"resume with: privopt train --resume {tmp_path / 'run'}$"):
        train(cfg, out_dir=tmp_path / "run", progress=False)


@pytest.mark.parametrize("name", ["/home/me/people.csv", "people.csv", "my-data"])
def test_an_unknown_dataset_says_how_to_train_on_your_own_data(name):
    with pytest.raises(ConfigError) as err:
        load_dataset(name)
    message = str(err.value)
    assert f"unknown dataset {name!r}; available: " in message and "\n" not in message
    assert "privopt.data.Dataset" in message and "Bring your own data" in message


def _csv_columns():
    """Columns as a CSV reader gives them: numbers, a string label and a string group; one missing value."""
    rng = np.random.default_rng(0)
    x = rng.random((50, 2))
    label = np.where(x[:, 0] > 0.5, "pos", "neg")
    region = np.where(x[:, 1] > 0.8, "north", "south")
    x_text = x.astype(object)
    x_text[7, 1] = ""  # a missing value
    return x, x_text, label, region


@pytest.mark.parametrize(
    "what,expect",
    [
        ("labels", "dataset 'people': y has dtype <U3; labels must be integer ids 0..K-1: map the strings to ids"),
        ("groups", "dataset 'people': groups has dtype <U5; group ids must be integers 0..G-1: map the strings"),
        ("features", "dataset 'people': x has dtype object; features must be numbers (a missing value read as ''"),
    ],
)
def test_text_columns_of_a_csv_are_refused_with_what_to_do_and_no_value(what, expect):
    x, x_text, label, region = _csv_columns()
    ids, gids = (label == "pos").astype(np.int64), (region == "north").astype(np.int64)
    args = {
        "labels": (x, label, dict(y_test=label, groups=gids, groups_test=gids)),
        "groups": (x, ids, dict(y_test=ids, groups=region, groups_test=region)),
        "features": (x_text, ids, dict(y_test=ids, groups=gids, groups_test=gids)),
    }[what]
    with pytest.raises(DataError) as err:
        Dataset.from_numpy(args[0], args[1], x_test=x, num_classes=2, group_names=["urban", "rural"], name="people",
                           **args[2])  # fmt: skip
    message = str(err.value)
    assert message.startswith(expect) and "\n" not in message, message
    assert not re.search(r"pos|neg|north|south|0\.\d", message), message  # no record's value


def test_float_labels_say_how_to_convert_a_numpy_array():
    x, _, label, _ = _csv_columns()
    with pytest.raises(DataError, match=r"must be integer ids, got torch.float64 .*\.astype\(np.int64\)"):
        Dataset.from_numpy(x, (label == "pos").astype(float), x_test=x, y_test=np.zeros(50, np.int64), num_classes=2)


def test_ctrl_c_while_a_finished_run_writes_its_outputs_says_the_run_finished(capsys, tmp_path, monkeypatch):
    """The run's signal guard delivers a Ctrl-C that came during the final commit after it: the CLI said
    'privopt: interrupted' alone, which reads as a lost run (a resume then only printed the summary)."""
    import privopt.training.run as run_module
    from privopt.cli import main

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    real_commit = run_module._Session.commit

    def commit(self, status, **kw):
        if status == "finished":
            os.kill(os.getpid(), signal.SIGINT)
        return real_commit(self, status, **kw)

    monkeypatch.setattr(run_module._Session, "commit", commit)
    out = tmp_path / "r"
    argv = ["train", "--set", "algorithm=sgd", "--set", "dataset=breast-cancer", "--set", "model=logreg"]
    code = main([*argv, "--set", "algorithm_params={epochs: 1}", "--set", "plots=false", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 130 and err == f"privopt: interrupted after the run finished: its outputs are complete in {out}\n"
    assert json.loads((out / "record.json").read_text())["status"] == "finished"


def test_a_missing_value_read_as_nan_says_what_to_do_without_its_record():
    x, _, _, _ = _csv_columns()
    x = x.copy()
    x[7, 1] = np.nan  # np.genfromtxt's missing value
    with pytest.raises(DataError) as err:
        Dataset.from_numpy(x, np.zeros(50, np.int64), x_test=x[:5] * 0, y_test=np.zeros(5, np.int64), num_classes=2)
    message = str(err.value)
    assert "the train split has NaN or infinite feature values" in message and "public constant" in message
    assert not re.search(r"\b7\b|row|line", message), message  # which record is not said


def test_an_interrupted_run_does_not_claim_the_outputs_of_a_run_already_in_its_folder(capsys, tmp_path, monkeypatch):
    """torchrun into a folder holding a finished run: rank 0 refused it, torchrun stopped rank 1, and
    rank 1 said 'interrupted after the run finished: its outputs are complete' of the old run."""
    import privopt.training
    from privopt.cli import main

    out = tmp_path / "old"
    out.mkdir()
    (out / "record.json").write_text(json.dumps({"status": "finished"}))

    def stopped(*a, **kw):
        raise KeyboardInterrupt  # SIGTERM while the run was being built

    monkeypatch.setattr(privopt.training, "train", stopped)
    argv = ["train", "--set", "algorithm=sgd", "--set", "dataset=breast-cancer", "--set", "model=logreg"]
    code = main([*argv, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 130 and "outputs are complete" not in err, err
