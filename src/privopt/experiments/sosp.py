"""``privopt reproduce sosp``: Paper C's experiment — Gauss-PSGD, the Liu et al. baseline
(reconstructed) and DP-SGD on MNIST / CIFAR-10 with 1-10 clients and ε ∈ {0.5, 1, 2}.

Every run is an ordinary ``privopt train`` run (its config is in its record), launched in this
process's worker pool (``--launcher simulate``: all clients of a run in one process) or with
``torchrun --nproc_per_node=m`` (``--launcher torchrun``: one process per client, gloo). After each
run the harness measures the released model's SOSP diagnostics on training records (gradient norm,
λ_min of the Hessian by Lanczos): research measurements, NOT private. Outputs: ``results.jsonl``
(one row per run), ``table.md``, ``summary.json`` (with the claim checks and the command's wall
and CPU time and load average) and ``fig_<dataset>_m<m>.png``. Protocol: docs/algorithms/sosp.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from privopt.cliargs import add_run_outputs, float_list, int_list, positive_int
from privopt.errors import ConfigError
from privopt.experiments.privacy_notes import SOSP_TRAINING_MEASUREMENTS, notes_markdown
from privopt.experiments.sosp_protocol import (
    BUDGETS,
    CLIENTS,
    DATASETS,
    EPSILONS,
    METHODS,
    Budget,
    run_config,
)
from privopt.experiments.sosp_report import check_claims, format_claims, format_diagnostics, format_table, plot_curves
from privopt.quiet import hide_foreign_warnings, public_tail

__all__ = ["add_arguments", "main", "run_sosp", "run_one"]

_DATA: dict[tuple, Any] = {}


def _dataset(cfg: dict[str, Any]):
    from privopt.data import load_dataset

    key = (cfg["dataset"], cfg["data_dir"], cfg["seed"])
    if key not in _DATA:
        _DATA[key] = load_dataset(cfg["dataset"], data_dir=cfg["data_dir"], seed=cfg["seed"], **cfg["dataset_params"])
    return _DATA[key]


def _train(cfg: dict[str, Any], out: Path, launcher: str) -> dict[str, Any]:
    if launcher == "simulate":
        from privopt.config import RunConfig
        from privopt.training import train

        return train(RunConfig.from_dict(cfg), out_dir=out, progress=False, dataset=_dataset(cfg))
    import yaml

    clients = cfg["algorithm_params"]["clients"]
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg_path = out.with_suffix(".yaml")
    cfg_path.write_text(yaml.safe_dump(cfg))
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", f"--nproc_per_node={clients}", "-m", "privopt", "train",
           "--config", str(cfg_path), "--out", str(out), "--quiet"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        if not (out / "record.json").exists():  # the run never started: its config file is not an output
            cfg_path.unlink(missing_ok=True)
        tail = public_tail(proc.stderr)  # its text may quote data
        raise ConfigError(f"torchrun run failed ({out}): {tail}{_root_cause(proc.stderr)}")
    return json.loads((out / "record.json").read_text())


def _root_cause(stderr: str) -> str:
    """torchrun's first observed failure, as a rank and its exit code or signal (public): the one
    process-level fact to add when the quoted line only says that another process failed."""
    cause = stderr.rpartition("Root Cause (first observed failure):")[2]
    found = re.search(
        r"rank\s+: (\d+) \(local_rank: \d+\)\s+exitcode\s+: (-?\d+)[^\n]*?(\((SIG[A-Z]+)\))?$", cause, re.M
    )
    if found is None:
        return ""
    signal = f" ({found.group(4)})" if found.group(4) else ""
    return f"; torchrun: process {found.group(1)} failed first, exit code {found.group(2)}{signal}"


def _diagnostics(cfg: dict[str, Any], out: Path, *, records: int, tol: float) -> dict[str, float]:
    """SOSP diagnostics of the released model on the first ``records`` training records (NOT private)."""
    import torch

    from privopt.eval.sosp import sosp_report
    from privopt.models import build_model
    from privopt.training.metrics import build_loss

    data = _dataset(cfg)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes, **cfg["model_params"])
    model.load_state_dict(torch.load(out / "model.pt"))
    x, y = data.x_train[:records], data.y_train[:records]
    return sosp_report(model, build_loss("cross_entropy"), x, y, tol=tol, ncv=16, maxiter=12)


def _curve(history: list[dict[str, Any]]) -> list[list[float]]:
    """``[epochs, test accuracy, test loss]`` at each evaluation of a run's history. It starts at the
    first evaluation: no point at epoch 0 is made up (the initial model was not evaluated)."""
    return [[h["epochs_used"], h["test_accuracy"], h["test_loss"]] for h in history if "epochs_used" in h]


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One run (in a worker process): train, read its record, measure the diagnostics; a results row."""
    import torch

    torch.set_num_threads(1)
    cfg, out = job["config"], Path(job["out"])
    t0 = time.perf_counter()
    rec = _train(cfg, out, job["launcher"])
    wall = time.perf_counter() - t0
    diag = _diagnostics(cfg, out, records=job["diag_records"], tol=job["diag_tol"])
    hist = rec["history"]
    last = hist[-1] if hist else {}
    curve = _curve(hist)
    return {
        "method": cfg["algorithm"],
        "clients": cfg["algorithm_params"]["clients"],
        "epsilon": cfg["privacy"]["epsilon"],
        "epsilon_spent": rec["privacy"]["epsilon_spent"],  # ex-post when the run stopped early
        "epsilon_guarantee": rec["privacy"]["epsilon_guarantee"],  # the run's DP guarantee (its plan's)
        "seed": cfg["seed"],
        "test_accuracy": rec["metrics"]["test_accuracy"],
        "test_loss": rec["metrics"]["test_loss"],
        "grad_norm": diag["grad_norm"],
        "hessian_min_eig": diag["hessian_min_eig"],
        "lanczos_converged": bool(diag["lanczos_converged"]),
        "certified": {1.0: True, 0.0: False}.get(last.get("certified")),
        "wall_s": wall,
        "epochs_used": last.get("epochs_used"),
        "o1": last.get("o1"),
        "o2": last.get("o2"),
        "escapes": last.get("escapes"),
        "split": cfg["algorithm_params"]["split"],
        "trust": cfg["algorithm_params"]["trust"],
        "sampling": cfg["algorithm_params"]["sampling"],
        "ledger_mode": rec["privacy"]["ledger"].get("mode", "plan"),
        "run_dir": str(out),
        "curve": curve,
    }


class _LoadSampler:
    """The 1-minute load average every few seconds while the reproduction runs (shared machine)."""

    def __init__(self, every: float = 5.0):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _check_grid(*, clients, epsilons, seeds, methods, split, trust) -> None:
    from privopt.algorithms.federation import TRUST_MODES
    from privopt.data.splits import CLIENT_SPLITS
    from privopt.validation import positive, positive_int

    positive_int("seeds", seeds)
    for name, values, check in (("clients", clients, positive_int), ("epsilons", epsilons, positive)):
        if not isinstance(values, (list, tuple)) or not values:
            raise ConfigError(f"{name} must be a non-empty list, got {values!r}")
        for v in values:
            check(name, v)
    if not isinstance(methods, (list, tuple)) or not methods:
        raise ConfigError(f"methods must be a non-empty list of algorithm names, got {methods!r}")
    if split not in CLIENT_SPLITS:
        raise ConfigError(f"split must be one of {CLIENT_SPLITS}, got {split!r}")
    if trust not in TRUST_MODES:
        raise ConfigError(f"trust must be one of {TRUST_MODES}, got {trust!r}")


def _jobs(*, dataset, data_dir, clients, epsilons, seeds, methods, budget, out, launcher, split, trust, insecure_seed):
    """One job per run; every config is checked here (nothing is written yet)."""
    from privopt.config import RunConfig

    _check_grid(clients=clients, epsilons=epsilons, seeds=seeds, methods=methods, split=split, trust=trust)
    jobs = []
    for m in sorted(clients, reverse=True):  # the slowest first, for the worker pool
        for eps in epsilons:
            for s in range(seeds):
                for method in methods:
                    cfg = run_config(
                        method, dataset=dataset, data_dir=data_dir, epsilon=eps, seed=s, clients=m, budget=budget,
                        split=split, trust=trust, insecure_seed=None if insecure_seed is None else insecure_seed + s,
                        n_train=budget.n_train,
                    )  # fmt: skip
                    RunConfig.from_dict(cfg)
                    run_dir = out / "runs" / method / f"m{m}" / f"eps{eps:g}" / f"seed{s}"
                    jobs.append({"config": cfg, "out": str(run_dir), "launcher": launcher,
                                 "diag_records": budget.diag_records, "diag_tol": budget.diag_tol})  # fmt: skip
    return jobs


def run_sosp(
    *,
    dataset: str = "mnist",
    data_dir: str | None = None,
    clients=CLIENTS,
    epsilons=EPSILONS,
    seeds: int = 3,
    budget: str | Budget = "quick",
    out_dir: str | Path,
    launcher: str = "simulate",
    methods=METHODS,
    split: str = "label",
    trust: str = "local",
    workers: int = 2,
    insecure_seed: int | None = None,
    log=print,
) -> dict[str, Any]:
    """The reproduction; returns ``{"rows", "summary", "markdown", "out_dir"}``.

    Every argument is checked, and every run's config built, before ``out_dir`` is created; an error
    of a run before any result (e.g. a wrong ``data_dir``) removes what was created and is empty.
    """
    from privopt.experiments.outdir import reproduction_output

    out, plan = _check_args(dataset=dataset, launcher=launcher, out_dir=out_dir, budget=budget, workers=workers)
    grid = dict(clients=clients, epsilons=epsilons, seeds=seeds, methods=methods, split=split, trust=trust)
    jobs = _jobs(dataset=dataset, data_dir=data_dir, budget=plan, out=out, launcher=launcher,
                 insecure_seed=insecure_seed, **grid)  # fmt: skip
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    rows: list[dict[str, Any]] = []
    pool_size = 1 if launcher == "torchrun" else workers
    with reproduction_output(out):
        out.mkdir(parents=True, exist_ok=True)
        with _LoadSampler() as load, (out / "results.jsonl").open("w") as sink:
            for row in _execute(jobs, pool_size):
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                log(_progress_line(row))
    timing = {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _cpu_seconds() - cpu0,
        "load_avg_mean": sum(load.samples) / max(1, len(load.samples)),
        "load_avg_max": max(load.samples, default=0.0),
        "workers": pool_size,
    }
    return _report(rows, out=out, dataset=dataset, plan=plan, timing=timing, launcher=launcher)


def _check_args(*, dataset, launcher, out_dir, budget, workers) -> tuple[Path, Budget]:
    """The output folder and the budget, once the arguments that shape the jobs are valid."""
    from privopt.experiments.outdir import check_output_path
    from privopt.validation import positive_int

    if dataset not in DATASETS:
        raise ConfigError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if launcher not in ("simulate", "torchrun"):
        raise ConfigError(f"launcher must be 'simulate' or 'torchrun', got {launcher!r}")
    if not isinstance(budget, Budget) and budget not in BUDGETS:
        raise ConfigError(f"budget must be one of {sorted(BUDGETS)} or a Budget, got {budget!r}")
    positive_int("workers", workers)
    out = Path(out_dir)
    check_output_path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"output directory {out} is not empty")
    return out, budget if isinstance(budget, Budget) else BUDGETS[budget]


def _execute(jobs: list[dict[str, Any]], workers: int):
    """Rows of the jobs, in order: in this process (one worker) or in a pool of spawned processes."""
    if workers == 1:
        yield from map(run_one, jobs)
        return
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=get_context("spawn"), initializer=hide_foreign_warnings
    ) as pool:
        yield from pool.map(run_one, jobs)


def _progress_line(row: dict[str, Any]) -> str:
    return (
        f"{row['method']:15s} m={row['clients']:<2d} eps={row['epsilon']:<4g} seed={row['seed']} "
        f"acc={row['test_accuracy']:.4f} eps={row['epsilon_guarantee']:.3f} (ex-post {row['epsilon_spent']:.3f}) "
        f"{row['wall_s']:.1f}s"
    )


def _tuning_note(rows, *, dataset: str, plan) -> dict[str, str]:
    """The quick budget's hyper-parameters were tuned on MNIST records kept out of the training sets
    of seeds 0-2 only (``sosp_tuning``); a later seed's training set may hold some of them."""
    from privopt.experiments.sosp_tuning import SEEDS_EXCLUDED

    later = sorted({r["seed"] for r in rows if r["seed"] >= SEEDS_EXCLUDED})
    if dataset != "mnist" or plan.name != "quick" or not later:
        return {}
    return {
        "hyperparameter_tuning": (
            f"the quick budget's values were tuned on MNIST records outside the training sets of seeds "
            f"0-{SEEDS_EXCLUDED - 1} only; the training sets of seeds {later} may hold some of them: that choice "
            "read those runs' private records and is NOT accounted in epsilon_spent"
        )
    }


def _report(rows, *, out: Path, dataset: str, plan, timing: dict, launcher: str) -> dict[str, Any]:
    claims = check_claims(rows)
    table = format_table(rows)
    loss_table = format_table(rows, key="test_loss", scale=1.0, digits=3)
    n = plan.n_train if dataset == "mnist" else f"up to {plan.n_train}"
    not_private = {"not_private": SOSP_TRAINING_MEASUREMENTS, **_tuning_note(rows, dataset=dataset, plan=plan)}
    markdown = (
        f"Test accuracy (%) on {dataset}, n = {n}, MLP-128, δ = 1e-5, budget {plan.name!r} "
        f"({plan.epochs:g} epochs, {plan.sampling} sampling), launcher {launcher}; mean ± std over seeds.\n\n"
        f"{table}\n\n{format_claims(claims)}\n\n"
        f"Wall {timing['wall_s']:.0f} s, CPU {timing['cpu_s']:.0f} s, load average {timing['load_avg_mean']:.1f} "
        f"(max {timing['load_avg_max']:.1f}) on a shared machine.\n\n{notes_markdown(not_private)}\n"
    )
    figures = [str(p) for p in plot_curves(rows, out, dataset=dataset)]
    summary = {"claims": claims, "timing": timing, "budget": plan.name, "figures": figures, "runs": len(rows),
               **not_private}  # fmt: skip
    diagnostics = (
        "\nSecond-order diagnostics of the released models (means over seeds): ‖∇F‖ and λ_min on training records, "
        "NOT private (the note above; λ_min is an upper bound where Lanczos did not converge); 'certified': "
        f"Gauss-PSGD's own certificate, from released values.\n\n{format_diagnostics(rows)}\n"
    )
    (out / "table.md").write_text(markdown + "\nTest loss:\n\n" + loss_table + "\n" + diagnostics)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return {"rows": rows, "summary": summary, "markdown": markdown, "out_dir": str(out)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=DATASETS, default="mnist", help="dataset to train on (default mnist)")
    parser.add_argument("--clients", type=int_list, default=list(CLIENTS), help="comma-separated m (default 1,2,5,10)")
    parser.add_argument("--epsilons", type=float_list, default=list(EPSILONS), help="default 0.5,1,2")
    parser.add_argument("--seeds", type=int, default=3, help="runs per setting (default 3)")
    parser.add_argument(
        "--budget", choices=sorted(BUDGETS), default="quick",
        help="quick: 5 Poisson-sampled epochs (tuned); paper: 20 disjoint passes, printed defaults (default quick)",
    )  # fmt: skip
    parser.add_argument("--methods", help="comma-separated algorithm names (default: " + ",".join(METHODS) + ")")
    parser.add_argument("--split", choices=("label", "iid"), default="label", help="client shards (default label)")
    parser.add_argument("--trust", choices=("local", "central"), default="local", help="noise (default local)")
    parser.add_argument(
        "--launcher", choices=("simulate", "torchrun"), default="simulate",
        help="simulate: all clients of a run in one process; torchrun: one process per client (default simulate)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=positive_int, default=2, help="parallel runs with --launcher simulate (default 2)"
    )
    parser.add_argument("--data-dir", help="folder with one sub-folder per dataset (default $PRIVOPT_DATA)")
    parser.add_argument("--tune", action="store_true", help="run the tuning grid instead (docs/algorithms/sosp.md)")
    add_run_outputs(parser)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``privopt reproduce sosp``."""
    quiet = args.quiet or args.json
    log = (lambda s: None) if quiet else (lambda s: print(s, flush=True))
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else list(METHODS)
    if args.tune:
        from privopt.experiments.sosp_tuning import run_tuning

        res = run_tuning(data_dir=args.data_dir, budget=args.budget, methods=methods, out_dir=args.out,
                         workers=args.workers, log=log)  # fmt: skip
        print(json.dumps(res["best"], indent=None if args.json else 2))
        return 0
    res = run_sosp(
        dataset=args.dataset, data_dir=args.data_dir, clients=args.clients, epsilons=args.epsilons, seeds=args.seeds,
        budget=args.budget, out_dir=args.out, launcher=args.launcher, methods=methods, split=args.split,
        trust=args.trust, workers=args.workers, insecure_seed=args.insecure_seed, log=log,
    )  # fmt: skip
    if args.json:
        print(json.dumps(res["summary"], default=str))
    elif not args.quiet:
        print("\n" + res["markdown"])
        print(f"outputs in {res['out_dir']}")
    return 0
