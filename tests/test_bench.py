"""Smoke test of the benchmark harness on a tiny model (timings themselves are not asserted)."""

import pytest

from privopt.bench import METHODS, format_table, run_bench
from privopt.errors import ConfigError


def test_run_bench_tiny_rows_and_table():
    rows = run_bench(
        models=("tiny",),
        batch_sizes=(4,),
        repeats=1,
        progress=False,
        methods=METHODS,
        memory=False,
    )
    assert [r["method"] for r in rows] == list(METHODS)
    base = rows[0]
    assert base["method"] == "nonprivate" and base["ratio_to_nonprivate"] == pytest.approx(1.0)
    for r in rows:
        assert {
            "model",
            "batch_size",
            "method",
            "median_s",
            "peak_mb",
            "ratio_to_nonprivate",
        } <= set(r)
        assert r["model"] == "tiny" and r["batch_size"] == 4
        if r["median_s"] is None:  # only optional Opacus rows may be skipped, and they say why
            assert r["method"].startswith("opacus") and r["note"]
        else:
            assert r["median_s"] > 0
            assert r["ratio_to_nonprivate"] == pytest.approx(r["median_s"] / base["median_s"])
    table = format_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows) and lines[0].startswith("| model |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_run_bench_measures_memory_in_subprocess():
    rows = run_bench(
        models=("tiny",),
        batch_sizes=(8,),
        repeats=1,
        progress=False,
        methods=("dp-sgd",),
    )
    assert [r["method"] for r in rows] == [
        "nonprivate",
        "dp-sgd",
    ]  # the baseline is always added
    assert all(r["peak_mb"] is not None and r["peak_mb"] >= 0 for r in rows)


def test_run_bench_rejects_bad_arguments():
    with pytest.raises(ConfigError, match="warp"):
        run_bench(
            models=("tiny",),
            batch_sizes=(4,),
            repeats=1,
            methods=("warp",),
            memory=False,
        )
    with pytest.raises(ConfigError, match="repeats"):
        run_bench(models=("tiny",), batch_sizes=(4,), repeats=0, memory=False)
    with pytest.raises(ConfigError, match="vgg"):
        run_bench(models=("vgg",), batch_sizes=(4,), repeats=1, memory=False, progress=False)


def test_step_rows_say_their_mode_and_load():
    rows = run_bench(models=("tiny",), batch_sizes=(4,), repeats=1, progress=False, methods=("dp-sgd",), memory=False)
    assert {r["mode"] for r in rows} == {"step"}
    assert all(len(r["load_avg"]) == 2 for r in rows)


def _tiny_cfg(algorithm, **params):
    from privopt.config import RunConfig

    return RunConfig(
        algorithm=algorithm,
        algorithm_params=params,
        dataset="digits",
        model="mlp",
        privacy={"epsilon": 1.0, "delta": 1e-5},
        plots=False,
        insecure_seed=0,
    )


def test_breakdown_accounts_for_a_whole_training_run(tmp_path):
    from privopt.bench_profile import COMPONENTS, Breakdown
    from privopt.grads.ghost.engine import GhostEngine
    from privopt.training import run as run_mod
    from privopt.training import train

    before = (GhostEngine.clipped_sum, run_mod.evaluate, run_mod.run_loop)
    with Breakdown() as bd:
        record = train(
            _tiny_cfg("dp-sgd", epochs=0.2, batch_size=64, lr=0.5, clip=1.0), out_dir=tmp_path / "r", progress=False
        )
    times = bd.as_dict()
    assert list(times) == list(COMPONENTS)
    assert sum(times.values()) == pytest.approx(bd.wall_s, rel=1e-6)  # "other" closes the sum
    parts = ("setup: noise calibration", "setup: model checks", "evaluation", "engine: forward+backward", "noise")
    for part in (*parts, "accounting"):
        assert times[part] > 0, part
    # every record of every sampled batch had its gradient computed once
    assert bd.counts["grad_evals"] == bd.counts["sampled"] > 0
    assert record["steps_done"] == bd.calls["step: update and other"]
    assert (GhostEngine.clipped_sum, run_mod.evaluate, run_mod.run_loop) == before  # patches undone


def test_breakdown_counts_two_gradients_per_record_of_a_difference_query():
    import torch
    from torch import nn

    from privopt.bench_profile import Breakdown
    from privopt.grads import get_engine

    model = nn.Linear(3, 2)
    loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    prev = {n: p.detach() + 0.1 for n, p in model.named_parameters()}
    one = lambda losses, norms: torch.ones_like(norms)
    x, y = torch.randn(40, 3), torch.zeros(40, dtype=torch.long)
    with Breakdown() as bd:
        get_engine("ghost").clipped_sum(model, loss, x, y, clip=1.0)
        get_engine("vmap").clipped_sum(model, loss, x[:5], y[:5], clip=1.0, params_prev=prev)
    assert bd.counts["grad_evals"] == 40 + 2 * 5
    # the one-pass DRO queries count too, each once (the ghost engine's own passes are not queries)
    for name in ("ghost", "vmap"):
        with Breakdown() as bd:
            get_engine(name).scaled_sum(model, loss, x, y, scale=one)
            get_engine(name).scaled_diff_sum(
                model, loss, x[:7], y[:7], clip=1.0, scale=one, scale_prev=one, params_prev=prev
            )
        assert bd.counts["grad_evals"] == 40 + 2 * 7, name
        assert bd.calls["engine: rest (vmap, sums)"] == 2


@pytest.mark.slow
def test_end_to_end_rows_pair_each_method_with_its_reference():
    from privopt.bench_e2e import format_e2e, run_end_to_end

    rows = run_end_to_end(
        models=("mlp",),
        methods=("dp-double-spider",),
        batch_size=32,
        epochs=0.1,
        spider_steps=2,
        dataset="digits",
        repeats=1,
        threads=1,
        progress=False,
        accounting_cache="off",
    )
    by = {r["method"]: r for r in rows}
    assert all(r["accounting_cache"] == "off" and len(r["wall_s_each"]) == 1 for r in rows)
    assert set(by) == {"sgd", "dp-double-spider", "sgd@dp-double-spider"}
    assert all(r["mode"] == "end-to-end" and r["median_s"] > 0 and r["peak_mb"] > 0 for r in rows)
    spider, ref = by["dp-double-spider"], by["sgd@dp-double-spider"]
    assert spider["ratio_to_nonprivate"] == pytest.approx(spider["median_s"] / ref["median_s"])
    # the training thread's CPU time: part of the process's, and its own ratio
    assert all(0 < r["main_cpu_s"] <= r["cpu_s"] * 1.01 for r in rows)
    assert spider["main_cpu_ratio"] == pytest.approx(spider["main_cpu_s"] / ref["main_cpu_s"])
    # the reference made about as many gradient evaluations (Poisson batches: not exactly)
    assert 0.5 < ref["grad_evals"] / spider["grad_evals"] < 2
    assert spider["breakdown"]["setup: noise calibration"] > 0 == ref["breakdown"]["setup: noise calibration"]
    lines = format_e2e(rows).splitlines()
    assert lines[0].startswith("| model | method |") and len([ln for ln in lines if ln.startswith("| mlp |")]) == 6


def test_end_to_end_rejects_unknown_methods():
    from privopt.bench_e2e import run_end_to_end

    with pytest.raises(ConfigError, match="sgdx"):
        run_end_to_end(methods=("sgdx",), dataset="digits")
    with pytest.raises(ConfigError, match="accounting_cache"):
        run_end_to_end(methods=("dp-sgd",), dataset="digits", accounting_cache="warm")


def test_cli_times_the_chosen_methods_without_the_memory_probe(capsys):
    """``--methods`` picks rows (non-private always first), ``--no-memory`` skips the probe; the
    secure-generator and synchronous-noise rows run."""
    import json

    from privopt.cli import main

    argv = ["bench", "--models", "tiny", "--batch-sizes", "4", "--repeats", "1", "--json", "--no-memory"]
    assert main([*argv, "--methods", "dp-sgd-secure,dp-sgd-sync,noise-only-secure"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["nonprivate", "dp-sgd-secure", "dp-sgd-sync", "noise-only-secure"]
    assert all(r["peak_mb"] is None and r["median_s"] > 0 for r in rows)
