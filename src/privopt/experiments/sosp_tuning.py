"""``privopt reproduce sosp --tune``: how the ``quick`` budget's hyper-parameters were chosen.

Each method's grid (:func:`~privopt.experiments.sosp_protocol.tuning_grid`, the same size for
every method) runs at ε = 1, m = 1 on 6,000 MNIST training records that belong to none of the
reproduction's training sets (seeds 0-2), and is scored on 2,000 further such records. The
reproduction's records are never read, so the choice costs them no privacy; it is not accounted
for the tuning records themselves (as in the paper, tuning is outside the guarantee).
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from privopt.errors import ConfigError
from privopt.experiments.sosp_protocol import BUDGETS, DELTA, METHODS, N_TRAIN, tuning_grid
from privopt.quiet import hide_foreign_warnings

__all__ = ["tuning_data", "run_tuning"]

TUNE_TRAIN, TUNE_VAL, SEEDS_EXCLUDED = 6000, 2000, 3


def _keys(x) -> list[bytes]:
    return [hashlib.blake2b(r.numpy().tobytes(), digest_size=12).digest() for r in x]


def tuning_data(data_dir: str | None):
    """MNIST training records outside every reproduction training set: (train, validation-as-test)."""
    from privopt.data import Dataset, load_dataset

    used: set[bytes] = set()
    for s in range(SEEDS_EXCLUDED):
        used.update(_keys(load_dataset("mnist", data_dir=data_dir, seed=s, max_train=N_TRAIN).x_train))
    pool = load_dataset("mnist", data_dir=data_dir, seed=0)
    keep = [i for i, k in enumerate(_keys(pool.x_train)) if k not in used][: TUNE_TRAIN + TUNE_VAL]
    x, y = pool.x_train[keep], pool.y_train[keep]
    tr, va = slice(0, TUNE_TRAIN), slice(TUNE_TRAIN, TUNE_TRAIN + TUNE_VAL)
    return Dataset.from_tensors(x[tr], y[tr], x_test=x[va], y_test=y[va], num_classes=10, name="mnist-tuning")


_TUNE: dict[str, Any] = {}


def _score(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from privopt.config import RunConfig
    from privopt.training import train

    torch.set_num_threads(1)
    if "data" not in _TUNE:
        _TUNE["data"] = tuning_data(job["data_dir"])
    params = {**job["params"], "epochs": job["epochs"], "sampling": job["sampling"]}
    cfg = {"algorithm": job["method"], "algorithm_params": params, "model": "mlp", "seed": 0,
           "privacy": {"epsilon": 1.0, "delta": DELTA}, "plots": False}  # fmt: skip
    rec = train(RunConfig.from_dict(cfg), out_dir=job["out"], progress=False, dataset=_TUNE["data"])
    return {"method": job["method"], "params": job["params"], "val_accuracy": rec["metrics"]["test_accuracy"]}


def run_tuning(*, data_dir, budget: str, methods=METHODS, out_dir, workers: int = 2, log=print) -> dict[str, Any]:
    """Run every method's grid; returns ``{"best": {method: params}, "rows": [...]}`` (also in ``tuning.json``)."""
    if budget not in BUDGETS:
        raise ConfigError(f"unknown budget {budget!r}; choose from {', '.join(sorted(BUDGETS))}")
    plan, out = BUDGETS[budget], Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        {"method": m, "params": p, "epochs": plan.epochs, "sampling": plan.sampling, "data_dir": data_dir,
         "out": str(out / "runs" / m / f"point{i}")}
        for m in methods for i, p in enumerate(tuning_grid(m, plan))
    ]  # fmt: skip
    rows = []
    with ProcessPoolExecutor(
        max_workers=max(1, workers), mp_context=get_context("spawn"), initializer=hide_foreign_warnings
    ) as pool:
        for row in pool.map(_score, jobs):
            rows.append(row)
            log(f"{row['method']:15s} {json.dumps(row['params'])} val_acc={row['val_accuracy']:.4f}")
    best = {m: max((r for r in rows if r["method"] == m), key=lambda r: r["val_accuracy"]) for m in methods}
    result = {
        "best": {m: r["params"] for m, r in best.items()},
        "scores": {m: r["val_accuracy"] for m, r in best.items()},
        "rows": rows,
    }
    (out / "tuning.json").write_text(json.dumps(result, indent=2))
    return result
