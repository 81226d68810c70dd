"""Paper C's reproduction: claim checks, the configs shipped for it, and a tiny end-to-end run."""

import json
from pathlib import Path

import numpy as np
import pytest

from privopt.algorithms import get_algorithm
from privopt.config import load_config
from privopt.experiments.sosp import run_sosp
from privopt.experiments.sosp_protocol import BUDGETS, Budget, method_params, tuning_grid
from privopt.experiments.sosp_report import check_claims, format_claims, format_table

REPO = Path(__file__).resolve().parents[1]


def _rows(acc):
    """Results rows from ``{(method, m, eps): [accuracies over seeds]}``."""
    return [
        {"method": m, "clients": c, "epsilon": e, "test_accuracy": a, "test_loss": 1.0 - a}
        for (m, c, e), accs in acc.items()
        for a in accs
    ]


def test_claims_are_read_from_the_means():
    acc = {
        ("gauss-psgd", 1, 1.0): [0.80, 0.82], ("dp-spider-sosp", 1, 1.0): [0.79, 0.79], ("fed-dp-sgd", 1, 1.0): [0.83],
        ("gauss-psgd", 10, 1.0): [0.70], ("dp-spider-sosp", 10, 1.0): [0.60], ("fed-dp-sgd", 10, 1.0): [0.65],
    }  # fmt: skip
    claims = check_claims(_rows(acc))
    assert claims["beats_baseline_everywhere"] and claims["gap_widens_with_m"]
    assert claims["gap_by_clients"][1] == pytest.approx(0.02) and claims["gap_by_clients"][10] == pytest.approx(0.10)
    assert claims["gauss_at_least_dpsgd_eps1_m1"] is False
    assert claims["gauss_m10_over_m1_eps1"] == pytest.approx(0.70 / 0.81)
    assert "does NOT hold (81.0 vs 83.0)" in format_claims(claims)
    assert "| 1 | 1 | 81.0 ± 1.4 | 79.0 ± 0.0 | 83.0 |" in format_table(_rows(acc))  # one run: no "± 0.0"
    acc[("gauss-psgd", 10, 1.0)] = [0.55]  # behind at m = 10: neither claim holds
    claims = check_claims(_rows(acc))
    assert not claims["beats_baseline_everywhere"] and not claims["gap_widens_with_m"]
    assert claims["loses_to_baseline_in"] == [[10, 1.0]]


def test_beside_the_means_the_claims_give_the_welch_interval_over_the_seeds():
    acc = {
        ("gauss-psgd", 1, 1.0): [0.851, 0.853, 0.852], ("fed-dp-sgd", 1, 1.0): [0.850, 0.853, 0.851],
        ("dp-spider-sosp", 1, 1.0): [0.80, 0.81, 0.80],
        ("gauss-psgd", 10, 1.0): [0.70], ("dp-spider-sosp", 10, 1.0): [0.60],
    }  # fmt: skip
    claims = check_claims(_rows(acc))
    assert claims["gauss_at_least_dpsgd_eps1_m1"]  # on the means; the interval says it is a tie
    tie = claims["gauss_vs_dpsgd_eps1_m1_interval"]
    assert tie["low"] < 0 < tie["high"] and tie["verdict"] == "ahead within noise"
    m1, m10 = claims["against_baseline"]
    assert (m1["clients"], m1["verdict"], m10["clients"], m10["verdict"]) == (1, "ahead", 10, "no interval")
    text = format_claims(claims)
    assert "1 ahead, 0 within noise, 0 behind, 1 without an interval" in text
    assert f"holds (85.2 vs 85.1); difference +0.1 [{100 * tie['low']:+.1f}, {100 * tie['high']:+.1f}] points" in text
    assert "points over the seeds: ahead within noise.\n" in text


def test_batch_sizes_are_split_over_clients_and_local_noise_scales_the_step():
    quick = BUDGETS["quick"]
    one = method_params("gauss-psgd", quick, clients=1, split="label", trust="local")
    ten = method_params("gauss-psgd", quick, clients=10, split="label", trust="local")
    assert (ten["b1"], ten["b2"]) == (round(one["b1"] / 10), round(one["b2"] / 10))
    assert ten["lr"] == pytest.approx(one["lr"] / 10**0.5)
    assert method_params("gauss-psgd", quick, clients=10, split="label", trust="central")["lr"] == one["lr"]
    sizes = {len(tuning_grid(m, quick)) for m in ("gauss-psgd", "dp-spider-sosp", "fed-dp-sgd")}
    assert sizes == {8}  # the same tuning effort for every method


@pytest.mark.parametrize("name", ["gauss_psgd_mnist.yaml", "gauss_psgd_mnist_4clients.yaml"])
def test_shipped_configs_are_valid(name):
    cfg = load_config(REPO / "configs" / name)
    algo = get_algorithm(cfg.algorithm, **cfg.algorithm_params)
    inv = algo.inventory(n=cfg.dataset_params["max_train"])
    assert inv.composition == "filter" and "sosp" in cfg.metrics


@pytest.mark.slow
def test_a_tiny_reproduction_writes_its_outputs(shared_data, tmp_path):
    spider = {"b1": 600, "b2": 200, "lr": 0.5, "kappa": 1.0, "gamma": 3.0, "clip_diff_cap": 0.1, "refresh_share": 0.4}
    tiny = Budget(
        name="tiny",
        epochs=1,
        sampling="poisson",
        params={
            "gauss-psgd": spider,
            "dp-spider-sosp": {**spider, "period": 4},
            "fed-dp-sgd": {"batch_size": 600, "lr": 0.5},
        },
        diag_records=100,
        evals=3,
        n_train=2400,
    )
    res = run_sosp(dataset="mnist", data_dir=str(shared_data), clients=[1, 2], epsilons=[1.0], seeds=1, budget=tiny,
                   out_dir=tmp_path / "out", workers=1, insecure_seed=0, log=lambda s: None)  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    fields = {"method", "clients", "epsilon", "epsilon_spent", "seed", "test_accuracy", "test_loss", "grad_norm",
              "hessian_min_eig", "certified", "wall_s"}  # fmt: skip
    assert all(fields <= set(r) for r in rows)
    assert all(r["epsilon_spent"] <= 1.0 and r["test_accuracy"] > 0.3 for r in rows)
    assert {r["ledger_mode"] for r in rows} == {"filter", "plan"}
    assert all(r["curve"][-1][0] > 0.5 for r in rows)  # the curve runs to where the run stopped
    for m in (1, 2):
        assert (tmp_path / "out" / f"fig_mnist_m{m}.png").stat().st_size > 10_000
    assert "Gauss-PSGD" in (tmp_path / "out" / "table.md").read_text()
    assert res["summary"]["timing"]["cpu_s"] > 0


@pytest.mark.parametrize("budget", sorted(BUDGETS))
@pytest.mark.parametrize("clients", [1, 10])
def test_every_budget_builds_valid_algorithms(budget, clients):
    for method in ("gauss-psgd", "dp-spider-sosp", "fed-dp-sgd"):
        params = method_params(method, BUDGETS[budget], clients=clients, split="label", trust="local")
        inv = get_algorithm(method, **params).inventory(n=BUDGETS[budget].n_train)
        expected = (
            "parallel" if BUDGETS[budget].sampling == "disjoint" else ("plan" if method == "fed-dp-sgd" else "filter")
        )
        assert inv.composition == expected


@pytest.mark.slow
def test_a_tiny_reproduction_with_one_process_per_client(shared_data, tmp_path):
    # --launcher torchrun: each run is `torchrun --nproc_per_node=m -m privopt train` on a written config
    spider = {"b1": 600, "b2": 200, "lr": 0.5, "kappa": 1.0, "gamma": 3.0, "clip_diff_cap": 0.1, "refresh_share": 0.4}
    tiny = Budget(name="tiny", epochs=1, sampling="poisson", params={"gauss-psgd": spider}, diag_records=100, evals=3,
                  n_train=2400)  # fmt: skip
    run_sosp(dataset="mnist", data_dir=str(shared_data), clients=[2], epsilons=[1.0], seeds=1, budget=tiny,
             methods=["gauss-psgd"], launcher="torchrun", out_dir=tmp_path / "out", workers=1, insecure_seed=0,
             log=lambda s: None)  # fmt: skip
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert row["clients"] == 2 and row["epsilon_spent"] <= 1.0 and row["test_accuracy"] > 0.3
    (record_path,) = list((tmp_path / "out").rglob("record.json"))
    assert json.loads(record_path.read_text())["status"] == "finished"
    assert record_path.parent.with_suffix(".yaml").is_file()  # the config torchrun's processes read
    assert not (record_path.parent / "checkpoint.pt").exists()  # one process's secrets only: none written


def test_the_curve_starts_at_the_first_evaluation_not_at_a_made_up_epoch_0():
    from privopt.experiments.sosp import _curve
    from privopt.experiments.sosp_report import _mean_curve

    history = [{"step": 24, "epochs_used": 1.28, "test_accuracy": 0.75, "test_loss": 0.8},
               {"step": 47, "epochs_used": 2.56, "test_accuracy": 0.81, "test_loss": 0.7}]  # fmt: skip
    curve = _curve(history)
    assert curve == [[1.28, 0.75, 0.8], [2.56, 0.81, 0.7]]  # no [0.0, 0.75, ...]: the initial model was not measured
    grid = np.array([0.0, 1.28, 2.56])
    mean = _mean_curve([curve, [[1.28, 0.7, 1.0], [2.56, 0.79, 0.7]]], grid, 1)
    assert np.isnan(mean[0]) and mean[1:].tolist() == pytest.approx([(0.75 + 0.7) / 2, 0.8])


def test_a_torchrun_run_killed_on_one_rank_names_that_rank_and_its_signal(monkeypatch, tmp_path):
    # rank 1 killed (SIGKILL): rank 0's own line only says "another process failed"; which one, and how, is
    # in torchrun's report (public: a rank and an exit code), which the harness did not quote
    import subprocess

    import privopt.experiments.sosp as sosp
    from privopt.errors import ConfigError

    stderr = (
        "privopt: run failed: client process 0: the sum with the other client processes failed: another process "
        "failed, was stopped or did not answer in time (that process's own error says why)\n"
        "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 6914)  (SIGTERM)\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_15:47:26\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 6915)  (SIGKILL)\n  error_file: <N/A>\n"
    )
    monkeypatch.setattr(sosp.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", stderr))
    with pytest.raises(
        ConfigError, match=r"another process .*; torchrun: process 1 failed first, exit code -9 \(SIGKILL\)$"
    ):
        sosp._train({"algorithm_params": {"clients": 2}}, tmp_path / "run", "torchrun")
