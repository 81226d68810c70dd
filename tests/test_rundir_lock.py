"""The run directory's lock file: held while a run owns the directory, gone when the run ends."""

import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
import torch

import privopt
from _run_helpers import cfg
from privopt.cli import main
from privopt.data import Dataset
from privopt.errors import ConfigError
from privopt.runlock import parse_owner
from privopt.training import RunDiverged, train
from privopt.training.rundir import LOCK_NAME, RunDirLock

QUICK = ["--set", "model=logreg", "--set", "algorithm_params.epochs=1", "--set", "algorithm_params.batch_size=100"]

# Holds the lock from another process until killed.
HOLDER = """
import sys, time
from privopt.training.rundir import RunDirLock
with RunDirLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def _tiny_data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    return Dataset.from_tensors(x[:200], y[:200], x_test=x[200:], y_test=y[200:], num_classes=2)


def test_a_cli_run_leaves_no_lock(capsys, tmp_path):
    out = tmp_path / "r"
    assert main(["train", *QUICK, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert (out / "record.json").exists() and not (out / LOCK_NAME).exists()


def test_a_paused_run_and_its_resume_leave_no_lock(tmp_path):
    run = tmp_path / "r"
    assert train(cfg(insecure_seed=0), out_dir=run, progress=False, max_steps=3)["status"] == "paused"
    assert (run / "checkpoint.pt").exists() and not (run / LOCK_NAME).exists()
    assert train(None, out_dir=run, resume=True, progress=False)["status"] == "finished"
    assert not (run / LOCK_NAME).exists()


def test_fit_and_a_failed_run_leave_no_lock(tmp_path):
    rec = privopt.fit(
        model=torch.nn.Linear(4, 2), dataset=_tiny_data(), epsilon=1.0, delta=1e-4, out_dir=tmp_path / "fit", epochs=1
    )
    assert rec["status"] == "finished" and (tmp_path / "fit" / "record.json").exists()
    assert not (tmp_path / "fit" / LOCK_NAME).exists()
    with pytest.raises(RunDiverged):
        train(cfg(algorithm_params={"lr": 1e38}, insecure_seed=0), out_dir=tmp_path / "bad", progress=False)
    assert (tmp_path / "bad" / "record.json").exists() and not (tmp_path / "bad" / LOCK_NAME).exists()


def test_another_process_owning_the_directory_refuses_a_run_until_it_dies(tmp_path):
    run = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"in use by another privopt run \(pid {holder.pid}\)"):
            train(cfg(algorithm_params={"epochs": 1}), out_dir=run, progress=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    owner = parse_owner((run / LOCK_NAME).read_bytes())  # a killed owner leaves its file...
    assert (owner["pid"], owner["host"]) == (holder.pid, socket.gethostname())
    rec = train(cfg(algorithm_params={"epochs": 1}), out_dir=run, progress=False, max_steps=2)
    assert rec["status"] == "paused" and not (run / LOCK_NAME).exists()  # ...which the next run takes over


@pytest.mark.parametrize("replaced", [False, True])
def test_a_lock_taken_on_a_file_its_owner_just_removed_is_taken_again(tmp_path, monkeypatch, replaced):
    """A process that opened the lock file before its owner removed it, and locked it after, holds
    a file no longer at the path (none, or a new one another process created): it must lock the one
    at the path, or two runs would own the folder."""
    run = tmp_path / "r"
    first = RunDirLock(run).__enter__()
    stale = os.open(run / LOCK_NAME, os.O_RDWR)
    first.__exit__(None, None, None)
    assert not (run / LOCK_NAME).exists()
    if replaced:
        (run / LOCK_NAME).write_text("")
    opened = []
    real = RunDirLock._open_and_lock

    def open_stale_first(self):
        opened.append(1)
        return stale if len(opened) == 1 else real(self)

    monkeypatch.setattr(RunDirLock, "_open_and_lock", open_stale_first)
    with RunDirLock(run):
        assert len(opened) == 2 and parse_owner((run / LOCK_NAME).read_bytes())["pid"] == os.getpid()
        monkeypatch.setattr(RunDirLock, "_open_and_lock", real)
        with pytest.raises(ConfigError, match="in use"), RunDirLock(run):
            pass
    assert not (run / LOCK_NAME).exists()


def test_the_lock_file_names_the_owner_and_nothing_of_the_data(tmp_path):
    with RunDirLock(tmp_path / "r"):
        owner = parse_owner((tmp_path / "r" / LOCK_NAME).read_bytes())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert parse_owner(b"1234\n") == {"pid": 1234, "host": None, "boot_id": None}  # an earlier privopt's
    assert parse_owner(b"") == parse_owner(b"[1]") == {"pid": None, "host": None, "boot_id": None}


def test_a_run_waits_out_the_instant_privopt_runs_looks_at_its_lock(tmp_path):
    """`privopt runs` holds a shared lock for an instant to see whether a run lives: a run or resume
    starting then must not be refused as 'in use'."""
    run = tmp_path / "r"
    run.mkdir()
    (run / LOCK_NAME).write_text("")
    fd = os.open(run / LOCK_NAME, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    timer = threading.Timer(0.1, os.close, [fd])  # closing the file releases the lock
    timer.start()
    try:
        with RunDirLock(run):
            assert parse_owner((run / LOCK_NAME).read_bytes())["pid"] == os.getpid()
    finally:
        timer.join()


def test_a_file_system_without_locks_is_named_not_taken_for_another_run(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ConfigError, match="cannot lock the run directory .*No locks available.*file locks") as err:
        RunDirLock(tmp_path / "r").__enter__()
    assert "in use" not in str(err.value)
