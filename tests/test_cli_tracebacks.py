"""stderr is a public log: the CLI prints no message or traceback of an exception it did not raise.

An exception from torch, numpy or a user's model or loss (and a warning they emit) can quote a
record. Without ``--debug`` the CLI prints one line (the type and where it was raised) and exits 4;
with ``privopt --debug`` or ``PRIVOPT_DEBUG=1`` it prints everything (docs/privacy.md).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import pytest
from torch import nn

import privopt.cli_list as cli_list
from jobs_helpers import SECRET, leak_in_worker, warn_in_worker
from privopt.cli import main
from privopt.errors import DEBUG_ENV, DataError, PrivoptWarning, public_reason
from privopt.experiments.jobs import Call, run_ordered
from privopt.models.registry import _MODELS
from privopt.quiet import foreign_error_line, public_tail


class _LeakyNet(nn.Module):
    """Fails on real records (not on privopt's all-zero probes) once training is under way, quoting
    a record in its message, as user code might."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.lin, self.calls = nn.Linear(d, k), 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 10 and bool(x.abs().sum() > 0):
            raise ValueError(f"{SECRET}: odd feature {float(x.flatten()[0]):.6f}")
        return self.lin(x.flatten(1))


def _leaky(*, input_shape, num_classes):
    d = 1
    for s in input_shape:
        d *= s
    return _LeakyNet(d, num_classes)


def _train(capsys, tmp_path, *pre):
    out = tmp_path / "run"
    argv = [*pre, "train", "--set", "dataset=digits", "--set", "model=leaky-test-net", "--out", str(out), "--quiet"]
    code = main(argv)
    return code, capsys.readouterr().err, out


@pytest.fixture(autouse=True)
def _no_debug_env_and_a_leaky_model(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setitem(_MODELS._entries, "leaky-test-net", _leaky)  # removed after each test


def test_a_user_model_error_is_one_line_without_its_message(capsys, tmp_path):
    code, err, out = _train(capsys, tmp_path)
    assert code == 4
    assert SECRET not in err and "Traceback" not in err and "odd feature" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("privopt: failed: ValueError in ")
    assert "_LeakyNet.forward" in lines[0] and "called from privopt." in lines[0] and "--debug" in lines[0]
    record = (out / "record.json").read_text()
    assert SECRET not in record and json.loads(record)["reason"].startswith("ValueError (its message is not")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_prints_the_traceback_and_message(capsys, tmp_path, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv(DEBUG_ENV, "1")
    code, err, out = _train(capsys, tmp_path, *(["--debug"] if how == "flag" else []))
    assert code == 4
    assert "Traceback (most recent call last)" in err and f"ValueError: {SECRET}: odd feature" in err
    assert SECRET not in (out / "record.json").read_text()  # the record stays public
    assert os.environ.get(DEBUG_ENV) == ("1" if how == "env" else None)  # --debug is restored after main()


def _patch_command(monkeypatch, name: str, fn) -> None:
    """Make ``privopt list`` (the cheapest command) run ``fn`` instead."""

    def command(args) -> int:
        fn()
        return 0

    monkeypatch.setattr(cli_list, name, command)


def test_a_foreign_error_in_any_command_is_one_line_and_exit_4(capsys, monkeypatch):
    def broken():
        raise KeyError(f"key {SECRET}")

    _patch_command(monkeypatch, "_cmd_list", broken)
    assert main(["list"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("privopt: failed: KeyError in ") and SECRET not in err and "Traceback" not in err


def test_user_errors_stay_one_line_with_exit_2_even_when_debugging(capsys):
    for pre in ([], ["--debug"]):
        assert main([*pre, "train", "--set", "dataset=digits"]) == 2
        err = capsys.readouterr().err
        assert err == "privopt: error: privopt train needs --out DIR (or --resume RUN_DIR)\n"


def test_a_diverged_run_says_why_in_one_line_and_its_record_names_the_error(capsys, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--set", "dataset=digits", "--set", "model=logreg", "--set", "algorithm_params.lr=1e38"]
    assert main([*argv, "--insecure-seed", "0", "--out", str(out), "--quiet"]) == 4
    assert capsys.readouterr().err.startswith("privopt: run failed: diverged at step")
    assert json.loads((out / "record.json").read_text())["reason"].startswith("RunDiverged: diverged at step")


def test_a_worker_process_error_is_one_line(capsys, monkeypatch):
    _patch_command(monkeypatch, "_cmd_list", lambda: list(run_ordered(leak_in_worker, [Call()] * 2, jobs=2)))
    assert main(["list"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("privopt: failed: RuntimeError in a worker process")
    assert SECRET not in err and "Traceback" not in err
    assert main(["--debug", "list"]) == 4
    assert f"RuntimeError: bad value in {SECRET}" in capsys.readouterr().err  # the worker's own traceback


def test_foreign_warnings_show_their_origin_not_their_text(capfd, monkeypatch):
    def warn():
        warnings.warn(f"odd value in {SECRET}", UserWarning, stacklevel=1)
        warnings.warn("privopt's own text is public", PrivoptWarning, stacklevel=1)

    _patch_command(monkeypatch, "_cmd_list", warn)
    shown = lambda message, category, *a, **k: sys.stderr.write(f"{category.__name__}: {message}\n")
    monkeypatch.setattr(warnings, "showwarning", shown)  # Python's handler (pytest's records instead)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["list"]) == 0
        err = capfd.readouterr().err
        assert "privopt: warning: UserWarning from " in err and SECRET not in err
        assert "PrivoptWarning: privopt's own text is public" in err
        assert main(["--debug", "list"]) == 0
        assert f"odd value in {SECRET}" in capfd.readouterr().err


def test_warnings_of_worker_processes_hide_their_text(capfd, monkeypatch):
    _patch_command(monkeypatch, "_cmd_list", lambda: list(run_ordered(warn_in_worker, [Call()] * 2, jobs=2)))
    assert main(["list"]) == 0
    err = capfd.readouterr().err
    assert "privopt: warning: UserWarning from " in err and SECRET not in err


def test_the_one_line_names_where_but_never_the_message():
    try:
        int(f"{SECRET}")
    except ValueError as e:
        line = foreign_error_line(e)
    assert line.startswith("ValueError in ") and "test_the_one_line_names_where" in line and SECRET not in line


def test_a_child_process_failure_is_quoted_without_its_message(monkeypatch):
    stderr = f"Traceback (most recent call last):\n  File 'x.py'\nValueError: {SECRET}\n"
    assert public_tail(stderr).startswith("ValueError (its message may quote private data")
    assert SECRET not in public_tail(stderr)
    own = "privopt: failed: ValueError in m.f (its message and traceback ...)"
    assert public_tail(f"{own}\n[torchrun] child failed\n") == own
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert public_tail(stderr) == f"ValueError: {SECRET}"


def test_data_file_errors_name_the_line_only_when_debugging(tmp_path, monkeypatch):
    from privopt.data import load_dataset

    row = ",".join(["1"] * 54 + ["3"])
    d = tmp_path / "covtype"
    d.mkdir()
    (d / "covtype.data").write_text(f"{row}\n\n{row}\n{row.replace('1', 'x', 1)}\n")
    with pytest.raises(DataError) as quiet:
        load_dataset("covertype", data_dir=tmp_path)
    assert "field 1 of some line is not a number" in str(quiet.value)
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(DataError) as debug:
        load_dataset("covertype", data_dir=tmp_path)
    assert "field 1 of line 4 is not a number" in str(debug.value)  # the file's line (blank lines counted)


def test_public_reason_keeps_privopt_messages_and_only_the_type_of_others():
    assert public_reason(DataError("x.csv: some line is bad")) == "DataError: x.csv: some line is bad"
    assert SECRET not in public_reason(ValueError(SECRET))
