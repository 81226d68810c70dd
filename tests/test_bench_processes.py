"""``privopt bench --processes N``: each (model, batch) timed in N fresh processes; the ratio is the
median of theirs and its range is given."""

import json
import statistics

import pytest

import privopt.bench_procs as procs
from privopt.bench import run_bench
from privopt.cli import main
from privopt.errors import ConfigError, RunFailed


def test_rows_give_the_median_and_range_of_the_processes_ratios(monkeypatch):
    seen = []
    real = procs.times_in_processes

    def spy(*args, **kw):
        out = real(*args, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(procs, "times_in_processes", spy)
    rows = run_bench(models=("tiny",), batch_sizes=(4,), repeats=2, progress=False, threads=1,
                     methods=("nonprivate", "dp-sgd"), memory=False, processes=3)  # fmt: skip
    ((pooled, ratios),) = seen
    assert len(ratios["dp-sgd"]) == 3 and len(pooled["dp-sgd"]) == 6  # 3 processes x 2 repeats
    dp = next(r for r in rows if r["method"] == "dp-sgd")
    assert dp["processes"] == 3
    assert dp["ratio_to_nonprivate"] == statistics.median(ratios["dp-sgd"])
    assert dp["ratio_range"] == [min(ratios["dp-sgd"]), max(ratios["dp-sgd"])]
    assert dp["median_s"] == statistics.median(pooled["dp-sgd"])
    assert next(r for r in rows if r["method"] == "nonprivate")["ratio_to_nonprivate"] == 1.0


def test_one_process_is_the_default_and_has_no_range():
    (row,) = [r for r in run_bench(models=("tiny",), batch_sizes=(4,), repeats=1, progress=False,
                                   methods=("dp-sgd",), memory=False) if r["method"] == "dp-sgd"]  # fmt: skip
    assert row["processes"] == 1 and row["ratio_range"] is None


def test_bad_counts_and_failed_processes_are_reported(monkeypatch):
    with pytest.raises(ConfigError, match="processes must be an integer >= 1"):
        run_bench(models=("tiny",), batch_sizes=(4,), processes=0, progress=False, memory=False)
    monkeypatch.setattr(procs, "_CHILD", "raise SystemExit(3)\n")
    with pytest.raises(RunFailed, match=r"benchmark process 1 of 2 \(tiny, batch 4\) failed"):
        run_bench(models=("tiny",), batch_sizes=(4,), processes=2, progress=False, memory=False,
                  methods=("dp-sgd",))  # fmt: skip


def test_cli_processes_option(capsys):
    args = ["bench", "--models", "tiny", "--batch-sizes", "4", "--repeats", "1", "--methods", "dp-sgd"]
    assert main([*args, "--processes", "2", "--no-memory", "--json", "--threads", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["processes"] for r in rows} == {2} and all(len(r["ratio_range"]) == 2 for r in rows)
