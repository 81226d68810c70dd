"""Worst-group metrics, the reproduction's outputs and its verdict logic."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from privopt.errors import ConfigError
from privopt.eval.worst_group import evaluate_groups, worst_group_metrics
from privopt.experiments import worst_group_protocol as protocol
from privopt.experiments.worst_group import run_worst_group
from privopt.experiments.worst_group_rates import _fit, run_rates, theorem2_terms
from privopt.experiments.worst_group_report import summarize, verdict, verdict_markdown


def test_worst_group_metrics_by_hand():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    y = torch.tensor([0, 1, 1, 1, 0])
    g = torch.tensor([0, 0, 1, 1, 2])
    m = worst_group_metrics(logits, y, g, num_groups=4, group_names=["a", "b", "c", "d"])
    assert m["per_group"]["b"]["accuracy"] == 0.5 and m["per_group"]["d"]["n"] == 0
    assert m["worst_group_accuracy"] == 0.5 and m["average_accuracy"] == pytest.approx(0.8)
    ce = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    assert m["worst_group_loss"] == pytest.approx(float(ce[2:4].mean()))
    assert m["mean_group_accuracy"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)


def test_evaluate_groups_matches_the_metrics_of_the_logits():
    model = torch.nn.Linear(3, 2)
    x, y, g = torch.randn(50, 3), torch.randint(0, 2, (50,)), torch.randint(0, 3, (50,))
    direct = worst_group_metrics(model(x), y, g, num_groups=3)
    assert evaluate_groups(model, x, y, g, num_groups=3, chunk=7)["per_group"] == direct["per_group"]


def _row(method, eps, wg, avg, seed=0):
    metrics = {"worst_group_accuracy": wg, "average_accuracy": avg, "worst_group_loss": 0.5, "epsilon_spent": eps}
    return {"method": method, "label": method, "epsilon": eps, "seed": seed, **metrics, "wall_s": 1.0, "per_group": {}}


def test_verdict_compares_the_best_paper_d_method_with_dp_sgd_at_each_epsilon():
    rows = [
        _row("dp-sgd", 1.0, 0.60, 0.9),
        _row("noisy-sgd-ags", 1.0, 0.70, 0.8),
        _row("noisy-sgd-ags", 1.0, 0.50, 0.8, seed=1),
        _row("noisy-sgd-mgr", 1.0, 0.65, 0.85),
        _row("dp-sgd", 2.0, 0.80, 0.9),
        _row("dp-double-spider", 2.0, 0.95, 0.9),  # a baseline, not a Paper D method
        _row("dp-oco-exp3", 2.0, 0.70, 0.9),
    ]
    v = {x["epsilon"]: x for x in verdict(summarize(rows), epsilons=(1.0, 2.0))}
    assert v[1.0]["best_method"] == "noisy-sgd-mgr" and v[1.0]["difference"] > 0  # AGS averages 0.60 over seeds
    assert v[2.0]["best_method"] == "dp-oco-exp3" and v[2.0]["difference"] < 0


def _seeds(method, eps, wgs):
    return [_row(method, eps, wg, 0.9, seed=s) for s, wg in enumerate(wgs)]


def test_the_verdict_claims_a_side_only_when_the_welch_interval_over_the_seeds_is_on_it():
    rows = (
        _seeds("dp-sgd", 1.0, [0.60, 0.62, 0.61]) + _seeds("noisy-sgd-ags", 1.0, [0.80, 0.82, 0.81])  # a clear win
        + _seeds("dp-sgd", 2.0, [0.60, 0.70, 0.65]) + _seeds("noisy-sgd-mgr", 2.0, [0.62, 0.72, 0.64])  # noise
        + _seeds("dp-sgd", 5.0, [0.60]) + _seeds("noisy-sgd-mgr", 5.0, [0.90])  # one seed: no claim
    )  # fmt: skip
    v = {x["epsilon"]: x for x in verdict(summarize(rows), epsilons=(1.0, 2.0, 5.0))}
    win, tie, one = v[1.0], v[2.0], v[5.0]
    ci = stats.ttest_ind([0.80, 0.82, 0.81], [0.60, 0.62, 0.61], equal_var=False).confidence_interval(0.95)
    assert (win["low"], win["high"]) == pytest.approx((ci.low, ci.high)) and win["low"] > 0
    assert win["difference"] == pytest.approx(0.2) and win["verdict"] == "ahead" and win["runs"] == 3
    assert tie["difference"] == pytest.approx(0.01) and tie["low"] < 0 < tie["high"]
    assert tie["verdict"] == "ahead within noise"  # above on the means, no claim
    assert one["verdict"] == "no interval" and math.isnan(one["low"]) and (one["runs"], one["baseline_runs"]) == (1, 1)
    text = verdict_markdown(list(v.values()))
    assert (
        f"| 1 | noisy-sgd-ags | 0.810 (0.900) | 0.610 (0.900) | +0.200 | [{ci.low:+.3f}, {ci.high:+.3f}] | 3 / 3 |"
        in text
    )
    assert "| 5 | noisy-sgd-mgr | 0.900 (0.900) | 0.600 (0.900) | +0.300 | – | 1 / 1 | no interval |" in text
    assert text.endswith(
        "Of 3 ε values: 1 ahead of DP-SGD with the whole interval above zero, 1 within the seeds' noise, 0 behind with "
        "the whole interval below zero, 1 without an interval (fewer than two runs on a side)."
    )
    assert "higher" not in text and verdict_markdown([]) == ""


def _runs(ks, private, twin):
    return [{"private": private(k), "non_private": twin(k), "z": [1.0, 1.0]} for k in ks]


def test_rate_fit_recovers_a_power_law_and_names_the_measured_dominant_term():
    ks = [1000, 4000, 16000, 64000]
    # the twin (no noise) carries almost all of the excess: the statistical term dominates
    curve = _fit(ks, _runs(ks, lambda k: [2.9 * k**-0.5, 3.1 * k**-0.5], lambda k: [2.0 * k**-0.5] * 2), 20.0)
    assert curve["measured_slope"] == pytest.approx(-0.5, abs=1e-9)
    lo, hi = curve["measured_slope_ci95"]
    assert lo < -0.5 < hi and hi - lo < 0.2
    assert curve["dominant_term"] == "statistical" and curve["theorem_slope"] == -0.5 and curve["within_015"]
    # the noise carries most of it and falls like 1/K: the privacy term
    curve = _fit(ks, _runs(ks, lambda k: [50.0 / k] * 2, lambda k: [1.0 / k] * 2), 2.0)
    assert curve["dominant_term"] == "privacy" and curve["theorem_slope"] == -1.0 and curve["within_015"]
    # the share crosses 1/2 (0.99 … 0.36): the larger average share names the term, and the crossing is flagged
    curve = _fit(ks, _runs(ks, lambda k: [1e-3] * 2, lambda k: [k * 1e-8] * 2), 2.0)
    assert curve["dominant_term"] == "privacy" and curve["share_crosses_half"]
    assert not curve["within_015"]  # a flat curve is no −1 slope
    t = theorem2_terms(1000.0, p=4, d=22, epsilon=0.01)
    assert t["privacy"] > t["statistical"]  # at tiny ε the privacy term dominates


def test_rate_sweep_runs_private_and_twin_runs():
    rates = run_rates(seeds=2, grid={20.0: (400, 800)}, insecure_seed=0, log=lambda s: None)
    curve = rates["curves"]["20.0"]
    assert len(curve["runs"]) == 2 and len(curve["runs"][0]["private"]) == 2
    assert all(r["phase1_noise_norm"][0] > 0 for r in curve["runs"])
    assert all(x >= -1e-3 for r in curve["runs"] for x in r["non_private"])  # excess over the minimax value


@pytest.fixture
def small_protocol(monkeypatch):
    options = {"num_groups": 3, "dim": 4, "n_train": 600, "n_test_per_group": 200, "group_fractions": [0.6, 0.3, 0.1]}
    tiny = protocol.Schedule(epochs=1, batch=50, group_batch=100, oco_batch=10, options=options)
    monkeypatch.setitem(protocol.DATASETS, "synthetic", ("synthetic-groups", tiny))


@pytest.mark.slow
def test_reproduction_writes_every_output(tmp_path, small_protocol):
    methods = ["noisy-sgd-ags", "minimax-phased-erm", "dp-sgd", "group-dro"]
    res = run_worst_group(
        dataset="synthetic", epsilons=[2.0], seeds=1, out_dir=tmp_path, methods=methods, tune_grid=False,
        rates=False, reference=True, insecure_seed=0, log=lambda s: None,
    )  # fmt: skip
    ref = res["minimax_reference"]
    # the minimax point minimises the worst training-group loss: never above ERM's (up to the certified gap)
    assert ref["train_worst_group_loss"]["minimax"] <= ref["train_worst_group_loss"]["erm"] + 1e-3
    assert "train_worst_group_loss" in ref["note"] and "NOT private" in ref["note"]  # training-split values
    assert "worst-group minimax (certified)" in res["markdown"]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == set(methods) and len(rows) == 4
    keys = {"dataset", "method", "epsilon", "epsilon_spent", "seed", "worst_group_accuracy", "average_accuracy",
            "worst_group_loss", "per_group", "wall_s"}  # fmt: skip
    assert all(keys <= set(r) for r in rows)
    private = [r for r in rows if r["private"]]
    assert all(r["epsilon_spent"] <= 2.0 + 1e-9 and math.isfinite(r["worst_group_accuracy"]) for r in private)
    for name in ("summary.md", "summary.json", "tuning.json", "worst_group_vs_epsilon.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert res["verdict"] and "Per-group test accuracy" in res["markdown"]
    (saved,) = json.loads((tmp_path / "summary.json").read_text())["verdict"]  # one seed: never a claim
    assert saved["verdict"] == "no interval" and "| 1 / 1 | no interval |" in res["markdown"]
    with pytest.raises(ConfigError, match="already holds"):
        run_worst_group(dataset="synthetic", epsilons=[2.0], seeds=1, out_dir=tmp_path, methods=methods)


def test_bad_arguments_fail_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset"):
        run_worst_group(dataset="mnist", out_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="epsilons"):
        run_worst_group(dataset="synthetic", epsilons=[0.0], out_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="unknown method.*worst-group runs only its protocol's: .*noisy-sgd-mgr"):
        run_worst_group(dataset="synthetic", methods=["nope"], out_dir=tmp_path / "c")
    # A registered algorithm without the protocol's tuning grid and settings (it was refused after --out existed)
    with pytest.raises(ConfigError, match="unknown method.*'sgd'.*runs only its protocol's"):
        run_worst_group(dataset="synthetic", methods=["dp-sgd", "sgd"], out_dir=tmp_path / "d")
    assert not any(tmp_path.iterdir())


def test_worst_group_takes_no_budget_and_says_why(tmp_path, capsys):
    """The other reproductions take --budget {quick,paper}; Paper D has no experiments, hence no paper schedule."""
    from privopt.cli import main

    for budget in ("quick", "paper"):
        with pytest.raises(SystemExit) as e:
            main(
                ["reproduce", "worst-group", "--dataset", "synthetic", "--budget", budget, "--out", str(tmp_path / "o")]
            )
        assert e.value.code == 2
        assert "worst-group has no --budget: Paper D prints no experiments" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit):
        main(["reproduce", "worst-group", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "no --budget: Paper D prints no experiments, so there is no paper schedule to choose" in help_text
    assert "--budget BUDGET" not in help_text  # not an option of this command: only its refusal


def test_every_method_has_a_grid_of_the_same_size():
    sizes = {m: len(protocol.grid(m)) for m in protocol.PAPER_D + protocol.BASELINES}
    assert set(sizes.values()) == {6}
    for m in protocol.PAPER_D + protocol.BASELINES:
        for point in protocol.grid(m):
            params = protocol.method_params(m, protocol.DATASETS["adult"][1], point)
            from privopt.algorithms import get_algorithm

            get_algorithm(m, **params)  # every grid point is a valid config
    assert np.isclose(protocol.TUNE_EPSILON, 2.0)


def test_two_jobs_give_the_serial_rows(tmp_path):
    """``jobs=2`` (spawned workers, which load the real synthetic protocol themselves): the serial
    rows in the serial (seed, method, ε) order, bit for bit with an insecure seed."""
    rows, methods = {}, ["dp-sgd", "group-dro"]
    for jobs in (1, 2):
        res = run_worst_group(
            dataset="synthetic", epsilons=[2.0], seeds=2, out_dir=tmp_path / f"j{jobs}", methods=methods,
            tune_grid=False, rates=False, insecure_seed=3, log=lambda s: None, jobs=jobs,
        )  # fmt: skip
        assert res["jobs"] == jobs
        summary = json.loads((tmp_path / f"j{jobs}" / "summary.json").read_text())
        assert summary["schedule"] == protocol.schedule_summary("synthetic") and summary["schedule"]["epochs"] == 20
        assert "Schedule of every method: 20 epochs, DP-SGD batch 256" in res["markdown"]
        lines = (tmp_path / f"j{jobs}" / "results.jsonl").read_text().splitlines()
        rows[jobs] = [{k: v for k, v in json.loads(s).items() if k not in ("wall_s", "cpu_s")} for s in lines]
    assert [(r["seed"], r["method"]) for r in rows[2]] == [(s, m) for s in (0, 1) for m in methods]
    assert rows[1] == rows[2]
