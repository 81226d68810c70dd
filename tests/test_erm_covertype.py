"""Paper B's Covertype comparison: the train/tune split, the tuning rule, and the run end to end
(tiny grids; the code path is the real one)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from privopt.errors import ConfigError


def test_covertype_binary_loader(shared_data):
    from privopt.experiments.erm_covertype import load_covertype_binary

    x, y = load_covertype_binary(data_dir=shared_data / "covtype")
    assert x.shape == (20000, 54)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0)
    assert int((y > 0).sum()) == 6022  # Cover_Type 2 count documented in the data README
    x2, y2 = load_covertype_binary(data_dir=shared_data / "covtype", n_train=1000, seed=3)
    assert x2.shape == (1000, 54) and set(np.unique(y2)) == {-1.0, 1.0}
    with pytest.raises(ConfigError):
        load_covertype_binary(data_dir=shared_data / "covtype", n_train=10**6)


def test_tuning_rows_follow_the_training_rows_in_hash_order(shared_data):
    from privopt.experiments.erm_covertype_data import load_covertype_binary, load_covertype_split

    (xt, yt), (xu, yu) = load_covertype_split(data_dir=shared_data / "covtype", n_train=700, n_tune=300, seed=1)
    xa, ya = load_covertype_binary(data_dir=shared_data / "covtype", n_train=1000, seed=1)
    np.testing.assert_array_equal(np.vstack([xt, xu]), xa)  # positions 0..699 and 700..999: disjoint
    np.testing.assert_array_equal(np.concatenate([yt, yu]), ya)
    with pytest.raises(ConfigError, match="exceeds"):
        load_covertype_split(data_dir=shared_data / "covtype", n_train=15_000, n_tune=10_000)
    with pytest.raises(ConfigError, match="n_tune"):
        load_covertype_split(data_dir=shared_data / "covtype", n_train=100, n_tune=0)


def _tiny_budget(monkeypatch, exp):
    from privopt.experiments.erm_covertype_protocol import Budget

    grids = {
        "regularized": {
            "dp-svrg": {"inner": (50, 100), "step_size": (1e-3,)},
            "dp-gd": {"iterations": (5, 20), "step_size": (0.5, 2.0)},
        },
        "unregularized": {
            "dp-svrg-pp": {"epochs": (2, 3), "step_size": (0.01,)},
            "dp-gd": {"iterations": (5, 20), "step_size": (4.0,)},
        },
        "l1-constrained": {
            "dp-amd": {"iterations": (5, 20), "step_size": (4.0,)},
            "dp-gd": {"iterations": (5, 20), "step_size": (4.0,)},
        },
    }
    monkeypatch.setitem(
        exp.BUDGETS, "quick", Budget(runs=2, tune_runs=2, accountant="rdp", curve_points=4, grids=grids)
    )
    # the printed schedules are long; shrink them too
    import privopt.experiments.erm_covertype_protocol as protocol

    real = protocol.settings

    def shrunk(budget):
        out = real(budget)
        for s in out.values():
            for m in s.methods:
                if m.printed is not None:
                    object.__setattr__(
                        m,
                        "printed",
                        {k: (3 if k == "epochs" else 10 if k == "iterations" else v) for k, v in m.printed.items()},
                    )
        return out

    monkeypatch.setattr(exp, "settings", shrunk)
    return grids


def test_erm_covertype_end_to_end(shared_data, tmp_path, monkeypatch):
    import privopt.experiments.erm_covertype as exp
    from privopt.experiments.erm_covertype_runner import Runner

    grids = _tiny_budget(monkeypatch, exp)
    seen = []  # (phase, n) of every run: tuning must only see the tuning rows
    real_run = Runner.run

    def spy(self, algo, problem, **kw):
        seen.append(problem.erm.n)
        return real_run(self, algo, problem, **kw)

    monkeypatch.setattr(Runner, "run", spy)
    summary = exp.run_erm_covertype(
        data_dir=shared_data / "covtype",
        n_train=600,
        n_tune=400,
        epsilons=[0.5, 1.0],
        delta=1e-3,
        budget="quick",
        out_dir=tmp_path,
        progress=False,
        insecure_seed=3,
    )
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    grid_points = sum(
        len(length) * len(steps) for g in grids.values() for length, steps in map(dict.values, g.values())
    )
    n_tune_runs = 2 * 2 * grid_points  # eps x tuning runs x grid points
    by_phase = {p: [r for r in rows if r["phase"] == p] for p in ("tune", "final", "printed")}
    assert len(by_phase["tune"]) == n_tune_runs
    assert len(by_phase["final"]) == 2 * 6 * 2  # eps x methods x runs
    assert len(by_phase["printed"]) == 2 * 2  # eps x (dp-gd unregularised) x runs
    assert seen == [400 if r["phase"] == "tune" else 600 for r in rows]
    for r in rows:
        assert r["epsilon_spent"] <= r["epsilon"] + 1e-6
    for r in by_phase["final"] + by_phase["printed"]:
        assert r["gap"] >= -1e-9 and r["n_train"] == 600  # F* is the minimum over the training objective
    # the kept schedule is the argmin of the mean tuning gap, for every method and epsilon
    for sel in summary["selections"]:
        tune = [
            r
            for r in by_phase["tune"]
            if (r["setting"], r["method"], r["epsilon"]) == (sel["setting"], sel["method"], sel["epsilon"])
        ]
        means = {}
        for r in tune:
            means.setdefault(json.dumps(r["schedule"], sort_keys=True), []).append(r["gap"])
        best = min(means, key=lambda k: np.mean(means[k]))
        assert json.loads(best) == sel["schedule"]
        length = next(iter(sel["schedule"].values()))  # the run-length axis comes first
        assert sel["interior"] == (length < max(k for k, _, _ in sel["profile"]))
    md = (tmp_path / "summary.md").read_text()
    for s, m in (("regularized", "dp-svrg"), ("unregularized", "dp-svrg-pp"), ("l1-constrained", "dp-amd")):
        assert f"| {s} | {m} |" in md
    assert len(summary["comparisons"]) == 3 * 2
    # The gaps are measured on the training rows without noise: every summary says so.
    assert "NOT private" in summary["not_private"] and "training rows" in summary["not_private"]
    assert f"**Not private:** {summary['not_private']}" in md
    assert json.loads((tmp_path / "summary.json").read_text())["not_private"] == summary["not_private"]
    for name in ("fig1_regularized.png", "fig2_unregularized.png", "fig3_l1-constrained.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_bad_options_are_refused_before_any_output(shared_data, tmp_path):
    from privopt.experiments.erm_covertype import run_erm_covertype

    for bad in (dict(budget="huge"), dict(epsilons=[0.0]), dict(delta=1.0), dict(runs=0), dict(only=["fig9"])):
        out = tmp_path / "x"
        with pytest.raises(ConfigError):
            run_erm_covertype(data_dir=shared_data / "covtype", out_dir=out, **bad)
        assert not out.exists()


def test_an_out_holding_earlier_results_is_refused_not_truncated(tmp_path):
    from privopt.experiments.erm_covertype import run_erm_covertype

    (tmp_path / "results.jsonl").write_text('{"earlier": 1}\n')
    with pytest.raises(ConfigError, match="already holds a results.jsonl"):
        run_erm_covertype(data_dir=tmp_path / "no-data-needed", out_dir=tmp_path, epsilons=[1.0])
    assert (tmp_path / "results.jsonl").read_text() == '{"earlier": 1}\n'


def test_tuning_extends_the_run_length_while_the_best_is_the_longest(monkeypatch):
    from privopt.experiments.erm_covertype_protocol import MethodSpec, Setting
    from privopt.experiments.erm_covertype_runner import Runner

    def fake_run(self, algo, problem, *, epsilon, curve):  # optimisation error 1/T plus noise ~ step * T
        t, step = algo.config.iterations, algo.config.step_size
        return {"gap": 1.0 / t + step * t / 1e4, "passes": float(t), "hyperparameters": {}}

    monkeypatch.setattr(Runner, "run", fake_run)
    rows = []
    runner = Runner(
        delta=1e-3, accountant="rdp", insecure_seed=0, curve_points=2, write=rows.append, log=lambda m: None
    )
    setting = Setting("unregularized", 2, 0.0, "dp-gd", ())

    def method(cap):
        grid = {"iterations": (10, 20), "step_size": (1.0, 0.5)}
        return MethodSpec("dp-gd", "dp-gd-erm", {"l2": 0.0}, grid, "iterations", max_length=cap)

    problem = SimpleNamespace(erm=SimpleNamespace(n=100))
    sel = runner.tune(setting, method(100), problem, epsilon=1.0, runs=1)
    assert [p[0] for p in sel.profile] == [10, 20, 40, 80, 100]  # ratio 2, capped at 100
    assert sel.schedule == {"iterations": 100, "step_size": 0.5} and not sel.interior
    extended = [r["schedule"] for r in rows if r["schedule"]["iterations"] > 20]
    assert all(s["step_size"] == 0.5 for s in extended)  # only steps <= the best one are extended
    rows.clear()
    sel = runner.tune(setting, method(None), problem, epsilon=1.0, runs=1)
    assert [p[0] for p in sel.profile] == [10, 20] and len(rows) == 4  # no cap: the grid only


def test_the_summary_meta_holds_no_statistic_of_the_training_labels():
    from privopt.experiments.erm_covertype import BUDGETS, _meta

    x = np.ones((10, 3)) / np.sqrt(3.0)
    y = np.array([1.0] * 4 + [-1.0] * 6)
    y_neighbour = y.copy()
    y_neighbour[0] = -1.0  # one record's label changed
    meta = [
        _meta(((x, labels), (x, y)), budget="quick", b=BUDGETS["quick"], runs=1, delta=1e-3, accountant="rdp",
              insecure_seed=None)
        for labels in (y, y_neighbour)
    ]  # fmt: skip
    assert meta[0] == meta[1]


def test_a_delta_of_at_least_one_over_n_is_refused_unless_allowed(shared_data, tmp_path):
    from privopt.experiments.erm_covertype import run_erm_covertype

    out = tmp_path / "x"
    with pytest.raises(ConfigError, match="allow-large-delta"):  # the paper's 1e-3 at n = 10,000 is 10/n
        run_erm_covertype(data_dir=shared_data / "covtype", out_dir=out, delta=1e-3)
    assert not out.exists()
    summary = run_erm_covertype(
        data_dir=shared_data / "covtype", n_train=300, n_tune=300, epsilons=[1.0], delta=1e-2,
        allow_large_delta=True, runs=1, budget="quick", out_dir=out, progress=False, insecure_seed=1,
        only=["regularized"],
    )  # fmt: skip
    assert summary["meta"]["delta_at_least_1_over_n"] is True
    assert summary["meta"]["delta"] == 1e-2
