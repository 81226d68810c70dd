"""`privopt runs` / `privopt.compare_runs`: a sweep's run records side by side."""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from privopt.api import compare_runs, load_run
from privopt.cli import main
from privopt.errors import ConfigError
from privopt.runlock import ENDED, LOCK_NAME, OwnerState
from privopt.training import train
from privopt.training.rundir import RunDirLock

SWEEP = {"eps1": (1.0, 0.1), "eps4": (4.0, 0.4), "eps2": (2.0, 0.2)}  # name: (epsilon, lr)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Three tiny seeded DP-SGD runs on digits (one epoch each), of different ε and lr."""
    root = tmp_path_factory.mktemp("sweep")
    for name, (eps, lr) in SWEEP.items():
        argv = ["train", "--out", str(root / name), "--insecure-seed", "0", "--quiet"]
        argv += ["--set", "algorithm_params.epochs=1", "--set", f"privacy.epsilon={eps}"]
        argv += ["--set", f"algorithm_params.lr={lr}", "--set", "plots=false"]
        assert main(argv) == 0
    return root


def run(capsys, argv):
    try:
        code = main(["runs", *map(str, argv)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out):
    """The printed table's rows as dicts, cut at the header's column positions (a cell may be empty)."""
    lines = out.splitlines()
    names, starts = lines[0].split(), [m.start() for m in re.finditer(r"\S+", lines[0])]
    rows = []
    for line in lines[1:]:
        if line.startswith("* ") or not line:  # the footnote, the hints after the table
            break
        rows.append({n: line[a:b].strip() for n, a, b in zip(names, starts, [*starts[1:], None])})
    return rows


def records(root):
    return {p.name: json.loads((p / "record.json").read_text()) for p in sorted(root.iterdir())}


def test_the_table_shows_one_row_per_run_and_only_the_differing_hyperparameters(sweep, capsys):
    code, out, err = run(capsys, [sweep])
    assert code == 0 and err == ""
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:8] == ["run", "algorithm", "model", "dataset", "epsilon", "delta", "status", "lr"]
    assert "momentum" not in header and "batch_size" not in header  # the same in every run
    assert header[8:] == ["test_accuracy", "test_balanced_accuracy", "wall_time_s"]
    rows = [line.split() for line in lines[1:4]]
    assert [r[0] for r in rows] == ["eps1", "eps2", "eps4"]  # found in name order
    assert [(r[4], r[7]) for r in rows] == [("1*", "0.1"), ("2*", "0.2"), ("4*", "0.4")]
    assert all(r[1:4] == ["dp-sgd", "mlp", "digits"] and r[6] == "finished" for r in rows)
    recs = records(sweep)
    assert [r[8] for r in rows] == [f"{recs[n]['metrics']['test_accuracy']:.4f}" for n in ("eps1", "eps2", "eps4")]
    assert lines[4].startswith("* noise and sampling seeded by --insecure-seed: NOT private")


def test_sort_and_json(sweep, capsys):
    code, out, _ = run(capsys, [sweep, "--sort", "test_accuracy", "--reverse", "--json"])
    rows = json.loads(out)
    assert code == 0 and len(rows) == 3
    accs = [r["test_accuracy"] for r in rows]
    assert accs == sorted(accs, reverse=True)
    recs = records(sweep)
    for r in rows:
        rec = recs[r["run"]]
        assert r["epsilon"] == rec["privacy"]["epsilon_guarantee"] and r["delta"] == 1e-5
        assert r["lr"] == SWEEP[r["run"]][1] and r["insecure_seed"] == 0 and r["private"] is True
        assert "momentum" not in r
    code, out, _ = run(capsys, [sweep, "--sort", "epsilon", "--json"])
    assert [r["run"] for r in json.loads(out)] == ["eps1", "eps2", "eps4"]
    code, _, err = run(capsys, [sweep, "--sort", "momentum"])
    assert code == 2 and err.startswith("privopt: error: cannot sort by 'momentum': the columns are run, algorithm")


def test_csv_markdown_and_plot_files(sweep, capsys, tmp_path):
    out = {k: tmp_path / f"t.{k}" for k in ("csv", "md", "png")}
    argv = [sweep, "--sort", "epsilon", "--csv", out["csv"], "--markdown", out["md"], "--plot", out["png"]]
    code, printed, _ = run(capsys, argv)
    assert code == 0 and printed.startswith("run ")
    table = list(csv.DictReader(io.StringIO(out["csv"].read_text())))
    assert [r["run"] for r in table] == ["eps1", "eps2", "eps4"]
    first = ["run", "algorithm", "model", "dataset", "epsilon", "delta", "status", "lr"]
    assert list(table[0]) == [*first, "test_accuracy", "test_balanced_accuracy", "wall_time_s", "insecure_seed"]
    recs = records(sweep)
    assert float(table[2]["test_accuracy"]) == recs["eps4"]["metrics"]["test_accuracy"]  # unrounded
    assert table[0]["insecure_seed"] == "0" and float(table[1]["lr"]) == 0.2
    md = out["md"].read_text().splitlines()
    assert md[0].startswith("| run | algorithm | model | dataset | epsilon | delta | status | lr |")
    assert md[1].startswith("|---|") and md[2].startswith("| eps1 | dp-sgd | mlp | digits | 1\\* | 1e-05 | finished |")
    assert md[-1].startswith("\\* noise and sampling seeded")
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # an existing output is refused before anything is written
    new = tmp_path / "new.csv"
    code, _, err = run(capsys, [sweep, "--csv", new, "--markdown", out["md"]])
    assert code == 2 and f"--markdown {out['md']} exists" in err and not new.exists()


def test_a_metric_column_and_its_plot(sweep, capsys, tmp_path):
    code, out, _ = run(capsys, [sweep, "--metric", "test_roc_auc", "--plot", tmp_path / "auc.png"])
    assert code == 0 and out.splitlines()[0].split()[-2:] == ["test_roc_auc", "wall_time_s"]
    assert (tmp_path / "auc.png").is_file()
    code, _, err = run(capsys, [sweep, "--metric", "test_nope", "--plot", tmp_path / "x.png"])
    assert code == 2 and "no run has the metric 'test_nope'; the runs' test metrics are test_accuracy" in err
    assert not (tmp_path / "x.png").exists()


@pytest.fixture
def messy(sweep, tmp_path):
    """A parent folder: two runs one level down, one two levels down, a paused and a failed run, a folder
    without a record and a corrupt record."""
    for name in ("eps1", "eps2"):
        shutil.copytree(sweep / name, tmp_path / name)
    shutil.copytree(sweep / "eps4", tmp_path / "more" / "eps4")
    base = json.loads((sweep / "eps1" / "record.json").read_text())
    edits = {
        "paused": {"status": "paused", "privopt_version": "0.0.9"},
        "failed": {"status": "failed", "reason": "diverged"},
        "nonpriv": {"privacy": {"private": False, "epsilon_spent": None, "delta": None},
                    "metrics": {"test_accuracy": 0.9, "test_worst_group_accuracy": 0.5}},
        "odd": {"wall_time_s": "abc", "randomness": [], "metrics": {"test_accuracy": "n/a"}, "hyperparameters": 3},
    }  # fmt: skip
    for name, edit in edits.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps({**base, **edit}))
    (tmp_path / "notes").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "record.json").write_text('{"config": ')
    return tmp_path


def test_skipped_corrupt_paused_failed_and_odd_runs(messy, capsys, tmp_path_factory):
    code, out, err = run(capsys, [messy, "--json"])
    assert code == 0
    rows = {r["run"]: r for r in json.loads(out)}
    assert sorted(rows) == ["eps1", "eps2", "failed", "more/eps4", "nonpriv", "odd", "paused"]
    assert rows["paused"]["status"] == "paused" and rows["failed"]["reason"] == "diverged"
    assert rows["nonpriv"]["epsilon"] is None and rows["nonpriv"]["private"] is False
    assert err.splitlines() == [
        f"privopt: skipped unreadable record {messy / 'corrupt' / 'record.json'}: not valid JSON",
        "privopt: skipped 1 folder without a record.json",
    ]
    png = tmp_path_factory.mktemp("plot") / "acc.png"
    code, out, err = run(capsys, [messy, "--sort", "test_accuracy", "--plot", png])
    assert code == 0 and png.is_file()
    assert "privopt: the plot leaves out 2 run(s) without an epsilon or the metric" in err  # nonpriv, odd
    header = out.splitlines()[0].split()
    assert header[-3:] == ["test_worst_group_accuracy", "wall_time_s", "privopt_version"]  # mixed versions: shown
    cells = {r["run"]: r for r in table_rows(out)}
    assert list(cells)[-2:] == ["nonpriv", "odd"]  # numbers, then text
    assert {name: c["status"] for name, c in cells.items()} == {
        "eps1": "finished", "eps2": "finished", "failed": "failed", "more/eps4": "finished", "paused": "paused",
        "nonpriv": "finished", "odd": "finished",
    }  # fmt: skip
    assert (cells["nonpriv"]["epsilon"], cells["nonpriv"]["delta"], cells["nonpriv"]["test_worst_group_accuracy"]) == (
        "non-private",
        "",
        "0.5000",
    )
    assert (cells["odd"]["test_accuracy"], cells["odd"]["wall_time_s"], cells["paused"]["privopt_version"]) == (
        "n/a",
        "abc",
        "0.0.9",
    )


def test_run_folders_given_one_by_one_and_duplicates(sweep, capsys):
    code, out, _ = run(capsys, [sweep / "eps2", sweep / "eps1" / "record.json", sweep, "--json"])
    assert code == 0 and [r["run"] for r in json.loads(out)] == ["eps2", "eps1", "eps4"]


def test_no_runs_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = run(capsys, [tmp_path / "empty", "--csv", tmp_path / "t.csv"])
    assert (code, out) == (2, "") and not (tmp_path / "t.csv").exists()
    said = f"privopt: error: no readable run record in {tmp_path / 'empty'} (a run folder holds record.json)"
    assert err.strip() == said
    code, _, err = run(capsys, [tmp_path / "nope"])
    assert code == 2 and "nope is not a run folder, a record.json or a folder holding runs" in err
    code, _, err = run(capsys, [])
    assert code == 2 and "the following arguments are required: DIR" in err


def test_it_reads_only_the_records(sweep, monkeypatch):
    opened = []
    real = io.open

    def spy(file, *a, **kw):
        opened.append(str(file))
        return real(file, *a, **kw)

    monkeypatch.setattr(io, "open", spy)
    table = compare_runs([sweep])
    assert len(table.rows) == 3
    assert opened and all(path.endswith("record.json") for path in opened), opened


def test_config_settings_that_differ_get_a_column_and_shared_ones_do_not(tmp_path):
    from privopt.api.run_table import compare_runs

    for seed, hidden in ((0, 8), (1, 8)):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        record = {
            "config": {"seed": seed, "model_params": {"hidden": hidden}, "device": f"cuda:{seed}", "data_dir": None},
            "algorithm": "sgd",
            "hyperparameters": {"lr": 0.1},
            "model": {"name": "mlp"},
            "dataset": {"name": "digits"},
            "privacy": {"private": False},
            "metrics": {"test_accuracy": 0.5},
            "status": "finished",
        }
        (d / "record.json").write_text(json.dumps(record))
    table = compare_runs([tmp_path])
    assert "seed" in table.columns and [r["seed"] for r in table.rows] == [0, 1]
    assert "model_params.hidden" not in table.columns and "lr" not in table.columns  # the same in both
    assert "device" not in table.columns  # how a run was carried out, not what it trained


def test_a_config_setting_set_in_one_run_and_unset_in_another_gets_a_column(tmp_path):
    """A run with ``logit_adjustment: {noise_ratio: 10}`` beside one with ``{}`` (and ``model_params``
    set in one run only) differ in what they trained: the table must say so, not look alike."""
    from privopt.api.run_table import compare_runs

    runs = (("plain", {}, "csv"), ("adjusted", {"logit_adjustment": {"noise_ratio": 10.0}}, "csv"), ("d", {}, "digits"))
    for name, extra, dataset in runs:
        d = tmp_path / name
        d.mkdir()
        model_params = {"hidden": 8} if extra else {}
        config = {"seed": 0, "model_params": model_params, "logit_adjustment": {}, "feature_centering": {}, **extra}
        config["dataset_params"] = {"path": "x.csv", "label": {"column": "y"}} if dataset == "csv" else {}
        record = {
            "config": config,
            "algorithm": "dp-sgd",
            "hyperparameters": {"lr": 0.1},
            "model": {"name": "mlp"},
            "dataset": {"name": dataset},
            "privacy": {"private": True, "epsilon_guarantee": 1.0, "delta": 1e-5},
            "metrics": {"test_accuracy": 0.5},
            "status": "finished",
        }
        (d / "record.json").write_text(json.dumps(record))
    table = compare_runs([tmp_path])
    assert "logit_adjustment.noise_ratio" in table.columns and "model_params.hidden" in table.columns
    rows = {r["run"]: r for r in table.rows}
    assert rows["adjusted"]["logit_adjustment.noise_ratio"] == 10.0 and rows["adjusted"]["model_params.hidden"] == 8
    assert rows["plain"]["logit_adjustment.noise_ratio"] is None and rows["plain"]["model_params.hidden"] is None
    assert "seed" not in table.columns and "lr" not in table.columns and "feature_centering" not in table.columns
    assert not any(c.startswith("dataset_params") for c in table.columns)  # the csv runs' own, alike in both
    assert "_cfg" not in rows["plain"]


# ------------------------------------------------------------------ a run's status now, not only as recorded

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
# Owns a run directory as a run does (privopt.runlock alone: no torch), until killed.
OWNER = """
import fcntl, os, sys, time
from privopt.runlock import owner_text
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, owner_text().encode(), 0)
print("locked", flush=True)
time.sleep(60)
"""


def recorded(sweep, folder, status="running", checkpoint=True):
    """A run folder whose record says ``status`` (a copy of a sweep run's), with a checkpoint.pt or not."""
    folder.mkdir(parents=True)
    record = json.loads((sweep / "eps1" / "record.json").read_text())
    (folder / "record.json").write_text(json.dumps({**record, "status": status}))
    if checkpoint:
        (folder / "checkpoint.pt").write_bytes(b"")  # only whether it exists is looked at
    return folder


def row(folder):
    return compare_runs([folder]).rows[0]


def test_a_train_killed_mid_run_is_shown_interrupted_with_how_to_resume(tmp_path, capsys):
    """A real `privopt train`, SIGKILLed while it trains: its record says running for ever."""
    out = tmp_path / "r"
    argv = [sys.executable, "-m", "privopt", "train", "--out", str(out), "--insecure-seed", "0", "--quiet"]
    argv += ["--set", "model=logreg", "--set", "algorithm_params.epochs=2000", "--set", "plots=false"]
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "record.json").exists():  # the first commit, before the first step
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        live = json.loads(run(capsys, [out, "--json"])[1])[0]
        assert (live["status"], live["record_status"], live["resume"], live["host"]) == (
            "running", "running", None, socket.gethostname()
        )  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and json.loads((out / "record.json").read_text())["status"] == "running"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, out_text, err = run(capsys, [out])
    assert code == 0 and err == "" and table_rows(out_text)[0]["status"] == "interrupted"
    hint = "r (interrupted): its process ended while its record said running (killed, out of memory or a reboot?)"
    assert out_text.splitlines()[-1] == f"{hint}; resume with: privopt train --resume {out}"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # a listing: nothing written
    with pytest.raises(ConfigError, match=r"status 'running', interrupted now.*resume it with privopt train --resume"):
        load_run(out)
    assert train(None, out_dir=out, resume=True, progress=False, max_steps=1)["status"] == "paused"  # as the hint says


def test_a_live_owner_is_running_and_a_killed_one_interrupted(sweep, tmp_path):
    folder = recorded(sweep, tmp_path / "r")
    with RunDirLock(folder):  # this process owns the folder: the run lives
        assert (row(folder)["status"], row(folder)["host"]) == ("running", socket.gethostname())
        with pytest.raises(ConfigError, match=r"status 'running', step .*: it has no released model yet; wait for"):
            load_run(folder)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder / LOCK_NAME)], env=ENV, stdout=subprocess.PIPE)
    try:
        assert owner.stdout.readline().strip() == b"locked" and row(folder)["status"] == "running"
    finally:
        owner.kill()
        owner.wait()
    r = row(folder)
    assert (r["status"], r["record_status"]) == ("interrupted", "running")
    assert r["resume"] == f"privopt train --resume {folder}"
    table = compare_runs([folder])
    assert "interrupted" in table.markdown() and "resume" not in table.markdown() + table.csv()  # no local paths
    assert socket.gethostname() not in table.markdown() + table.csv()


def test_a_running_record_with_no_lock_file_is_interrupted(sweep, tmp_path):
    """The owner makes its lock file before the first record and removes it after the last: without
    one no process owns the folder (e.g. the last write failed); without a checkpoint: no resume."""
    r = row(recorded(sweep, tmp_path / "r", checkpoint=False))
    assert (r["status"], r["resume"], r["host"]) == ("interrupted", None, None)
    assert r["status_note"].startswith("no process owns its folder while its record says running")


@pytest.mark.parametrize("case", ["other host", "earlier privopt", "no locks"])
def test_a_run_this_machine_cannot_check_is_unknown_never_interrupted(sweep, tmp_path, monkeypatch, capsys, case):
    folder = recorded(sweep, tmp_path / "r")
    owner = {"pid": 1, "host": socket.gethostname(), "boot_id": None}
    if case == "other host":  # a shared folder seen from another machine: its lock may not be seen here
        owner = {"pid": 1, "host": "node-elsewhere", "boot_id": "another-kernel"}
    (folder / LOCK_NAME).write_text("1234\n" if case == "earlier privopt" else json.dumps(owner))
    if case == "no locks":

        def no_locks(fd, op):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

        monkeypatch.setattr(fcntl, "flock", no_locks)
    r = row(folder)
    assert (r["status"], r["record_status"], r["resume"]) == ("unknown", "running", None)
    why = {"other host": "it ran on host node-elsewhere", "earlier privopt": "names no host", "no locks": "lock files"}
    assert why[case] in r["status_note"]
    code, out, _ = run(capsys, [folder])
    assert code == 0 and table_rows(out)[0]["status"] == "unknown" and f"r (unknown): {r['status_note']}" in out


def test_a_paused_run_being_resumed_is_running(sweep, tmp_path):
    folder = recorded(sweep, tmp_path / "p", status="paused")
    r = row(folder)
    assert (r["status"], r["resume"]) == ("paused", f"privopt train --resume {folder}")
    with RunDirLock(folder):  # a resume owns it: its record says paused until its first commit
        assert (row(folder)["status"], row(folder)["resume"]) == ("running", None)


def test_a_run_that_ends_or_starts_while_it_is_looked_at_is_not_called_interrupted(sweep, tmp_path, monkeypatch):
    """No owner at the first look, then a record read again (a run that just ended wrote its final one)
    and a second look (a resume that just started owns the folder)."""
    import privopt.api.run_status as run_status

    folder = recorded(sweep, tmp_path / "r")
    real = run_status.owner_state

    def finishes(path):
        record = json.loads((folder / "record.json").read_text())
        (folder / "record.json").write_text(json.dumps({**record, "status": "finished"}))
        return OwnerState(ENDED)

    monkeypatch.setattr(run_status, "owner_state", finishes)
    assert (row(folder)["status"], row(folder)["host"]) == ("finished", None)
    folder = recorded(sweep, tmp_path / "s")
    looks = []

    def starts(path):
        looks.append(path)
        return OwnerState(ENDED) if len(looks) == 1 else real(path)

    monkeypatch.setattr(run_status, "owner_state", starts)
    with RunDirLock(folder):
        assert row(folder)["status"] == "running" and len(looks) == 2
