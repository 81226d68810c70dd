"""The builder, the step loop and its callbacks: user errors before any output, failures that
still record what was spent, progress output, non-private runs."""

import io
import json
import math

import pytest
import torch
from torch import nn

from _run_helpers import cfg, cfg_dict, ledger_epsilon, read_record
from privopt.config import RunConfig
from privopt.errors import ConfigError, DataError, ModelError, PrivacyBudgetExceeded
from privopt.training import (
    Callback,
    Every,
    LoopState,
    RunDiverged,
    StepLimit,
    register_run_metric,
    run_loop,
    train,
)
from privopt.training.callbacks import ProgressCallback

# ----------------------------------------------------------------------------- the loop itself


def test_loop_calls_callbacks_in_order_and_times_only_steps():
    calls = []

    class Spy(Callback):
        def on_loop_start(self, state):
            calls.append(("start", state.step))

        def on_step_end(self, state, logs):
            calls.append(("step", state.step, logs["t"]))

        def on_loop_end(self, state):
            calls.append(("end", state.step))

    state = run_loop(lambda t: {"t": t}, LoopState(step=2, total=4), [Spy()])
    assert calls == [("start", 2), ("step", 3, 2), ("step", 4, 3), ("end", 4)]
    assert state.algo_time_s >= 0 and state.stop is None


def test_every_and_step_limit():
    seen = []
    state = LoopState(step=0, total=10)
    run_loop(lambda t: {}, state, [Every(4, lambda st, logs: seen.append(st.step), at_end=False), StepLimit(9)])
    assert seen == [4, 8] and state.step == 9 and state.stop == "paused"
    state = LoopState(step=0, total=3)
    run_loop(lambda t: {}, state, [StepLimit(5)])  # a limit beyond the end does not pause
    assert state.step == 3 and state.stop is None


def test_loop_end_runs_when_a_step_raises():
    ended = []

    class End(Callback):
        def on_loop_end(self, state):
            ended.append(state.step)

    def step(t):
        if t == 2:
            raise ValueError("boom")
        return {}

    with pytest.raises(ValueError):
        run_loop(step, LoopState(step=0, total=5), [End()])
    assert ended == [2]


# ----------------------------------------------------------------------------- progress output


def test_progress_prints_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    cb = ProgressCallback(desc="dp-sgd", summary=lambda: {"eps": "0.5"}, enabled=True, stream=stream)
    run_loop(lambda t: {}, LoopState(step=0, total=20), [cb])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in stream.getvalue()
    assert lines[-1] == "dp-sgd: step 20/20 (100%) eps=0.5"


def test_progress_bar_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    run_loop(
        lambda t: {},
        LoopState(step=0, total=5),
        [ProgressCallback(desc="x", summary=dict, enabled=True, stream=stream)],
    )
    assert "\r" in stream.getvalue() and "step 5/5" not in stream.getvalue()  # a tqdm bar, not lines
    quiet = io.StringIO()
    run_loop(
        lambda t: {},
        LoopState(step=0, total=5),
        [ProgressCallback(desc="x", summary=dict, enabled=False, stream=quiet)],
    )
    assert quiet.getvalue() == ""


def test_train_progress_lines_show_only_public_values(tmp_path, capsys):
    train(cfg(algorithm_params={"epochs": 1}), out_dir=tmp_path / "r", progress=True)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("dp-sgd: step")]
    assert lines and all(
        {tok.split("=")[0] for tok in ln.split()[4:]} <= {"eps", "test_acc", "at_step"} for ln in lines
    )


def test_progress_line_says_when_its_epsilon_is_an_earlier_evaluations(tmp_path, capsys):
    """Progress lines come every 10 % of the steps, evaluations every eval_every: a line between two
    evaluations must not pair the current step with the ε spent at an earlier one unlabelled."""
    c = cfg(algorithm_params={"epochs": 1, "batch_size": 50}, eval_every=7)  # 30 steps: lines every 3
    train(c, out_dir=tmp_path / "r", progress=True)
    lines = [ln.split() for ln in capsys.readouterr().err.splitlines() if ln.startswith("dp-sgd: step")]
    evaluated = {h["step"] for h in read_record(tmp_path / "r")["history"]}
    for ln in lines:
        step, fields = int(ln[2].split("/")[0]), dict(tok.split("=") for tok in ln[4:])
        if "eps" in fields:
            assert (step in evaluated) == ("at_step" not in fields), ln
            assert int(fields.get("at_step", step)) in evaluated
    assert any("at_step=" in " ".join(ln) for ln in lines)


# ----------------------------------------------------------------------------- user errors, before any output


def test_tuple_instead_of_dataset(tmp_path):
    x, y = torch.randn(20, 64), torch.randint(0, 10, (20,))
    with pytest.raises(DataError, match=r"privopt.data.Dataset, got tuple"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, dataset=(x, y))
    assert not (tmp_path / "run").exists()


def test_wrong_input_size_for_the_model(tmp_path):
    with pytest.raises(ModelError, match=r"cannot take dataset 'digits'.*shape \(1, 8, 8\)"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, model=nn.Sequential(nn.Flatten(), nn.Linear(784, 10)))
    with pytest.raises(ModelError, match="outputs 3 values per example but the dataset has 10 classes"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, model=nn.Sequential(nn.Flatten(), nn.Linear(64, 3)))
    with pytest.raises(ModelError, match="torch.nn.Module"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, model=lambda x: x)
    assert not (tmp_path / "run").exists()


def test_a_model_the_engine_cannot_differentiate_per_example_fails_before_any_output(tmp_path):
    """It used to fail at the first step with a torch traceback, after the run had written its files."""
    from _run_helpers import PythonGate

    model = nn.Sequential(nn.Flatten(), PythonGate(64), nn.Linear(64, 10))
    with pytest.raises(ModelError, match="gradient engine .* cannot compute per-example gradients"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, model=model)
    assert not (tmp_path / "run").exists()


def test_float64_features_are_cast_to_float32_before_training(tmp_path):
    from privopt.data import load_dataset

    data = load_dataset("digits", seed=0)
    data.x_train = data.x_train.double()
    rec = train(cfg(algorithm_params={"epochs": 1}), out_dir=tmp_path / "run", progress=False, dataset=data)
    assert rec["status"] == "finished" and data.x_train.dtype == torch.float32


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
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))
    with pytest.raises(ModelError, match="BatchNorm1d"):
        train(cfg(), out_dir=tmp_path / "run", progress=False, model=model)
    assert not (tmp_path / "run").exists()


def test_delta_at_least_one_over_n_is_refused_unless_allowed(tmp_path):
    from privopt.data import load_dataset

    n = int(load_dataset("digits", seed=0).x_train.shape[0])
    # One check for every entry point (privopt.privacy.check_delta_for_size), naming the config key.
    match = rf"privacy.delta=0.5 is not below 1/n = {1 / n:.4g} \(n = {n}\).*set privacy.allow_large_delta: true"
    with pytest.raises(ConfigError, match=match):
        train(cfg(privacy={"delta": 0.5}), out_dir=tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()
    rec = train(
        cfg(privacy={"delta": 1 / n, "allow_large_delta": True}, algorithm_params={"epochs": 1}),
        out_dir=tmp_path / "b",
        progress=False,
    )
    assert rec["status"] == "finished" and rec["config"]["privacy"]["allow_large_delta"] is True
    train(cfg(privacy={"delta": 1 / (n + 1)}, algorithm_params={"epochs": 1}), out_dir=tmp_path / "c", progress=False)


def test_private_data_metrics_need_diagnostics(tmp_path):
    register_run_metric(
        "test_only_train_mean", lambda *, data, **kw: {"m": float(data.x_train.mean())}, reads_private_data=True
    )
    with pytest.raises(ConfigError, match=r"read the private training data.*non_private_diagnostics"):
        train(cfg(metrics=["test_only_train_mean"]), out_dir=tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="eval_split 'val'.*non_private_diagnostics"):
        train(cfg(eval_split="val", dataset_params={"val_fraction": 0.2}), out_dir=tmp_path / "b", progress=False)
    with pytest.raises(ConfigError, match="reads_private_data"):
        register_run_metric("undeclared", lambda **kw: {}, reads_private_data=None)
    # A metric that reads the training data cannot be re-declared as public under its name.
    with pytest.raises(ConfigError, match="run metric name 'test_only_train_mean' registered twice"):
        register_run_metric("test_only_train_mean", lambda **kw: {}, reads_private_data=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_public_metrics_cannot_read_the_training_split(tmp_path):
    register_run_metric(
        "test_only_peek", lambda *, data, **kw: {"peek": float(data.x_train.sum())}, reads_private_data=False
    )
    with pytest.raises(AttributeError, match="x_train"):
        train(cfg(metrics=["test_only_peek"], algorithm_params={"epochs": 1}), out_dir=tmp_path / "r", progress=False)
    register_run_metric(
        "test_only_n_test", lambda *, data, **kw: {"n_test_seen": len(data.y_test)}, reads_private_data=False
    )
    rec = train(
        cfg(metrics=["test_only_n_test"], algorithm_params={"epochs": 1}), out_dir=tmp_path / "s", progress=False
    )
    assert rec["metrics"]["n_test_seen"] == rec["dataset"]["n_test"]


def test_metrics_read_the_exact_epsilon_only_when_they_ask_for_it(tmp_path, monkeypatch):
    import privopt.training.run as run_module

    sections = []
    real = run_module.privacy_section
    monkeypatch.setattr(run_module, "privacy_section", lambda *a, **k: sections.append(1) or real(*a, **k))
    register_run_metric(
        "test_only_config_reader", lambda *, record, **kw: {"n_keys": len(record["config"])}, reads_private_data=False
    )
    rec = train(
        cfg(metrics=["test_only_config_reader"], checkpoint_every=10**6), out_dir=tmp_path / "a", progress=False
    )
    assert rec["metrics"]["n_keys"] > 0
    assert len(rec["history"]) > 2 and len(sections) == 2  # the records written at the start and the end

    register_run_metric(
        "test_only_eps_reader",
        lambda *, record, **kw: {"eps_seen": record["privacy"]["epsilon_spent"]},
        reads_private_data=False,
    )
    sections.clear()
    rec = train(cfg(metrics=["test_only_eps_reader"]), out_dir=tmp_path / "b", progress=False)
    assert rec["metrics"]["eps_seen"] == rec["privacy"]["epsilon_spent"]
    assert len(sections) >= len(rec["history"])


def test_run_config_accepts_a_privacy_mapping():
    c = RunConfig(privacy={"epsilon": 3.0, "delta": 1e-6}).validate()
    assert c.privacy.epsilon == 3.0 and c.privacy.delta == 1e-6
    with pytest.raises(ConfigError, match="unknown privacy key"):
        RunConfig(privacy={"eps": 1.0})


# ----------------------------------------------------------------------------- failures record what was spent


def test_divergence_writes_a_failed_record_with_the_epsilon_spent(tmp_path):
    with pytest.raises(RunDiverged, match="diverged at step"):
        train(cfg(algorithm_params={"lr": 1e38}, insecure_seed=0), out_dir=tmp_path / "run", progress=False)
    rec = read_record(tmp_path / "run")
    assert rec["status"] == "failed" and "diverged" in rec["reason"]
    assert rec["steps_done"] >= 1 and 0 < rec["privacy"]["epsilon_spent"] <= 2.0
    assert rec["privacy"]["epsilon_spent"] == ledger_epsilon(rec)
    assert isinstance(RunDiverged("x"), ArithmeticError)  # experiment grids treat divergence as a result


def test_budget_guard_stops_and_records(tmp_path, monkeypatch):
    """A run asked to do more steps than it planned is refused before the extra release."""
    from privopt.algorithms.dpsgd import DPSGD

    monkeypatch.setattr(DPSGD, "num_steps", lambda self: 10 * self.steps_for(n=self._n))
    with pytest.raises(PrivacyBudgetExceeded):
        train(cfg(privacy={"epsilon": 1.0}), out_dir=tmp_path / "run", progress=False)
    rec = read_record(tmp_path / "run")
    assert rec["status"] == "failed" and rec["reason"].startswith("privacy budget exhausted")
    assert 0 < rec["privacy"]["epsilon_spent"] <= 1.0 and rec["privacy"]["epsilon_spent"] == ledger_epsilon(rec)
    assert (tmp_path / "run" / "checkpoint.pt").exists()


def test_an_unexpected_error_after_the_first_release_is_recorded(tmp_path, monkeypatch):
    from privopt.algorithms.dpsgd import DPSGD

    real_step = DPSGD.step

    def flaky(self, t):
        if t == 7:
            raise RuntimeError("disk on fire")
        return real_step(self, t)

    monkeypatch.setattr(DPSGD, "step", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        train(cfg(), out_dir=tmp_path / "run", progress=False)
    rec = read_record(tmp_path / "run")
    assert rec["status"] == "failed" and rec["reason"].startswith("RuntimeError (its message is not recorded")
    assert "disk on fire" not in json.dumps(rec) and rec["steps_done"] == 7  # the text could quote a record
    assert len(rec["privacy"]["ledger"]["counts"]) == 1 and rec["privacy"]["ledger"]["counts"][0]["count"] == 7


# ----------------------------------------------------------------------------- non-private runs


def test_non_private_run_has_null_epsilon_everywhere(tmp_path):
    d = cfg_dict(algorithm="sgd", privacy={"epsilon": None})
    d["algorithm_params"] = {"epochs": 1, "batch_size": 100, "lr": 0.5}
    rec = train(RunConfig.from_dict(d), out_dir=tmp_path / "r", progress=False)
    saved = read_record(tmp_path / "r")
    assert saved["privacy"] == {"private": False, "epsilon_spent": None, "delta": None}
    assert saved["metrics"]["epsilon_spent"] is None and all(h["epsilon_spent"] is None for h in saved["history"])
    assert "null" in json.dumps(saved["metrics"]) and rec["metrics"]["epsilon_spent"] is None
    header, first = (tmp_path / "r" / "metrics.csv").read_text().splitlines()[:2]
    assert first.split(",")[header.split(",").index("epsilon_spent")] == ""
    # a non-private algorithm's batch losses read the data: never in the public files
    assert "batch_loss" not in header and not math.isnan(saved["metrics"]["test_accuracy"])


def test_the_documented_diagnostic_metrics_are_known_to_a_fresh_process():
    """docs/privacy.md names the ``mia`` and ``grad_norm`` run metrics: a config selecting them must not
    depend on an experiment module having been imported first (a fresh ``privopt train``)."""
    import subprocess
    import sys

    code = (
        "from privopt.training import get_run_metrics; "
        "print(sorted(m.name for m in get_run_metrics(['mia', 'grad_norm'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.strip() == "['grad_norm', 'mia']"


def test_progress_says_when_a_method_returns_before_its_step_bound():
    from privopt.training.callbacks import AlgorithmDone

    class Algo:
        done = False

    algo = Algo()

    def step(t):
        algo.done = t == 7  # returns after its 8th step of a bound of 18
        return {}

    stream = io.StringIO()
    cb = ProgressCallback(desc="fed-dp-sgd", summary=dict, enabled=True, stream=stream)
    state = run_loop(step, LoopState(step=0, total=18), [AlgorithmDone(algo), cb])
    assert state.step == 8
    assert stream.getvalue().splitlines()[-1] == "fed-dp-sgd: step 8/18 (done before the step bound)"
