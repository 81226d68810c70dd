"""The shared loop: records, budget guard, checkpoints and resume (including kill -9)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from privopt.checkpoint import load_checkpoint, save_checkpoint
from privopt.config import RunConfig
from privopt.errors import ConfigError, DataError, PrivacyBudgetExceeded
from privopt.training import train

BASE = {
    "algorithm": "dp-sgd",
    "dataset": "digits",
    "model": "logreg",
    "algorithm_params": {"epochs": 2, "batch_size": 100, "lr": 0.5, "clip": 1.0},
    "privacy": {"epsilon": 2.0, "delta": 1e-5},
    "checkpoint_every": 5,
    "eval_every": 5,
}


def cfg(**over):
    d = json.loads(json.dumps(BASE))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    return RunConfig.from_dict(d)


def test_record_has_everything(tmp_path):
    rec = train(cfg(), out_dir=tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "record.json").read_text())
    assert saved["status"] == "finished"
    p = saved["privacy"]
    assert 0 < p["epsilon_spent"] <= 2.0 and p["delta"] == 1e-5 and p["neighbouring"] == "add_remove"
    assert saved["calibration"]["noise_multipliers"]["grad"] > 0
    assert saved["privacy_inventory"] and saved["randomness"]["public_seed"] == 0
    # Default randomness is secret: nothing in the record lets anyone replay the noise.
    assert saved["randomness"]["insecure_seed"] is None and "secret" in saved["randomness"]["noise_and_sampling"]
    assert saved["hyperparameters"]["clip"] == 1.0 and saved["wall_time_s"] > 0
    assert 0 <= saved["metrics"]["test_accuracy"] <= 1
    assert (tmp_path / "run" / "metrics.csv").read_text().startswith("step,")
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000
    assert rec["privacy"]["epsilon_spent"] == p["epsilon_spent"]


def test_dp_sgd_learns_digits(tmp_path):
    rec = train(cfg(algorithm_params={"epochs": 5}, privacy={"epsilon": 8.0}), out_dir=tmp_path / "r", progress=False)
    assert rec["metrics"]["test_accuracy"] > 0.6  # 10 classes: chance is 0.1


def test_existing_output_dir_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="already holds files"):
        train(cfg(), out_dir=tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "x").read_text() == "keep me"


def test_pause_and_resume_matches_uninterrupted(tmp_path):
    full = train(cfg(insecure_seed=0), out_dir=tmp_path / "full", progress=False)
    part = train(cfg(insecure_seed=0), out_dir=tmp_path / "part", progress=False, max_steps=7)
    assert part["status"] == "paused"
    resumed = train(RunConfig(), out_dir=tmp_path / "part", resume=True, progress=False)
    assert resumed["privacy"]["epsilon_spent"] == pytest.approx(full["privacy"]["epsilon_spent"], rel=1e-12)
    assert resumed["privacy"]["ledger"] == full["privacy"]["ledger"]
    assert resumed["metrics"]["test_accuracy"] == pytest.approx(full["metrics"]["test_accuracy"])
    assert resumed["metrics"]["test_loss"] == pytest.approx(full["metrics"]["test_loss"], rel=1e-6)


def test_budget_guard_stops_and_saves(tmp_path, monkeypatch):
    """A run asked to do more steps than it planned is refused before the extra release."""
    from privopt.algorithms.dpsgd import DPSGD

    monkeypatch.setattr(DPSGD, "num_steps", lambda self: 10 * self.steps_for(n=self._n))
    with pytest.raises(PrivacyBudgetExceeded):
        train(cfg(privacy={"epsilon": 1.0}), out_dir=tmp_path / "run", progress=False)
    rec = json.loads((tmp_path / "run" / "record.json").read_text())
    assert rec["status"] == "budget_exhausted"
    assert rec["privacy"]["epsilon_spent"] <= 1.0
    assert (tmp_path / "run" / "checkpoint.pt").exists()


def test_crash_while_saving_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"step": 1})

    def exploding_save(obj, f):
        f.write(b"partial garbage")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", exploding_save)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(tmp_path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_corrupt_checkpoint_is_reported(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match="corrupt"):
        load_checkpoint(tmp_path)
    with pytest.raises(DataError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing")


def _privopt(*args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "privopt.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


@pytest.mark.slow
def test_kill_9_then_resume_spends_the_same_epsilon(tmp_path):
    cfg_file = tmp_path / "c.json"
    d = json.loads(json.dumps(BASE))
    d["algorithm_params"]["epochs"] = 15  # long enough to be killed mid-run on a fast machine
    d["checkpoint_every"] = 2
    d["insecure_seed"] = 0  # the uninterrupted reference must draw the same noise
    cfg_file.write_text(json.dumps(d))  # JSON is valid YAML
    ref = _privopt("train", "--config", str(cfg_file), "--out", str(tmp_path / "ref"), "--quiet")
    assert ref.wait(timeout=300) == 0, ref.stderr.read()
    proc = _privopt("train", "--config", str(cfg_file), "--out", str(tmp_path / "run"), "--quiet")
    ckpt = tmp_path / "run" / "checkpoint.pt"
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (
        not (tmp_path / "run" / "record.json").exists()
        or json.loads((tmp_path / "run" / "record.json").read_text())["status"] != "finished"
    )
    res = _privopt("train", "--resume", str(tmp_path / "run"), "--quiet")
    assert res.wait(timeout=300) == 0, res.stderr.read()
    a = json.loads((tmp_path / "ref" / "record.json").read_text())
    b = json.loads((tmp_path / "run" / "record.json").read_text())
    assert b["status"] == "finished"
    assert b["privacy"]["epsilon_spent"] == pytest.approx(a["privacy"]["epsilon_spent"], rel=1e-12)
    assert b["privacy"]["ledger"] == a["privacy"]["ledger"]
    assert b["metrics"]["test_loss"] == pytest.approx(a["metrics"]["test_loss"], rel=1e-6)


def test_own_dataset_with_nan_is_rejected_before_any_output(tmp_path):
    from privopt.data import load_dataset

    data = load_dataset("digits", seed=0)
    data.x_train[3, 0] = float("nan")
    with pytest.raises(DataError, match="NaN or infinite"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, dataset=data)
    assert not (tmp_path / "run").exists()
    data = load_dataset("digits", seed=0)
    data.y_test[0] = 99
    with pytest.raises(DataError, match="labels outside"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, dataset=data)


def test_batchnorm_model_is_rejected(tmp_path):
    from torch import nn

    from privopt.errors import ModelError

    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))
    with pytest.raises(ModelError, match="BatchNorm1d"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, model=model)
    assert not (tmp_path / "run").exists()
