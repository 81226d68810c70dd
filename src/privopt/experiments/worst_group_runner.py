"""Runs of the worst-group reproduction: one run through the shared step loop, the tuning search
and the grid of final runs (protocol: :mod:`privopt.experiments.worst_group_protocol`).

Every run is built by :func:`privopt.training.builder.build_run` (validated config, exact noise
calibration, privacy ledger, secret randomness unless ``insecure_seed``) and stepped by
:func:`privopt.training.run_loop`; it writes no run directory, only a result row. A run that
diverges or whose inner solver cannot certify its accuracy is a failed row, never a crash. The runs
are independent: a :class:`~privopt.experiments.jobs.Workers` pool runs several at a time with the
same rows in the same order.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privopt.errors import PrivoptError, public_reason
from privopt.experiments.jobs import Call, DataRef, Workers
from privopt.experiments.privacy_notes import TUNED_ON_TRAINING, VALIDATION_SCORES
from privopt.experiments.worst_group_protocol import (
    DATASETS,
    METHOD_LABELS,
    TUNE_EPSILON,
    evaluation_split,
    grid,
    load_group_dataset,
    method_params,
)

__all__ = ["Spec", "final_runs", "run_one", "tune"]

Log = Callable[[str], None]
_FAILURES = (PrivoptError, ArithmeticError, ValueError, RuntimeError)


@dataclass(frozen=True)
class Spec:
    """What every run of one reproduction shares."""

    dataset: str
    data_dir: Any = None
    insecure_seed: int | None = None
    accountant: str = "rdp"
    tuning_note: str | None = None  # how the final runs' hyper-parameters were chosen (not accounted)

    @property
    def schedule(self):
        return DATASETS[self.dataset][1]

    def noise_seed(self, seed: int) -> int | None:
        return None if self.insecure_seed is None else self.insecure_seed + seed


def _private(method: str) -> bool:
    from privopt.algorithms import available_algorithms

    return available_algorithms()[method].private


def run_one(method: str, spec: Spec, *, data, point: dict, epsilon, seed: int, tuning: bool = False) -> dict:
    """One run; returns its result row (metrics on the validation split when ``tuning``)."""
    from privopt.config import RunConfig
    from privopt.eval.worst_group import evaluate_groups
    from privopt.training import LoopState, run_loop
    from privopt.training.builder import build_run

    private, n = _private(method), int(data.y_train.shape[0])
    params = method_params(method, spec.schedule, point)
    privacy = {"epsilon": epsilon if private else None, "delta": n**-1.1, "accountant": spec.accountant}
    cfg = RunConfig.from_dict(
        {
            "algorithm": method,
            "dataset": data.name,
            "model": "logreg",
            "seed": seed,
            "insecure_seed": spec.noise_seed(seed),
            "algorithm_params": params,
            "privacy": privacy,
        }
    )
    base = {"dataset": spec.dataset, "method": method, "label": METHOD_LABELS.get(method, method), "private": private}
    base.update({"epsilon": epsilon if private else None, "seed": seed, "hyperparameters": params})
    base["hyperparameter_tuning"] = spec.tuning_note
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        run = build_run(cfg, dataset=data)
        run_loop(run.algo.step, LoopState(step=0, total=run.total))
        run.algo.finalize()
        x, y, g = evaluation_split(data, tuning=tuning)
        m = evaluate_groups(run.model, x, y, g, num_groups=data.num_groups, group_names=data.group_names)
    except _FAILURES as e:
        return {**base, **_failed(), "error": public_reason(e), "wall_s": time.perf_counter() - t0}
    spent = run.ledger.epsilon() if run.ledger is not None else None
    return {
        **base,
        "delta": privacy["delta"] if private else None,
        "epsilon_spent": spent,
        "worst_group_accuracy": m["worst_group_accuracy"],
        "average_accuracy": m["average_accuracy"],
        "worst_group_loss": m["worst_group_loss"],
        "average_loss": m["average_loss"],
        "mean_group_accuracy": m["mean_group_accuracy"],
        "worst_group": data.group_names[m["worst_group"]] if data.group_names else m["worst_group"],
        "per_group": m["per_group"],
        "steps": run.total,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def _failed() -> dict:
    nan = math.nan
    keys = ("worst_group_accuracy", "average_accuracy", "worst_group_loss", "average_loss", "mean_group_accuracy")
    return {**dict.fromkeys(keys, nan), "epsilon_spent": None, "per_group": {}, "worst_group": None, "steps": 0}


def _score(row: dict) -> tuple[float, float]:
    w, a = row["worst_group_accuracy"], row["average_accuracy"]
    ok = isinstance(w, float) and math.isfinite(w)
    return (w, a) if ok else (-math.inf, -math.inf)


def _data(spec: Spec, *, seed: int, val_fraction: float = 0.0) -> DataRef:
    """The dataset of one seed as a reference (each worker process loads it itself)."""
    data_dir = None if spec.data_dir is None else str(spec.data_dir)
    kwargs = {"name": spec.dataset, "data_dir": data_dir, "seed": seed, "val_fraction": val_fraction}
    return DataRef(load_group_dataset, kwargs)


def tune(methods: Sequence[str], spec: Spec, *, log: Log, workers: Workers | None = None):
    """Grid search at ``TUNE_EPSILON`` on the validation split; returns (best point per method, report).
    ``workers``: where the trials run (default: this process); the result is the same."""
    data = _data(spec, seed=0, val_fraction=spec.schedule.val_fraction)
    plan = [(m, TUNE_EPSILON if _private(m) else None, k, point) for m in methods for k, point in enumerate(grid(m))]
    calls = [Call((m, spec), dict(point=point, epsilon=eps, seed=0, tuning=True), data) for m, eps, k, point in plan]
    scored, trials, t_all = {}, [], time.perf_counter()
    for (method, eps, k, point), row in zip(plan, (workers or Workers(1)).map(run_one, calls)):
        scored.setdefault(method, []).append((_score(row), k, point))
        trials.append({"method": method, "epsilon": eps, "point": point, **_brief(row)})
        log(
            f"  tune {method:20s} {json.dumps(point):38s} val worst-group acc "
            f"{row['worst_group_accuracy']:.4f} (avg {row['average_accuracy']:.4f}, {row['wall_s']:.1f} s)"
            + (f" FAILED: {row['error']}" if row.get("error") else "")
        )
    best = {method: dict(max(rs, key=lambda r: (r[0], -r[1]))[2]) for method, rs in scored.items()}
    report = {
        "tune_epsilon": TUNE_EPSILON,
        "score": "worst-group accuracy on the validation split (ties: average accuracy)",
        "validation": f"{spec.schedule.val_fraction:g} of the training split, seed 0 (synthetic: an independent draw)",
        "privacy_note": "tuning runs are not accounted in epsilon"
        if spec.dataset == "synthetic"
        else VALIDATION_SCORES,
        "tuned": True,
        # the synthetic generator's validation records are an independent draw: no training record is read
        "selection": None if spec.dataset == "synthetic" else TUNED_ON_TRAINING,
        "points_per_method": {m: len(grid(m)) for m in methods},
        "best": best,
        "trials": trials,
        "wall_s": time.perf_counter() - t_all,
    }
    return best, report


def _brief(row: dict) -> dict:
    keys = ("worst_group_accuracy", "average_accuracy", "worst_group_loss", "wall_s", "error")
    return {k: row.get(k) for k in keys if k in row}


def final_runs(methods, spec: Spec, *, best: dict, epsilons, seeds: int, out: Path, log: Log, workers=None):
    """Every (seed, method, ε) with the tuned points; rows are appended to ``results.jsonl`` as they
    come, in this order whatever ``workers`` (default: this process) runs them."""
    calls = [
        Call((method, spec), dict(point=best[method], epsilon=eps, seed=seed), _data(spec, seed=seed))
        for seed in range(seeds)
        for method in methods
        for eps in (epsilons if _private(method) else [None])
    ]
    rows = []
    for row in (workers or Workers(1)).map(run_one, calls):
        rows.append(row)
        with (out / "results.jsonl").open("a") as f:
            f.write(json.dumps(row, default=float) + "\n")
        log(_line(row))
    return rows


def _line(row: dict) -> str:
    eps = "non-private" if row["epsilon"] is None else f"eps={row['epsilon']:g}"
    if row.get("error"):
        return f"  run  {row['method']:20s} {eps:12s} seed {row['seed']}: FAILED ({row['error']})"
    return (
        f"  run  {row['method']:20s} {eps:12s} seed {row['seed']}: worst-group acc {row['worst_group_accuracy']:.4f} "
        f"({row['worst_group']}), avg acc {row['average_accuracy']:.4f}, worst-group loss "
        f"{row['worst_group_loss']:.3f} ({row['wall_s']:.1f} s)"
    )
