"""``privopt bench --breakdown``: each step's time by component (the timings themselves are not asserted)."""

import json

import pytest

import privopt.bench as bench
from privopt.bench import run_bench
from privopt.bench_breakdown import STEP_COMPONENTS, format_breakdown
from privopt.grads import release
from privopt.grads.ghost import capture

NONPRIVATE = ("forward (non-private)", "backward (non-private)")
ENGINE = (
    "engine: forward",
    "engine: per-layer work in the backward pass",
    "engine: backward pass (autograd)",
    "engine: norms and clip factors",
)


def _rows(**kw):
    methods = ("dp-sgd", "clipped-difference", "dp-sgd-vmap")
    return run_bench(models=("tiny",), batch_sizes=(4,), repeats=2, progress=False, methods=methods, memory=False, **kw)


def test_each_method_is_charged_to_its_own_components():
    rows = {r["method"]: r["breakdown"] for r in _rows(breakdown=True)}
    assert all(list(b) == list(STEP_COMPONENTS) for b in rows.values())
    base = rows["nonprivate"]
    assert all(base[c] > 0 for c in NONPRIVATE) and all(base[c] == 0 for c in (*ENGINE, "noise"))
    for m in ("dp-sgd", "clipped-difference"):
        assert all(rows[m][c] > 0 for c in (*ENGINE, "noise")), m
        assert all(rows[m][c] == 0 for c in NONPRIVATE), m
    vmap = rows["dp-sgd-vmap"]  # no ghost capture: the whole query is the engine's rest
    assert vmap["engine: clipped sums and rest"] > 0 and all(vmap[c] == 0 for c in ENGINE)


def test_without_the_flag_rows_have_no_breakdown_and_nothing_stays_patched():
    assert all(r["breakdown"] is None for r in _rows())
    _rows(breakdown=True)
    for fn in (
        release.draw_gaussian_noise,
        bench.nonprivate_forward,
        bench.nonprivate_backward,
        capture.Capture._forward,
        capture._Collector.process,
    ):
        assert not hasattr(fn, "__privopt_timed__"), fn


def test_fresh_processes_keep_their_ratios_and_add_an_in_process_breakdown():
    rows = run_bench(
        models=("tiny",),
        batch_sizes=(4,),
        repeats=1,
        progress=False,
        methods=("dp-sgd",),
        memory=False,
        processes=2,
        breakdown=True,
    )
    assert all(r["ratio_range"] is not None and r["breakdown"] for r in rows)


def test_cli_prints_one_table_per_model_and_batch(capsys):
    from privopt.cli import main

    argv = ["bench", "--models", "tiny", "--batch-sizes", "4,8", "--repeats", "1", "--no-memory", "--quiet"]
    assert main([*argv, "--methods", "dp-sgd", "--breakdown"]) == 0
    out = capsys.readouterr().out
    for bs in (4, 8):
        block = out.split(f"Where the time goes, tiny at batch {bs}")[1].split("\n\n")[0].splitlines()
        assert block[1] == "| component | nonprivate | dp-sgd |"
        assert [line.split(" | ")[0][2:] for line in block[3:]] == [*STEP_COMPONENTS, "total"]
    assert main([*argv, "--methods", "dp-sgd", "--breakdown", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["nonprivate", "dp-sgd"] * 2 and all(r["breakdown"] for r in rows)


def test_format_breakdown_totals_the_components():
    rows = [{"model": "m", "batch_size": 2, "method": "dp-sgd", "breakdown": {"a": 0.001, "b": 0.0025}}]
    assert format_breakdown(rows).splitlines()[-1] == "| total | 3.50 |"
    assert format_breakdown([{**rows[0], "breakdown": None}]) == ""


@pytest.mark.parametrize("method", ["nonprivate", "dp-sgd"])
def test_breakdown_of_a_step_adds_up_to_about_its_wall_time(method):
    """Every component is a share of the step: their sum is the step's wall time (no double counting)."""
    import time

    from privopt.bench_breakdown import step_breakdowns

    base = bench.build_bench_model("tiny")
    x, y = bench._data("tiny", 16)
    step = bench._make_step(method, base, x, y)
    step()
    t0 = time.perf_counter()
    parts = step_breakdowns({method: step}, repeats=1)[method]
    wall = time.perf_counter() - t0
    assert 0 < sum(parts.values()) <= wall
