"""End-to-end benchmark: whole training runs, private against non-private (``privopt bench --end-to-end``).

Each run is a complete ``privopt.training.train`` call (data loading, noise calibration, every
step, the scheduled evaluations, checkpoints and outputs) with secret randomness, as a user runs
it, in a fresh subprocess (so that one run's caches and allocator state do not help the next, and
its peak memory is its own). Runs are interleaved: each round runs every method once, in the same
order, so that the load of a shared machine hits all methods alike; the median over rounds is
reported. Each run also reports where its time went (:mod:`privopt.bench_profile`).

Methods and their non-private reference:

* ``dp-sgd``: against ``sgd`` with the same model, data, epochs, batch size and learning rate
  (the same expected number of gradient evaluations).
* ``dp-double-spider`` / ``dp-recursive-spider``: ``steps`` steps of the DP DRO methods (each
  step is a difference query at two points, plus periodic large refresh batches), against
  ``sgd`` run for the same number of per-record gradient evaluations (measured in the first
  round: the epochs of the matching ``sgd`` run are ``grad_evals / n``). Their rows are named
  ``sgd@dp-double-spider`` etc.

Timings are wall time of the ``train`` call (after importing torch and ``torch._dynamo``, which
every method pays once at start-up); ``cpu_s`` is the process CPU time over the same
interval (more than the wall time when several threads work); ``main_cpu_s`` is the CPU time of
the thread that runs the training alone (not the noise thread): on a busy machine, where wall
times wait for a core, it is the steadier measure of the critical path, and its ratio
``main_cpu_ratio`` the steadier comparison (it assumes a free core for the noise drawn ahead).
``peak_mb`` is the peak resident set size of the run's process (interpreter, torch and data
included).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from privopt.errors import ConfigError, RunFailed, debug_enabled
from privopt.quiet import public_tail

__all__ = ["ACCOUNTING_CACHES", "E2E_METHODS", "run_end_to_end", "format_e2e"]

E2E_METHODS = ("dp-sgd", "dp-double-spider", "dp-recursive-spider")
ACCOUNTING_CACHES = ("fresh", "off", "user")
_SPIDERS = ("dp-double-spider", "dp-recursive-spider")
_LR, _CLIP = 0.5, 1.0
_OWN_PREFIX = re.compile(r"^privopt: (error|run failed|failed): ")  # a child's own line, quoted after ours


def _params(method: str, *, epochs: float, batch_size: int, spider_steps: int) -> dict:
    from privopt.algorithms.dro_presets import PAPER_DEFAULTS

    if method == "sgd":
        return {"epochs": epochs, "batch_size": batch_size, "lr": _LR}
    if method == "dp-sgd":
        return {"epochs": epochs, "batch_size": batch_size, "lr": _LR, "clip": _CLIP}
    # The SPIDER methods keep the paper-scale schedule the benchmark was set up with (q = 32, refresh
    # batches of 2048), not the current defaults, so timings stay comparable across versions.
    if method == "dp-double-spider":
        return {**PAPER_DEFAULTS[method], "steps": spider_steps, "N2": batch_size, "N4": batch_size}
    if method == "dp-recursive-spider":
        return {**PAPER_DEFAULTS[method], "steps": spider_steps, "b2": batch_size, "b4": batch_size}
    raise ConfigError(f"unknown end-to-end method {method!r}; choose from {', '.join(E2E_METHODS)}")


def _child(spec: dict) -> dict:
    """One training run in this process, as described by ``spec``; its time, memory and breakdown."""
    import torch

    from privopt.bench import _status_mb
    from privopt.bench_profile import Breakdown
    from privopt.config import RunConfig
    from privopt.training import train

    if spec["threads"]:
        torch.set_num_threads(int(spec["threads"]))
    # torch.optim imports torch._dynamo on first use (seconds): interpreter start-up, common to every
    # method, not training. The DP SPIDER methods use no torch optimizer and would be spared it.
    import torch._dynamo

    cfg = RunConfig(
        algorithm=spec["algorithm"],
        algorithm_params=spec["params"],
        dataset=spec["dataset"],
        data_dir=spec["data_dir"],
        model=spec["model"],
        privacy={"epsilon": spec["epsilon"], "delta": spec["delta"]},
        plots=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cpu0, main0 = time.process_time(), time.thread_time()
        with Breakdown() as bd:
            record = train(cfg, out_dir=os.path.join(tmp, "run"), progress=False)
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
    return {
        "wall_s": bd.wall_s,
        "cpu_s": cpu,
        "main_cpu_s": main,
        "peak_mb": _status_mb("VmHWM"),
        "steps": int(record["steps_done"]),
        "grad_evals": int(bd.counts["grad_evals"] or bd.counts["sampled"]),
        "status": record["status"],
        "breakdown": bd.as_dict(),
    }


def _child_main(spec_json: str) -> int:
    """The child process: one run, its result as JSON on stdout. A failure is reported as the CLI
    reports one: privopt's own error in full (exit 2; 4 for a run that failed), any other exception's
    type and where only (exit 4), unless debugging (its traceback)."""
    import traceback

    from privopt.errors import PrivoptError, debug_enabled
    from privopt.quiet import foreign_error_line

    try:
        result = _child(json.loads(spec_json))
    except PrivoptError as e:
        code = int(getattr(e, "exit_code", 2))
        print(f"privopt: {'run failed' if code == 4 else 'error'}: {e}", file=sys.stderr)
        return code
    except Exception as e:  # raised by torch or the user's code: its text may quote a record
        if debug_enabled():
            traceback.print_exception(e, file=sys.stderr)
        else:
            print(f"privopt: failed: {foreign_error_line(e)}", file=sys.stderr)
        return 4
    print(json.dumps(result))
    return 0


def _spawn(spec: dict, env: dict | None = None) -> dict:
    code = "import sys; from privopt.bench_e2e import _child_main; sys.exit(_child_main(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        if debug_enabled():  # the child's traceback and warnings, in full
            sys.stderr.write(out.stderr)
        tail = public_tail(out.stderr) if out.returncode > 0 else f"killed by signal {-out.returncode}"
        what = f"end-to-end run {spec['algorithm']} on {spec['model']}: {_OWN_PREFIX.sub('', tail)}"
        raise ConfigError(what) if out.returncode == 2 else RunFailed(what)  # a user error, else a failed run
    return json.loads(out.stdout.strip().splitlines()[-1])


def _n_train(dataset: str, data_dir: str | None) -> int:
    from privopt.data import load_dataset

    return int(load_dataset(dataset, data_dir=data_dir, seed=0).y_train.shape[0])


def run_end_to_end(
    *,
    models: Sequence[str] = ("mlp", "cnn"),
    methods: Sequence[str] = E2E_METHODS,
    batch_size: int = 256,
    epochs: float = 1.0,
    spider_steps: int = 64,
    dataset: str = "mnist-st",
    data_dir: str | None = None,
    repeats: int = 3,
    threads: int | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    progress: bool = True,
    accounting_cache: str = "fresh",
) -> list[dict]:
    """Median wall time of whole training runs of each method beside its non-private reference.

    ``accounting_cache`` says what the runs' on-disk accounting cache (docs/accounting.md,
    "Caching") holds: ``"fresh"`` (default) an empty directory for this benchmark, so the first
    round pays every calibration and PLD evaluation and later rounds find them, as a user's second
    run of a configuration does; ``"off"`` every run computes everything; ``"user"`` the user's
    own cache, as it is.

    Returns:
        One dict per (model, method) and per non-private reference (``sgd``; ``sgd@<spider>``),
        with ``model``, ``method``, ``mode`` (``"end-to-end"``), ``batch_size``, ``median_s``,
        ``min_s``, ``cpu_s`` (median), ``main_cpu_s`` (median CPU time of the training thread),
        ``ratio_to_nonprivate``, ``main_cpu_ratio`` (the same ratio of ``main_cpu_s``), ``peak_mb``, ``steps``,
        ``grad_evals``, ``records_per_s`` (gradient evaluations per second), ``breakdown``
        (median seconds per component), ``threads``, ``repeats``, ``load_avg`` (1-minute load
        average before and after) and ``reference`` (the row the ratio is taken against).
    """
    methods = list(methods)
    bad = [m for m in methods if m not in E2E_METHODS]
    if bad or not methods:
        raise ConfigError(f"unknown end-to-end method(s) {bad or methods}; choose from {', '.join(E2E_METHODS)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    if accounting_cache not in ACCOUNTING_CACHES:
        raise ConfigError(f"accounting_cache must be one of {', '.join(ACCOUNTING_CACHES)}, got {accounting_cache!r}")
    with tempfile.TemporaryDirectory(prefix="privopt-bench-cache-") as tmp:
        env = None if accounting_cache == "user" else dict(os.environ)
        if env is not None:
            env["PRIVOPT_ACCOUNTING_CACHE"] = tmp if accounting_cache == "fresh" else "off"
        base = {"dataset": dataset, "data_dir": data_dir, "threads": threads, "epsilon": epsilon, "delta": delta}
        shape = {"batch_size": batch_size, "epochs": epochs, "spider_steps": spider_steps}
        rows = _run_rounds(models, methods, base, shape, repeats=repeats, progress=progress, env=env)
    for r in rows:
        r["accounting_cache"] = accounting_cache
    return rows


def _run_rounds(models, methods, base: dict, shape: dict, *, repeats: int, progress: bool, env) -> list[dict]:
    """Every round runs every (model, method) once, in the same order; the rows of their medians."""
    batch_size, epochs, spider_steps = shape["batch_size"], shape["epochs"], shape["spider_steps"]
    n = _n_train(base["dataset"], base["data_dir"])
    load0 = os.getloadavg()[0]
    runs: dict[tuple[str, str], list[dict]] = {}
    sgd_epochs: dict[str, float] = {}
    order = ["sgd", *methods]
    for _ in range(repeats):
        for model in models:
            for label in order + [f"sgd@{m}" for m in methods if m in _SPIDERS]:
                algo = "sgd" if label.startswith("sgd") else label
                ep = sgd_epochs.get(label.partition("@")[2], epochs)
                params = _params(algo, epochs=ep, batch_size=batch_size, spider_steps=spider_steps)
                res = _spawn(dict(base, model=model, algorithm=algo, params=params), env)
                runs.setdefault((model, label), []).append(res)
                if label in _SPIDERS and label not in sgd_epochs:
                    sgd_epochs[label] = res["grad_evals"] / n
                if progress:
                    print(f"{model} {label}: {res['wall_s']:.2f} s ({res['grad_evals']} grads)", file=sys.stderr)
    load1 = os.getloadavg()[0]
    return _rows(runs, batch_size=batch_size, threads=base["threads"], repeats=repeats, load=(load0, load1))


def _rows(runs, *, batch_size, threads, repeats, load) -> list[dict]:
    rows = []
    for (model, label), rs in runs.items():
        wall = [r["wall_s"] for r in rs]
        comps = rs[0]["breakdown"].keys()
        ref = "sgd" if label in ("sgd", "dp-sgd") else (None if label.startswith("sgd@") else f"sgd@{label}")
        row = {
            "model": model,
            "method": label,
            "mode": "end-to-end",
            "batch_size": batch_size,
            "median_s": statistics.median(wall),
            "min_s": min(wall),
            "wall_s_each": wall,  # in round order: the first round may pay a cold accounting cache
            "cpu_s_each": [r["cpu_s"] for r in rs],
            "cpu_s": statistics.median(r["cpu_s"] for r in rs),
            "main_cpu_s": statistics.median(r["main_cpu_s"] for r in rs),
            "peak_mb": statistics.median(r["peak_mb"] or 0.0 for r in rs),
            "steps": rs[0]["steps"],
            "grad_evals": statistics.median(r["grad_evals"] for r in rs),
            "breakdown": {c: statistics.median(r["breakdown"][c] for r in rs) for c in comps},
            "threads": threads,
            "repeats": repeats,
            "load_avg": list(load),
            "reference": ref,
            "ratio_to_nonprivate": None,
            "main_cpu_ratio": None,
        }
        row["records_per_s"] = row["grad_evals"] / row["median_s"] if row["median_s"] > 0 else None
        rows.append(row)
    by_key = {(r["model"], r["method"]): r for r in rows}
    for r in rows:
        ref = by_key.get((r["model"], r["reference"])) if r["reference"] else None
        if ref is not None:
            r["ratio_to_nonprivate"] = r["median_s"] / ref["median_s"]
            r["main_cpu_ratio"] = r["main_cpu_s"] / ref["main_cpu_s"] if ref["main_cpu_s"] > 0 else None
    return rows


def format_e2e(rows: Sequence[dict]) -> str:
    """Markdown: the end-to-end table, then the time breakdown (median seconds per component).

    Example:
        >>> row = {"model": "mlp", "method": "sgd", "batch_size": 8, "median_s": 2.0, "cpu_s": 2.0,
        ...        "main_cpu_s": 1.9, "ratio_to_nonprivate": None, "main_cpu_ratio": None, "peak_mb": 300.0,
        ...        "steps": 10, "grad_evals": 80, "records_per_s": 40.0, "reference": None,
        ...        "breakdown": {"evaluation": 0.5, "other": 1.5}}
        >>> print(format_e2e([row]).splitlines()[2])
        | mlp | sgd | 8 | 10 | 80 | 2.00 | 2.00 | 1.90 | – | – | 40 | 300 |
    """
    from privopt.bench import _num

    lines = [
        "| model | method | batch | steps | grad evals | wall s | cpu s | main-thread cpu s | × non-private "
        "| × non-private (main cpu) | records/s | peak MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {r['batch_size']} | {r['steps']} | {r['grad_evals']:.0f} | "
            f"{_num(r['median_s'], '.2f')} | {_num(r['cpu_s'], '.2f')} | {_num(r.get('main_cpu_s'), '.2f')} | "
            f"{_num(r['ratio_to_nonprivate'], '.2f')} | {_num(r.get('main_cpu_ratio'), '.2f')} | "
            f"{_num(r['records_per_s'], '.0f')} | {_num(r['peak_mb'], '.0f')} |"
        )
    comps = list(rows[0]["breakdown"]) if rows else []
    lines += ["", "| model | method | " + " | ".join(comps) + " |", "|---|---|" + "---:|" * len(comps)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | " + " | ".join(f"{r['breakdown'][c]:.2f}" for c in comps) + " |"
        )
    return "\n".join(lines)
