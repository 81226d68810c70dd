"""The command line as a user (or an attacker of its inputs) meets it: help for every option, bad
arguments of every subcommand (a usage error or one line, never a traceback, nothing started),
SIGTERM/Ctrl-C during a reproduction, optional dependencies checked before work, quiet logs."""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import signal
import subprocess
import sys
import time

import pytest

from privopt.cli import build_parser, main
from privopt.cli_reproduce import ExperimentParser


def run(capsys, argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse usage errors and --help
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def subparsers(parser: argparse.ArgumentParser, path=()):
    """Every (command path, parser) below ``parser``, experiment parsers loaded."""
    if isinstance(parser, ExperimentParser):
        parser._load()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subparsers(sub, (*path, name))


def test_every_option_of_every_subcommand_has_help():
    missing, commands = [], 0
    for path, parser in subparsers(build_parser()):
        commands += 1
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help and action.help.strip()):
                missing.append(f"privopt {' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert commands >= 10 and not missing, missing


def test_every_option_with_a_default_says_it():
    """`--help` tells what happens when an option is left out (a user should not need the source)."""
    plain = (argparse._HelpAction, argparse._SubParsersAction, argparse._StoreTrueAction, argparse._AppendAction)
    silent = [
        f"privopt {' '.join(path)} {'/'.join(action.option_strings)}"
        for path, parser in subparsers(build_parser())
        for action in parser._actions
        if not isinstance(action, plain)
        and action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ]
    assert silent == []


def test_help_imports_no_experiment_and_no_torch():
    code = (
        "import sys\nfrom privopt.cli import main\n"
        "for argv in (['--help'], ['account', '--help'], ['reproduce', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('privopt.experiments.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.fixture
def no_work(monkeypatch):
    """Any reproduction's work starting fails the test."""
    import privopt.experiments.dpsgd_opacus as opacus_exp
    import privopt.experiments.dro as dro
    import privopt.experiments.erm_covertype as erm
    import privopt.experiments.sosp as sosp

    def started(*a, **kw):
        raise AssertionError("work started despite a bad argument")

    for module, name in ((dro, "run_dro_table3"), (dro, "run_dro_mia"), (erm, "run_erm_covertype")):
        monkeypatch.setattr(module, name, started)
    monkeypatch.setattr(opacus_exp, "run_comparison", started)
    monkeypatch.setattr(sosp, "run_sosp", started)


BAD_ARGS = [
    [],
    ["nope"],
    ["list", "--bogus"],
    ["demo", "--bogus"],
    ["bench", "--batch-sizes", "abc"],
    ["bench", "--batch-sizes", "0"],
    ["bench", "--batch-sizes", ""],
    ["bench", "--batch-sizes", "128,,512"],
    ["bench", "--repeats", "0"],
    ["bench", "--repeats", "2.5"],
    ["bench", "--threads", "-1"],
    ["bench", "--models", "foo", "--quiet"],
    ["bench", "--models", ","],
    ["train", "--insecure-seed", "x"],
    ["train", "--set", "nonsense", "--out", "OUT"],
    ["train"],
    ["train", "--resume", "OUT"],
    ["train", "--config", "TMP", "--out", "OUT"],
    ["train", "--config", "TMP/binary.yaml", "--out", "OUT"],
    ["train", "--config", "TMP/list.yaml", "--out", "OUT"],
    ["predict"],
    ["predict", "--run", "TMP", "--input", "TMP/list.yaml", "--out", "OUT"],
    ["predict", "--run", "TMP/nope", "--input", "TMP/list.yaml", "--out", "OUT"],
    ["predict", "--run", "TMP", "--input", "TMP/binary.yaml", "--out", "TMP/list.yaml"],
    ["runs"],
    ["runs", "TMP/nope"],
    ["runs", "TMP", "--csv", "OUT"],
    ["runs", "TMP", "--plot", "OUT", "--markdown", "TMP/list.yaml"],
    ["reproduce"],
    ["reproduce", "nope"],
    ["reproduce", "--plugin", "TMP/nope.py", "dro-table3", "--dataset", "digits-st", "--out", "OUT"],
    ["reproduce", "--plugin", "TMP/list.yaml", "dro-table3", "--dataset", "digits-st", "--out", "OUT"],
    ["reproduce", "--plugin", "", "sosp", "--out", "OUT"],
    ["reproduce", "--plugin"],
    ["reproduce", "sosp", "--plugin", "TMP/nope.py", "--out", "OUT"],
    ["audit", "--run", "TMP"],
    ["reproduce", "dro-table3", "--dataset", "digits-st", "--seeds", "0", "--out", "OUT"],
    ["reproduce", "dro-table3", "--dataset", "digits-st", "--seeds", "-1", "--out", "OUT"],
    ["reproduce", "dro-table3", "--dataset", "digits-st", "--epsilons", ",", "--out", "OUT"],
    ["reproduce", "dro-table3", "--dataset", "digits-st", "--epsilons", "nan", "--out", "OUT"],
    ["reproduce", "dro-table3", "--dataset", "digits-st", "--model", "foo", "--out", "OUT"],
    ["reproduce", "dro-table3", "--dataset", "nope", "--out", "OUT"],
    ["reproduce", "dro-table3", "--dataset", "digits-st"],
    ["reproduce", "dro-mia", "--budget", "huge", "--out", "OUT"],
    ["reproduce", "erm-covertype", "--data-dir", "TMP", "--seed", "-1", "--out", "OUT"],
    ["reproduce", "erm-covertype", "--data-dir", "TMP", "--epsilons", "a,b", "--out", "OUT"],
    ["reproduce", "erm-covertype", "--data-dir", "TMP", "--accountant", "exact", "--out", "OUT"],
    ["reproduce", "dpsgd-vs-opacus", "--data-dir", "TMP", "--lr", "nan", "--out", "OUT"],
    ["reproduce", "dpsgd-vs-opacus", "--data-dir", "TMP", "--epsilons", "1,-8", "--out", "OUT"],
    ["reproduce", "dpsgd-vs-opacus", "--data-dir", "TMP", "--seeds", "0", "--out", "OUT"],
    ["reproduce", "dpsgd-vs-opacus", "--data-dir", "TMP", "--insecure-seed", "-3", "--out", "OUT"],
    ["reproduce", "sosp", "--workers", "0", "--out", "OUT"],
    ["reproduce", "sosp", "--workers", "-2", "--out", "OUT"],
]


@pytest.mark.parametrize("argv", BAD_ARGS, ids=[" ".join(a) or "(none)" for a in BAD_ARGS])
def test_bad_arguments_of_every_subcommand(argv, capsys, tmp_path, no_work):
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    argv = [a.replace("TMP", str(tmp_path)).replace("OUT", str(tmp_path / "out")) for a in argv]
    code, _, err = run(capsys, argv)
    assert code == 2, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("privopt")
    assert not (tmp_path / "out").exists(), "nothing is written on a bad argument"


def test_missing_optional_dependency_is_reported_before_any_work(capsys, tmp_path, monkeypatch, no_work):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "opacus" else real(name, *a))
    argv = ["reproduce", "dpsgd-vs-opacus", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    code, _, err = run(capsys, argv)
    assert code == 2 and err.strip() == (
        "privopt: error: privopt reproduce dpsgd-vs-opacus needs opacus, which is not installed: "
        "pip install 'privopt[bench]'"
    )


def test_sigterm_inside_a_tuning_run_stops_the_reproduction(capsys, tmp_path, monkeypatch):
    """A tuning loop skips failed trials (it catches PrivoptError); a SIGTERM must still stop it."""
    import threading

    import privopt.training.run as run_module

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    runs = []

    class KillingGuard(run_module.DivergenceGuard):
        def __init__(self, model):
            super().__init__(model)
            runs.append(self)

        def on_step_end(self, state, logs):
            super().on_step_end(state, logs)
            if state.step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(run_module, "DivergenceGuard", KillingGuard)
    argv = ["reproduce", "dro-table3", "--dataset", "digits-st", "--methods", "dp-sgd", "--epsilons", "1"]
    code, _, err = run(capsys, [*argv, "--seeds", "1", "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 130 and len(runs) == 1, (code, len(runs), err)
    assert err.strip() == "privopt: interrupted (run the same command again to restart the reproduction)"


def test_sigterm_while_a_finished_run_writes_its_outputs_stops_the_reproduction(capsys, tmp_path, monkeypatch):
    """The run's signal guard defers a signal during the final commit; it must deliver it afterwards, not drop
    it (a dropped SIGTERM let the reproduction run on and exit 0)."""
    import threading

    import privopt.training.run as run_module

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    commits, real_commit = [], run_module._Session.commit

    def commit(self, status, **kw):
        commits.append(status)
        if status == "finished":
            os.kill(os.getpid(), signal.SIGTERM)
        return real_commit(self, status, **kw)

    monkeypatch.setattr(run_module._Session, "commit", commit)
    argv = ["reproduce", "dro-table3", "--dataset", "digits-st", "--methods", "dp-sgd", "--epsilons", "1"]
    code, _, err = run(capsys, [*argv, "--seeds", "1", "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 130 and commits.count("finished") == 1, (code, commits, err)
    assert err.strip() == "privopt: interrupted (run the same command again to restart the reproduction)"


@pytest.mark.slow
def test_sigterm_to_a_reproduction_process_gives_no_traceback(tmp_path):
    argv = ["reproduce", "dro-table3", "--dataset", "digits-st", "--methods", "dp-sgd,dp-double-spider"]
    # Many runs: one ε and one seed take ~8 s on a fast machine, and a SIGTERM that arrives while the
    # finished process exits (its handlers restored) kills it with -15 instead of testing anything.
    argv += ["--epsilons", "1,2,5,10", "--seeds", "3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "privopt.cli", *argv, "--out", str(tmp_path / "o")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("privopt: interrupted")
    assert "absl" not in err, "the RDP accountant's warnings do not flood the log"


def test_reproduction_progress_does_not_flood_a_log(monkeypatch, tmp_path):
    """dpsgd-vs-opacus: a bar on a terminal only; a non-terminal log gets no bar updates."""
    import privopt.experiments.dpsgd_opacus as exp

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "opacus" else real(name, *a))
    monkeypatch.setattr(exp, "_mnist_subset", lambda *a: None)
    result = {"test_accuracy": 0.9, "epsilon_spent": 1.0, "noise_multiplier": 1.0, "wall_s": 0.0}
    monkeypatch.setattr(exp, "_run_privopt", lambda *a, **kw: result)
    monkeypatch.setattr(exp, "_run_opacus", lambda *a, **kw: result)
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    exp.run_comparison(data_dir=str(tmp_path), out_dir=tmp_path / "o", epsilons=(1.0,), seeds=3, progress=True)
    assert log.getvalue() == ""


@pytest.mark.parametrize("earlier", ["results.jsonl", "privopt-eps1-seed2"])
def test_opacus_comparison_refuses_an_earlier_out_before_any_run(monkeypatch, tmp_path, earlier):
    import privopt.experiments.dpsgd_opacus as exp
    from privopt.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "opacus" else real(name, *a))
    ran = []
    monkeypatch.setattr(exp, "_mnist_subset", lambda *a: ran.append(a))
    (tmp_path / earlier).mkdir()
    with pytest.raises(ConfigError, match=f"already holds a comparison \\({earlier}\\)"):
        exp.run_comparison(data_dir=str(tmp_path), out_dir=tmp_path, epsilons=(1.0,), seeds=3, progress=False)
    assert ran == []


def test_every_reproduction_takes_quiet(monkeypatch, tmp_path, capsys):
    """erm-covertype and dpsgd-vs-opacus take --quiet like the others: no progress, nothing printed."""
    import privopt.experiments.dpsgd_opacus as opacus_exp
    import privopt.experiments.erm_covertype as erm

    seen = {}

    def fake_erm(**kw):
        seen["erm"] = kw["progress"]
        (tmp_path / "e" / "summary.md").parent.mkdir(exist_ok=True)
        (tmp_path / "e" / "summary.md").write_text("| table |\n")
        return {"methods": [], "printed": [], "selections": []}

    def fake_opacus(**kw):
        seen["opacus"] = kw["progress"]
        return []

    monkeypatch.setattr(erm, "run_erm_covertype", fake_erm)
    monkeypatch.setattr(opacus_exp, "run_comparison", fake_opacus)
    monkeypatch.setattr(opacus_exp.importlib.util, "find_spec", lambda name: object())
    for quiet in (True, False):
        flag = ["--quiet"] if quiet else []
        assert (
            main(["reproduce", "erm-covertype", "--data-dir", str(tmp_path), "--out", str(tmp_path / "e"), *flag]) == 0
        )
        printed = capsys.readouterr().out
        assert seen["erm"] is not quiet and (printed == "") is quiet
        (tmp_path / "e" / "summary.md").unlink()
        args = ["reproduce", "dpsgd-vs-opacus", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"), *flag]
        assert main(args) == 0
        assert seen["opacus"] is not quiet and capsys.readouterr().out == ""
