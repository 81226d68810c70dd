"""Crash consistency: checkpoints, resume checks, the run-directory lock, and SIGKILL at 30 points."""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from _run_helpers import cfg, ledger_epsilon, read_record
from privopt.checkpoint import load_checkpoint, save_checkpoint
from privopt.errors import ConfigError, DataError, ModelError
from privopt.training import train
from privopt.training.rundir import RunDirLock


def test_pause_and_resume_matches_uninterrupted(tmp_path):
    full = train(cfg(insecure_seed=0), out_dir=tmp_path / "full", progress=False)
    part = train(cfg(insecure_seed=0), out_dir=tmp_path / "part", progress=False, max_steps=7)
    assert part["status"] == "paused" and part["steps_done"] == 7
    assert part["privacy"]["epsilon_spent"] == ledger_epsilon(part)
    resumed = train(None, out_dir=tmp_path / "part", resume=True, progress=False)
    assert resumed["privacy"]["epsilon_spent"] == pytest.approx(full["privacy"]["epsilon_spent"], rel=1e-12)
    assert resumed["privacy"]["ledger"] == full["privacy"]["ledger"]
    assert resumed["history"] == full["history"] and resumed["metrics"] == full["metrics"]
    ma, mb = torch.load(tmp_path / "full" / "model.pt"), torch.load(tmp_path / "part" / "model.pt")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_resume_keeps_the_config_and_names_what_it_cannot_honour(tmp_path):
    train(cfg(), out_dir=tmp_path / "r", progress=False, max_steps=3)
    with pytest.raises(ConfigError, match=r"cannot honour: algorithm_params.lr \(0.5 -> 0.1\); seed \(0 -> 4\)"):
        train(cfg(algorithm_params={"lr": 0.1}, seed=4), out_dir=tmp_path / "r", resume=True, progress=False)
    rec = train(cfg(), out_dir=tmp_path / "r", resume=True, progress=False)  # the same config is fine
    assert rec["status"] == "finished"


def _own_data(shift: float = 0.0):
    from privopt.data import load_dataset

    data = load_dataset("digits", seed=0)
    data.name = "my-digits"
    data.x_train[5, 0, 0, 0] += shift
    return data


def _own_model(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


def test_resume_of_an_api_run_needs_the_same_dataset_and_model(tmp_path):
    run = tmp_path / "r"
    train(cfg(), out_dir=run, progress=False, max_steps=3, dataset=_own_data(), model=_own_model())
    with pytest.raises(ConfigError, match="dataset passed through the Python API \\('my-digits'\\)"):
        train(None, out_dir=run, resume=True, progress=False, model=_own_model())
    with pytest.raises(ConfigError, match="own model passed through the Python API"):
        train(None, out_dir=run, resume=True, progress=False, dataset=_own_data())
    with pytest.raises(DataError, match="differs from the one this run was trained on"):
        train(None, out_dir=run, resume=True, progress=False, dataset=_own_data(shift=0.5), model=_own_model())
    with pytest.raises(ModelError, match="architecture differs"):
        train(None, out_dir=run, resume=True, progress=False, dataset=_own_data(), model=_own_model(hidden=8))
    assert read_record(run)["status"] == "paused" and read_record(run)["steps_done"] == 3  # nothing was touched
    rec = train(None, out_dir=run, resume=True, progress=False, dataset=_own_data(), model=_own_model())
    assert rec["status"] == "finished" and rec["dataset"]["source"] == "api" and rec["model"]["source"] == "api"


def _smoothed_loss(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets, reduction="none", label_smoothing=0.1)


def test_a_run_on_its_own_dataset_names_it_and_resumes_from_the_same_script(tmp_path):
    """The record's config names the dataset passed in (not the config's default), and re-running
    the same call with ``resume=True`` (same config object, same dataset and loss) continues it."""
    run, config = tmp_path / "r", cfg()
    assert config.dataset == "digits"  # the default the record must not claim
    train(config, out_dir=run, progress=False, max_steps=3, dataset=_own_data(), loss=_smoothed_loss)
    assert read_record(run)["config"]["dataset"] == "my-digits"
    assert read_record(run)["config"]["loss"] == "custom"
    rec = train(config, out_dir=run, resume=True, progress=False, dataset=_own_data(), loss=_smoothed_loss)
    assert rec["status"] == "finished" and rec["config"]["dataset"] == "my-digits"


def test_resume_with_a_custom_loss_continues_the_same_run(tmp_path):
    """A run trained with its own loss is refused a resume without it, and resumed with it ends
    exactly where the uninterrupted run with that loss ends (model, ledger, ε)."""
    full = train(cfg(insecure_seed=0), out_dir=tmp_path / "full", progress=False, loss=_smoothed_loss)
    part = tmp_path / "part"
    train(cfg(insecure_seed=0), out_dir=part, progress=False, max_steps=4, loss=_smoothed_loss)
    with pytest.raises(ConfigError, match="its own loss function"):
        train(None, out_dir=part, resume=True, progress=False)
    # Another loss would get the interrupted run's noise on other sums: refused, whatever changed.
    other_smoothing = lambda o, t: nn.functional.cross_entropy(o, t, reduction="none", label_smoothing=0.2)
    weight = torch.ones(10)
    weighted = nn.CrossEntropyLoss(weight=weight, reduction="none")
    for other in (other_smoothing, weighted, lambda o, t: _smoothed_loss(o, t) * 2):
        with pytest.raises(ConfigError, match="loss function differs"):
            train(None, out_dir=part, resume=True, progress=False, loss=other)
    assert read_record(part)["steps_done"] == 4  # nothing was touched
    rec = train(None, out_dir=part, resume=True, progress=False, loss=_smoothed_loss)
    assert rec["status"] == "finished" and rec["config"]["loss"] == full["config"]["loss"] == "custom"
    assert rec["privacy"]["ledger"] == full["privacy"]["ledger"]
    assert rec["privacy"]["epsilon_spent"] == full["privacy"]["epsilon_spent"]
    ma, mb = torch.load(tmp_path / "full" / "model.pt"), torch.load(part / "model.pt")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_config_dataset_is_verified_on_resume(tmp_path, monkeypatch):
    import privopt.data

    train(cfg(), out_dir=tmp_path / "r", progress=False, max_steps=3)
    real = privopt.data.load_dataset

    def changed_files(*a, **kw):  # the data files changed on disk between the runs
        data = real(*a, **kw)
        data.x_train[0, 0, 0, 0] += 1.0
        return data

    monkeypatch.setattr(privopt.data, "load_dataset", changed_files)
    with pytest.raises(DataError, match="dataset differs"):
        train(None, out_dir=tmp_path / "r", resume=True, progress=False)


def test_resume_of_a_finished_run_rewrites_its_outputs(tmp_path):
    run = tmp_path / "r"
    rec = train(cfg(algorithm_params={"epochs": 1}), out_dir=run, progress=False)
    model = (run / "model.pt").read_bytes()
    for name in ("record.json", "model.pt", "metrics.csv", "curves.png"):
        (run / name).unlink()
    again = train(None, out_dir=run, resume=True, progress=False)
    assert again == json.loads(json.dumps(rec)) == read_record(run)
    assert (run / "model.pt").read_bytes() == model and (run / "curves.png").exists()


def test_a_stale_record_is_replaced_from_the_checkpoint(tmp_path):
    """The issue-14 case: a run interrupted earlier, then killed between writing its finished
    checkpoint and its record. The resume must report the finished run's ε, not the stale one."""
    run = tmp_path / "r"
    train(cfg(insecure_seed=1), out_dir=run, progress=False, max_steps=4)
    stale = (run / "record.json").read_text()
    final = train(None, out_dir=run, resume=True, progress=False)
    (run / "record.json").write_text(stale)  # as if killed right after the finished checkpoint
    (run / "model.pt").unlink()
    assert read_record(run)["privacy"]["epsilon_spent"] < final["privacy"]["epsilon_spent"]
    again = train(None, out_dir=run, resume=True, progress=False)
    assert read_record(run)["status"] == "finished" and again["privacy"] == final["privacy"]
    assert (run / "model.pt").exists()


def test_a_run_directory_is_locked_while_a_run_owns_it(tmp_path):
    run = tmp_path / "r"
    with RunDirLock(run), pytest.raises(ConfigError, match=rf"in use by another privopt run \(pid {os.getpid()}\)"):
        train(cfg(), out_dir=run, progress=False)
    assert sorted(os.listdir(run)) == []  # the refused run wrote nothing, the owner removed its lock
    train(cfg(algorithm_params={"epochs": 1}), out_dir=run, progress=False, max_steps=2)
    with RunDirLock(run), pytest.raises(ConfigError, match="in use"):
        train(None, out_dir=run, resume=True, progress=False)
    with pytest.raises(ConfigError, match="already holds a run.*--resume"):
        train(cfg(), out_dir=run, progress=False)


def test_existing_output_dir_with_other_files_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="already holds files"):
        train(cfg(), out_dir=tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "x").read_text() == "keep me"


def test_killed_before_the_first_checkpoint_restarts_cleanly(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / ".privopt.lock").write_text("12345\n")
    (run / ".checkpoint.pt.abcd.tmp").write_bytes(b"half a checkpoint")
    with pytest.raises(DataError, match="holds no checkpoint.*nothing was published.*start it again"):
        train(None, out_dir=run, resume=True, progress=False)
    rec = train(cfg(algorithm_params={"epochs": 1}), out_dir=run, progress=False)
    assert rec["status"] == "finished" and not list(run.glob(".*.tmp"))


def test_resume_needs_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        train(None, out_dir=tmp_path / "missing", resume=True, progress=False)
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        train(None, out_dir=tmp_path / "f", resume=True, progress=False)
    with pytest.raises(ConfigError, match="needs a RunConfig"):
        train(None, out_dir=tmp_path / "new", progress=False)


def test_resume_of_a_folder_that_is_not_a_run_is_refused_and_left_untouched(tmp_path):
    """Not 'start it again with the same output directory' (its files would refuse that), and no lock
    file left behind in the user's folder."""
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"not a privopt run directory \(no checkpoint.pt; it holds notes.txt\)"):
        train(None, out_dir=folder, resume=True, progress=False)
    assert sorted(os.listdir(folder)) == ["notes.txt"]


def test_crash_while_saving_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"step": 1})
    real_write = os.write

    def disk_full(fd, data):
        real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(tmp_path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(tmp_path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_corrupt_or_foreign_checkpoint_is_reported(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match="corrupt"):
        load_checkpoint(tmp_path)
    with pytest.raises(DataError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing")
    save_checkpoint(tmp_path, {"step": 3, "config": {}})  # an older privopt's layout
    with pytest.raises(DataError, match="an earlier version of privopt"):
        train(None, out_dir=tmp_path, resume=True, progress=False)


# ------------------------------------------------------------------------- SIGKILL at 30 points
KILL_CFG = dict(
    algorithm_params={"epochs": 1, "batch_size": 100},
    privacy={"accountant": "rdp"},
    insecure_seed=0,
    checkpoint_every=3,
    eval_every=5,
    plots=False,
)


def _instrument(kill_at: int | None, events: list[str]) -> None:
    """In a forked child: count every step and every low-level write / fsync / rename, and
    SIGKILL the process at event number ``kill_at`` (a write is cut in half first)."""
    import privopt.training.run as run_module

    real_write, real_fsync, real_replace, real_loop = os.write, os.fsync, os.replace, run_module.run_loop

    def name(fd) -> str:
        try:
            return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return "?"

    def hit(label: str) -> None:
        events.append(label)
        if len(events) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def write(fd, data):
        if len(events) + 1 == kill_at:
            real_write(fd, bytes(data[: max(1, len(data) // 2)]))
        hit(f"write {name(fd)}")
        return real_write(fd, data)

    def fsync(fd):
        hit(f"fsync {name(fd)}")
        return real_fsync(fd)

    def replace(src, dst):
        hit(f"replace-before {os.path.basename(dst)}")
        real_replace(src, dst)
        hit(f"replace-after {os.path.basename(dst)}")

    def run_loop(step, state, callbacks):  # counts the steps without touching the algorithm's code, which a
        def counted(t):  # resume checks against its fingerprint
            hit(f"step {t}")
            return step(t)

        return real_loop(counted, state, callbacks)

    os.write, os.fsync, os.replace, run_module.run_loop = write, fsync, replace, run_loop


def _in_child(fn) -> int:
    """Run ``fn`` in a forked process; returns its wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def _kill_points(events: list[str], rng) -> list[int]:
    """30 event numbers (1-based): inside checkpoint writes, inside record writes, other outputs, steps."""
    groups = {
        "checkpoint": [i for i, e in enumerate(events) if "checkpoint.pt" in e],
        "record": [i for i, e in enumerate(events) if "record.json" in e],
        "outputs": [
            i for i, e in enumerate(events) if e.split()[0] != "step" and "checkpoint" not in e and "record" not in e
        ],
        "steps": [i for i, e in enumerate(events) if e.startswith("step")],
    }
    quota = {"checkpoint": 9, "record": 8, "outputs": 4, "steps": 9}
    points = []
    for g, idx in groups.items():
        points += list(rng.choice(idx, size=min(quota[g], len(idx)), replace=False))
    return sorted(int(i) + 1 for i in points)


def _check_after_kill(run: Path) -> None:
    if (run / "record.json").exists():
        rec = read_record(run)
        assert rec["privacy"]["epsilon_spent"] == ledger_epsilon(rec)  # never an ε other than its ledger's
        assert rec["steps_done"] <= load_checkpoint(run)["step"]  # the checkpoint commits first


def _finish(run: Path, c) -> dict:
    try:
        return train(None, out_dir=run, resume=True, progress=False)
    except DataError as e:  # killed inside the very first checkpoint: a clear refusal, then a clean restart
        assert "holds no checkpoint" in str(e)
        assert not (run / "record.json").exists() and not (run / "checkpoint.pt").exists()
        return train(c, out_dir=run, progress=False)


@pytest.mark.slow
def test_sigkill_at_30_points_always_resumes_to_the_uninterrupted_run(tmp_path):
    c = cfg(**KILL_CFG)
    ref = train(c, out_dir=tmp_path / "ref", progress=False)
    ref_model = torch.load(tmp_path / "ref" / "model.pt")
    log = tmp_path / "events.json"

    def count():
        events: list[str] = []
        _instrument(None, events)
        train(c, out_dir=tmp_path / "count", progress=False)
        log.write_text(json.dumps(events))

    assert _in_child(count) == 0
    events = json.loads(log.read_text())
    points = _kill_points(events, np.random.default_rng(14))
    assert len(points) == 30
    for k in points:
        run = tmp_path / f"kill-{k}"
        status = _in_child(lambda k=k, run=run: (_instrument(k, []), train(c, out_dir=run, progress=False)))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"not killed at {events[k - 1]}"
        _check_after_kill(run)
        rec = _finish(run, c)
        assert rec["status"] == "finished", events[k - 1]
        assert rec["privacy"] == ref["privacy"] and rec["history"] == ref["history"], events[k - 1]
        assert read_record(run)["privacy"]["epsilon_spent"] == ledger_epsilon(rec)
        model = torch.load(run / "model.pt")
        assert all(torch.equal(model[n], ref_model[n]) for n in ref_model), events[k - 1]
