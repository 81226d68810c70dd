"""The command line: account reference values, list, train (user errors: one line and an exit code)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from privopt.cli import main
from privopt.config import RunConfig, apply_overrides, load_config, yaml_load
from privopt.errors import ConfigError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_account_reference_values(capsys):
    """Reference value from dp_accounting: q = 0.1, 512 steps, delta = 1e-6, eps = 1 needs z = 9.662 (PLD)."""
    code, out, _ = run(
        capsys,
        "account",
        "--dataset-size",
        "10000",
        "--batch-size",
        "1000",
        "--steps",
        "512",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--json",
    )
    assert code == 0
    res = json.loads(out)
    assert res["noise_multiplier"] == pytest.approx(9.662, abs=0.0015)
    assert res["epsilon"] <= 1.0 and res["accountant"] == "pld"
    assert {"noise_multiplier", "epsilon", "delta", "accountant"} <= set(res)


def test_account_text_and_rdp(capsys):
    code, out, _ = run(
        capsys,
        "account",
        "--dataset-size",
        "60000",
        "--batch-size",
        "256",
        "--steps",
        "1000",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--accountant",
        "rdp",
    )
    assert code == 0 and "noise multiplier" in out and "RDP" in out


def test_account_text_shows_a_small_epsilon(capsys):
    """A target of 1e-9 printed "achieves epsilon = 0.0000 <= 1e-09" (four decimals)."""
    argv = ["--dataset-size", "1000", "--batch-size", "10", "--steps", "10", "--epsilon", "1e-9", "--delta", "1e-5"]
    code, out, _ = run(capsys, "account", *argv, "--accountant", "pld")
    assert code == 0
    shown = float(out.split("achieves epsilon = ")[1].split()[0])
    assert 5e-10 < shown <= 1e-9, out


@pytest.mark.parametrize(
    "eps, delta, msg", [("0", "1e-5", "epsilon"), ("-1", "1e-5", "epsilon"), ("1", "0", "delta"), ("1", "1.5", "delta")]
)
def test_account_bad_privacy_parameters(capsys, eps, delta, msg):
    code, _, err = run(
        capsys,
        "account",
        "--dataset-size",
        "100",
        "--batch-size",
        "10",
        "--steps",
        "10",
        "--epsilon",
        eps,
        "--delta",
        delta,
    )
    assert code == 2 and msg in err


def test_list(capsys):
    _code, out, _ = run(capsys, "list", "--json")
    listing = json.loads(out)
    assert {"sgd", "dp-sgd", "dp-gd"} <= set(listing["algorithms"])
    assert {"digits", "mnist"} <= set(listing["datasets"])
    assert {"mlp", "logreg", "cnn", "resnet20"} <= set(listing["models"])


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key.*learning_rate"):
        RunConfig.from_dict({"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="privacy.delta"):
        RunConfig.from_dict({"privacy": {"delta": 2.0}})
    with pytest.raises(ConfigError, match="unknown privacy key"):
        RunConfig.from_dict({"privacy": {"eps": 1.0}})
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["nonsense"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_a_key_given_twice_is_refused_not_silently_overridden(tmp_path, capsys):
    """PyYAML keeps the last of two equal keys: a second `privacy:` block dropped the first's ε."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("privacy: {epsilon: 0.1}\nalgorithm: dp-sgd\nprivacy: {delta: 1.0e-6}\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'privacy' \(first on line 1\) \(line 3, column 1\)"):
        load_config(cfg)
    cfg.write_text("algorithm_params: {lr: 0.5, epochs: 1, lr: 5.0}\n")
    code, _, err = run(capsys, "train", "--config", str(cfg), "--out", str(tmp_path / "r"))
    assert code == 2 and "duplicate key 'lr'" in err and one_line_error(err) and not (tmp_path / "r").exists()
    cfg.write_text("base: &b {lr: 0.5}\nalgorithm_params:\n  <<: *b\n  lr: 0.25\n")  # merges still override
    assert yaml_load(cfg.read_text())["algorithm_params"] == {"lr": 0.25}


@pytest.mark.parametrize("text,kind", [("- 1\n- 2\n", "list"), ("5\n", "int"), ("just text\n", "str")])
def test_config_file_that_is_not_a_mapping_is_refused_with_overrides_too(tmp_path, capsys, text, kind):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=f"must hold a mapping.*got {kind}"):
        load_config(cfg, ["seed=1"])
    code, _, err = run(capsys, "train", "--config", str(cfg), "--set", "seed=1", "--out", str(tmp_path / "r"))
    assert code == 2 and "must hold a mapping" in err and one_line_error(err)
    assert not (tmp_path / "r").exists()


def test_overrides_parse_values():
    d = apply_overrides({"privacy": {"epsilon": 1.0}}, ["privacy.epsilon=3", "algorithm_params.lr=0.5", "model=cnn"])
    assert d == {"privacy": {"epsilon": 3}, "algorithm_params": {"lr": 0.5}, "model": "cnn"}
    d = apply_overrides({}, ["privacy.delta=1e-5", "privacy.epsilon=2E0"])  # YAML 1.1 would give strings
    assert d["privacy"] == {"delta": 1e-5, "epsilon": 2.0}


def test_yaml_is_read_as_yaml_1_2_booleans_are_only_true_and_false(tmp_path):
    """yes/no/on/off are strings (YAML 1.2), in files and in --set alike; a key that needs a boolean
    refuses them naming the key and the fix, and a string key keeps them as written."""
    f = tmp_path / "cfg.yaml"
    f.write_text("plots: false\nnon_private_diagnostics: FALSE\nprivacy: {allow_large_delta: True}\n")
    c = load_config(f)
    assert (c.plots, c.non_private_diagnostics, c.privacy.allow_large_delta) == (False, False, True)
    for text in ("plots: no\n", "privacy: {allow_large_delta: yes}\n", "non_private_diagnostics: on\n"):
        f.write_text(text)
        with pytest.raises(ConfigError, match="must be true or false, got '(no|yes|on)' .*YAML 1.2"):
            load_config(f)
    with pytest.raises(ConfigError, match="plots must be true or false, got 'off'"):
        load_config(None, ["plots=off"])
    assert apply_overrides({}, ["dataset_params.name=no", "x=y"]) == {"dataset_params": {"name": "no"}, "x": "y"}


def test_train_errors_are_clear(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--set", "algorithm=nope", "--out", str(tmp_path / "a"), "--quiet")
    assert code == 2 and "unknown algorithm 'nope'" in err
    code, _, err = run(capsys, "train", "--set", "algorithm_params.lrr=1", "--out", str(tmp_path / "b"), "--quiet")
    assert code == 2 and "lrr" in err
    code, _, err = run(capsys, "train", "--set", "dataset=nope", "--out", str(tmp_path / "c"), "--quiet")
    assert code == 2 and "nope" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_train_via_cli(capsys, tmp_path):
    code, out, _ = run(
        capsys,
        "train",
        "--set",
        "model=logreg",
        "--set",
        "algorithm_params.epochs=1",
        "--set",
        "privacy.epsilon=1",
        "--out",
        str(tmp_path / "r"),
        "--quiet",
        "--json",
    )
    assert code == 0
    res = json.loads(out)
    assert res["status"] == "finished" and res["privacy"]["epsilon_spent"] <= 1.0


QUICK = ["--set", "model=logreg", "--set", "algorithm_params.epochs=1", "--set", "algorithm_params.batch_size=100"]


def one_line_error(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_train_non_private_reports_null_epsilon(capsys, tmp_path):
    code, out, _ = run(
        capsys, "train", *QUICK, "--set", "algorithm=sgd", "--set", "privacy.epsilon=null",
        "--out", str(tmp_path / "r"), "--quiet", "--json",
    )  # fmt: skip
    assert code == 0 and json.loads(out)["privacy"]["epsilon_spent"] is None
    code, out, _ = run(capsys, "train", "--resume", str(tmp_path / "r"))
    assert code == 0 and "non-private" in out


def test_train_out_is_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    code, _, err = run(capsys, "train", *QUICK, "--out", str(tmp_path / "f"), "--quiet")
    assert code == 2 and "is a file" in err and one_line_error(err)


def test_train_unwritable_output_folder_is_refused_before_training(capsys, tmp_path, monkeypatch):
    import privopt.training.run as run_module

    def no_training(*a, **kw):
        raise AssertionError("training started before the output folder was checked")

    monkeypatch.setattr(run_module, "build_run", no_training)
    if os.geteuid() == 0:  # root may write anywhere a permission bit forbids; /sys refuses even root
        out = "/sys/privopt-test-run"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        out = str(tmp_path / "ro" / "run")
    code, _, err = run(capsys, "train", *QUICK, "--out", out, "--quiet")
    assert code == 2 and "cannot write to output folder" in err and one_line_error(err)


def test_train_into_a_directory_in_use_or_holding_a_run(capsys, tmp_path):
    from privopt.training.rundir import RunDirLock

    out = tmp_path / "r"
    with RunDirLock(out):  # another run owns the directory
        code, _, err = run(capsys, "train", *QUICK, "--out", str(out), "--quiet")
    assert code == 2 and "in use by another privopt run" in err and one_line_error(err)
    assert run(capsys, "train", *QUICK, "--out", str(out), "--quiet")[0] == 0
    code, _, err = run(capsys, "train", *QUICK, "--out", str(out), "--quiet")
    assert code == 2 and "already holds a run (checkpoint.pt, record.json)" in err and f"--resume {out}" in err


def test_resume_refuses_options_it_cannot_honour(capsys, tmp_path):
    assert run(capsys, "train", *QUICK, "--out", str(tmp_path / "r"), "--quiet")[0] == 0
    code, _, err = run(
        capsys, "train", "--resume", str(tmp_path / "r"), "--set", "algorithm_params.lr=9",
        "--config", "c.yaml", "--out", str(tmp_path / "x"), "--insecure-seed", "1",
    )  # fmt: skip
    assert code == 2 and one_line_error(err)
    for part in ("--set algorithm_params.lr=9", "--config c.yaml", f"--out {tmp_path / 'x'}", "--insecure-seed 1"):
        assert part in err


def test_resume_of_a_python_api_run_from_the_cli_is_refused(capsys, tmp_path):
    from privopt.data import load_dataset
    from privopt.training import train

    data = load_dataset("digits", seed=0)
    train(
        RunConfig.from_dict({"model": "logreg", "algorithm_params": {"epochs": 1, "batch_size": 100}}),
        out_dir=tmp_path / "r", progress=False, max_steps=2, dataset=data,
    )  # fmt: skip
    code, _, err = run(capsys, "train", "--resume", str(tmp_path / "r"))
    assert code == 2 and "passed through the Python API" in err and one_line_error(err)


def test_divergence_exits_with_a_message_and_a_record(capsys, tmp_path):
    code, _, err = run(
        capsys, "train", *QUICK, "--set", "algorithm_params.lr=1e38", "--out", str(tmp_path / "r"), "--quiet"
    )
    assert code == 4 and "run failed: diverged at step" in err and one_line_error(err)
    rec = json.loads((tmp_path / "r" / "record.json").read_text())
    assert rec["status"] == "failed" and rec["privacy"]["epsilon_spent"] > 0


def test_ctrl_c_during_start_up(capsys, tmp_path, monkeypatch):
    import privopt.experiments
    import privopt.training.builder as builder

    def interrupt(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(builder, "calibrate", interrupt)  # while calibrating the noise
    code, _, err = run(capsys, "train", *QUICK, "--out", str(tmp_path / "r"))
    assert code == 130 and err.strip() == "privopt: interrupted"
    assert not (tmp_path / "r").exists()
    monkeypatch.setattr(privopt.experiments, "experiment_entries", interrupt)  # while building the parser
    code, _, err = run(capsys, "train", *QUICK, "--out", str(tmp_path / "r"))
    assert code == 130 and err.strip() == "privopt: interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.5, 1.5])
def test_sigint_to_a_starting_cli_process_gives_no_traceback(tmp_path, delay):
    """A real Ctrl-C while the process imports, loads data or calibrates (an interrupted import used
    to end in a RecursionError traceback, or the Ctrl-C was swallowed and the run went on)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "privopt.cli", "train", *QUICK, "--out", str(tmp_path / "r")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err and err.strip().startswith("privopt: ")


def test_a_reader_that_closes_the_output_is_not_a_user_error(monkeypatch, capsys):
    """`privopt list | head -1`: the write fails with EPIPE; exit like a tool killed by SIGPIPE, with
    no 'privopt: error: Broken pipe' line."""
    import io

    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    code = main(["list"])
    assert code == 128 + signal.SIGPIPE and capsys.readouterr().err == ""


def test_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "exit codes" in capsys.readouterr().out


def test_top_level_help_describes_every_command(capsys):
    """The description named six of the seven commands (not audit), in reStructuredText quotes."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]
    assert all(c in description for c in ("train", "account", "audit", "list", "demo", "bench", "reproduce"))
    assert "``" not in out


def test_demo_help_says_where_its_outputs_go(capsys):
    """--out is a parent folder (it said "output directory"): the demo writes a new time-stamped folder in it."""
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "new time-stamped folder in it" in " ".join(capsys.readouterr().out.split())


def test_train_with_an_insecure_seed_says_not_private_where_it_states_epsilon(capsys, tmp_path):
    code, out, _ = run(capsys, "train", *QUICK, "--insecure-seed", "4", "--out", str(tmp_path / "r"))
    assert code == 0 and "eps=" in out and "NOT private" in out and "--insecure-seed 4" in out
    code, out, _ = run(capsys, "train", *QUICK, "--insecure-seed", "4", "--out", str(tmp_path / "j"), "--json")
    assert code == 0 and json.loads(out.splitlines()[-1])["randomness"]["insecure_seed"] == 4
    code, out, _ = run(capsys, "train", *QUICK, "--out", str(tmp_path / "s"))
    assert code == 0 and "NOT private" not in out


def test_train_refuses_a_written_privacy_target_for_a_non_private_algorithm(capsys, tmp_path):
    """A config that asks for ε = 1 and names a non-private algorithm would give a model with no
    guarantee: refused before anything is written. The defaults' ε alone is no request."""
    cfg = tmp_path / "dp.yaml"
    cfg.write_text("algorithm: dp-sgd\nmodel: logreg\nprivacy: {epsilon: 1.0, delta: 1.0e-5}\n")
    out = tmp_path / "r"
    code, _, err = run(capsys, "train", "--config", str(cfg), *QUICK, "--set", "algorithm=sgd", "--out", str(out))
    assert code == 2 and one_line_error(err) and not out.exists()
    assert "'sgd' is not private" in err and "privacy.epsilon=1.0" in err and "privacy.epsilon=null" in err
    written = ["--set", "algorithm=sgd", "--set", "privacy.epsilon=2"]  # by --set, on the default config
    code, _, err = run(capsys, "train", *QUICK, *written, "--out", str(out))
    assert code == 2 and "privacy.epsilon=2" in err and not out.exists()
    argv = ["train", "--config", str(cfg), *QUICK, "--set", "algorithm=sgd", "--set", "privacy.epsilon=null"]
    code, out_text, _ = run(capsys, *argv, "--out", str(out), "--quiet", "--json")
    assert code == 0 and json.loads(out_text)["privacy"]["epsilon_spent"] is None
