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
