"""``--jobs N``: the runs of a reproduction in N worker processes, with the results (content and
order) of the serial reproduction, fail-fast errors and no processes left behind."""

import json
import math
import multiprocessing
import time

import pytest

from jobs_helpers import broken_model, defer_sigterm_or_fail, echo_or_fail, noise_source_kind
from privopt.cli import main as cli_main
from privopt.errors import ConfigError
from privopt.experiments import jobs as jobs_module
from privopt.experiments.dro import BUDGETS, Budget, run_dro_table3
from privopt.experiments.jobs import Call, Workers, resolve_jobs, run_ordered

TINY = Budget(**{**BUDGETS["quick"].__dict__, "epochs": 0.5, "tune_epochs": 0.25, "eval_points": 2, "lrs": (0.1, 0.3)})
VOLATILE = {"wall_s", "run_dir"}  # timings and the output folder differ between two reproductions


def _reproduce(out, jobs):
    res = run_dro_table3(
        dataset="digits-st", epsilons=[1.0], seeds=2, budget=TINY, methods=["dp-sgd"], out_dir=out,
        log=lambda s: None, insecure_seed=11, jobs=jobs,
    )  # fmt: skip
    rows = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    tuning = json.loads((out / "tuning.json").read_text())
    return res, rows, tuning


def _same(a, b) -> bool:  # NaN == NaN for a failed run's metrics
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_two_jobs_give_the_serial_rows_in_the_serial_order(tmp_path, monkeypatch):
    # A private accounting cache: the workers read the noise calibrations of the serial run instead
    # of recomputing them (the cache is off in tests; the results are the same either way).
    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", str(tmp_path / "accounting"))
    res1, rows1, tuning1 = _reproduce(tmp_path / "j1", 1)
    res2, rows2, tuning2 = _reproduce(tmp_path / "j2", 2)
    order = [(r["seed"], r["method"], r["epsilon"]) for r in rows2]
    assert order == [(s, m, e) for s in (0, 1) for m, e in (("dp-sgd", 1.0), ("scdro", None))]
    assert len(rows1) == len(rows2) == len(res2["rows"]) == 4
    for a, b in zip(rows1, rows2):
        assert set(a) == set(b)
        assert all(_same(a[k], b[k]) for k in a if k not in VOLATILE), (a, b)
    assert [r["history"] for r in res1["rows"]] == [r["history"] for r in res2["rows"]]
    assert tuning1["best"] == tuning2["best"]
    strip = [[{k: v for k, v in t.items() if k != "wall_s"} for t in tn["trials"]] for tn in (tuning1, tuning2)]
    assert strip[0] == strip[1] and len(strip[0]) == tuning2["n_trials"] > 0
    assert (res1["summary"]["jobs"], res2["summary"]["jobs"]) == (1, 2)
    assert multiprocessing.active_children() == []


def test_results_come_in_call_order_and_errors_fail_fast():
    calls = [Call(args=(0, 1.5))] + [Call(args=(k,)) for k in range(1, 5)]  # the first finishes last
    assert list(run_ordered(echo_or_fail, calls, jobs=2)) == [0, 1, 2, 3, 4]
    t0 = time.perf_counter()
    with pytest.raises(KeyError, match="boom in a worker"):
        list(run_ordered(echo_or_fail, [Call(args=(0, 60.0)), Call(args=(None,))], jobs=2))
    assert time.perf_counter() - t0 < 30  # the 60 s call was stopped, not waited for
    assert multiprocessing.active_children() == []


def test_a_worker_that_defers_sigterm_is_still_stopped():
    # a run in a worker defers SIGTERM to its next step; a failure elsewhere must not wait for it
    t0 = time.perf_counter()
    with pytest.raises(KeyError, match="boom in a worker"):
        calls = [Call(args=(60.0,)), Call(args=(None, 0.5))]
        list(run_ordered(defer_sigterm_or_fail, calls, jobs=2))
    assert time.perf_counter() - t0 < 30
    assert multiprocessing.active_children() == []


def test_a_worker_error_ends_the_reproduction(tmp_path):
    out = tmp_path / "broken"
    with pytest.raises(RuntimeError, match="model factory broke"):
        run_dro_table3(
            dataset="digits-st", epsilons=[1.0], seeds=2, budget=TINY, methods=["dp-sgd"], model=broken_model,
            tune=False, out_dir=out, log=lambda s: None, nonprivate=False, jobs=2,
        )  # fmt: skip
    assert not (out / "results.jsonl").exists()
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("jobs", [-1, 1.5, True, "2"])
def test_bad_jobs_rejected_before_anything_is_written(tmp_path, jobs):
    with pytest.raises(ConfigError, match="jobs must be an integer >= 1"):
        run_dro_table3(dataset="digits-st", budget=TINY, out_dir=tmp_path / "o", log=lambda s: None, jobs=jobs)
    assert not (tmp_path / "o").exists()


def test_unpicklable_model_factory_rejected_with_jobs(tmp_path):
    with pytest.raises(ConfigError, match="needs a model factory that can be pickled"):
        run_dro_table3(
            dataset="digits-st", budget=TINY, out_dir=tmp_path / "o", log=lambda s: None,
            model=lambda: None, jobs=2,
        )  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_cli_jobs_option(tmp_path, capsys):
    assert resolve_jobs(0) >= 1  # 0: every usable core
    for bad in ("-1", "two"):
        with pytest.raises(SystemExit) as e:
            cli_main(["reproduce", "dro-table3", "--dataset", "digits-st", "--jobs", bad, "--out", str(tmp_path / "x")])
        assert e.value.code == 2
        assert "--jobs" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("cores", "kind"), [(2, "TorchSource"), (3, "NoiseAhead")])
def test_workers_draw_noise_ahead_only_with_a_spare_core(monkeypatch, cores, kind):
    # Two workers on two cores: each core runs a training thread already, and a noise thread per run
    # only competes with them (docs/results/performance.md, phase 17); with a third core it helps.
    monkeypatch.setattr(jobs_module, "usable_cores", lambda: cores)
    with Workers(2) as workers:
        assert list(workers.map(noise_source_kind, [Call(args=(5,)), Call(args=(6,))])) == [kind, kind]
    assert noise_source_kind(5) == "NoiseAhead"  # this process (jobs=1 runs here) still draws ahead
