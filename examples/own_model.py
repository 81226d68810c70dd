"""Train your own model on your own data with the DP DRO methods (Python API, no CLI).

Run:  python examples/own_model.py          (about a minute on 2 CPU cores; no files needed)

Two levels of the API are shown:

1. one private training run: ``privopt.training.train`` with a ``RunConfig`` plus your
   ``nn.Module`` and a ``privopt.data.Dataset`` built from your tensors; the record holds the
   test metrics and the (ε, δ) actually spent; the full-training-set DRO gradient norm and the
   membership-attack AUC beside its DP cap read the training data, so they go to the run's
   ``diagnostics.NOT_PRIVATE.json`` (enabled here with ``non_private_diagnostics``);
2. the Table-3 style comparison of several methods and budgets on the same data and model:
   ``privopt.experiments.dro.run_dro_table3(dataset=your_dataset, model=factory, ...)``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from privopt.config import RunConfig
from privopt.data import Dataset
from privopt.data.public import breast_cancer_scaling
from privopt.data.selection import keep_mask, record_uniforms, stage_index
from privopt.experiments import dro_metrics  # noqa: F401  (registers the "grad_norm" and "mia" run metrics)
from privopt.experiments.dro import BUDGETS, run_dro_table3
from privopt.training import load_diagnostics, train


def my_dataset(seed: int = 0) -> Dataset:
    """An imbalanced two-class problem from scikit-learn's breast-cancer table, as YOUR tensors.

    Preprocessing must not look at the private records (docs/data.md, "Public preprocessing"): the
    features are mapped to [-1, 1] with the table's PUBLISHED ranges (public constants, clipped per
    record), never with the training split's mean/std; and each record's split (test / validation /
    training) is decided by a keyed hash of that record alone, so adding or removing one record
    moves no other record between splits.
    """
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    # Per record, with public constants only: clip into the published ranges, map them to [-1, 1].
    x = 2.0 * breast_cancer_scaling().apply(x, mode="unit") - 1.0
    y = y.astype(np.int64)
    u = record_uniforms(x, y, seed=seed)  # public seed: splits are public choices
    test = keep_mask(u[:, stage_index("test")], 0.2)
    val = ~test & keep_mask(u[:, stage_index("val")], 0.15)
    train = ~test & ~val
    return Dataset.from_numpy(
        x[train],
        y[train],
        x_val=x[val],
        y_val=y[val],
        x_test=x[test],
        y_test=y[test],
        num_classes=2,
        name="my-breast-cancer",
    )


def my_model() -> nn.Module:
    """Any per-sample-gradient friendly module works (no BatchNorm: it mixes samples)."""
    return nn.Sequential(nn.Linear(30, 32), nn.Tanh(), nn.Linear(32, 2))


def main() -> None:
    torch.set_num_threads(1)  # many small runs: one thread is fastest on a busy 2-core machine
    data = my_dataset()
    out = Path(tempfile.mkdtemp(prefix="privopt-own-model-"))

    # 1) One DP Recursive-SPIDER run (KL-DRO, rho = 0.5, lambda0 = 1e-3) at epsilon = 2.
    cfg = RunConfig.from_dict(
        {
            "algorithm": "dp-recursive-spider",
            "algorithm_params": {
                "epochs": 10,
                "lr": 0.5,
                "b1": 256,
                "b2": 64,
                "b3": 256,
                "b4": 64,
                "s_batch": 64,
                "q": 8,
                "clip_v": 1.0,
                "clip_u": 1.0,
                "clip_s": 1.0,
                "output": "last",
            },
            "privacy": {"epsilon": 2.0, "delta": 1.0 / data.n_train**1.1},
            "metrics": ["grad_norm", "mia"],
            "non_private_diagnostics": True,
            "seed": 0,
        }
    )
    record = train(cfg, out_dir=out / "single", progress=False, dataset=data, model=my_model())
    m, p = {**record["metrics"], **load_diagnostics(out / "single")["final"]}, record["privacy"]
    print(
        f"DP Recursive-SPIDER: test accuracy {m['test_accuracy']:.3f}, "
        f"worst-class {m['test_worst_class_accuracy']:.3f}, "
        f"grad norm {m['grad_norm']:.3g}; (eps, delta) spent = ({p['epsilon_spent']:.3f}, {p['delta']:.2e}); "
        f"MIA AUC {m['mia_auc']:.3f} <= cap {m['mia_bound']:.3f} (+{m['mia_slack']:.3f} slack)"
    )

    # 2) The Table-3 comparison on the same data and model: same lr x clip grid for every method,
    #    tuned on YOUR validation split, final runs scored on your test split.
    budget = BUDGETS["quick"].__class__(
        **{
            **BUDGETS["quick"].__dict__,
            "epochs": 10,
            "tune_epochs": 5,
            "refresh": 256,
            "q": 8,
            "lrs": (0.1, 0.5),
            "clips": (1.0,),
            "tune_at": 2.0,
        }
    )
    res = run_dro_table3(
        dataset=data,
        model=my_model,
        epsilons=[2.0],
        seeds=1,
        budget=budget,
        methods=["dp-sgda", "dp-double-spider", "dp-recursive-spider"],
        out_dir=out / "table",
        log=lambda s: None,
    )
    print("\nTest accuracy (%):\n" + res["table"])
    print(f"\noutputs in {out}")


if __name__ == "__main__":
    main()
