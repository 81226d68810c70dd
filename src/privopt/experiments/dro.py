"""Paper A's experiments (SPEC §2.8): DP DRO methods compared on imbalanced image tasks.

``privopt reproduce dro-table3`` — test accuracy / AUC / F1 / worst-class accuracy, the
full-training-set gradient norm ``‖∇ₓΨ_KL‖`` over training and a membership-inference AUC for
DP-SGDA, PrivateDiff, DP Double-SPIDER and DP Recursive-SPIDER (plus the non-private SCDRO
reference) at ε ∈ {0.5, 1, 5, 10}; writes ``results.jsonl``, ``table3.md`` (mean ± std, laid out
like the paper's Table 3, next to the paper's numbers), ``tuning.json`` and the PNG curves of
Figures 1–3. ``privopt reproduce dro-mia`` does Table 2 (MIA AUC of the two SPIDER methods at
ε ∈ {0.1, 1, 3, 5, 8, 10}, 5 seeds) against the DP cap ``e^ε/(1+e^ε)+δ``.

Protocol (all choices are written into the outputs):

* δ = n^{−1.1} (n = training records); KL-DRO with ρ = 0.5, λ0 = 1e−3 for every method.
* Equal compute: every method gets the same budget in epoch-equivalents (n per-sample gradient
  evaluations each; a SPIDER difference query counts twice) — SPEC §2.8 reproduction plan.
* Tuning: every method gets the SAME grid (learning rate × clip threshold, i.e. the same number of
  trials), run on a validation split carved (stratified) from the training split, scored by
  BALANCED validation accuracy (the -ST test splits are class-balanced, the validation split is
  not). The tuning cost (trials, wall time) is reported; like the paper we do not
  account tuning in ε. The final runs train on the whole training split and report test metrics.
* Every method outputs its last iterate (post-processing; SPEC's random-iterate output is an
  analysis device and only adds variance).
* MIA: loss attack on class-matched members/non-members (see
  :mod:`privopt.experiments.dro_metrics`); a DP run whose AUC exceeds the cap plus 3 standard
  errors is flagged and makes the command fail (a privacy bug, not a result).

Python API: :func:`run_dro_table3` and :func:`run_dro_mia` accept a dataset name or your own
:class:`privopt.data.Dataset`, and a model name or a zero-argument factory returning your own
``nn.Module`` (see ``examples/own_model.py``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

from torch import nn

from privopt.checkpoint import atomic_write_json, atomic_write_text
from privopt.errors import ConfigError, PrivoptError

__all__ = [
    "BUDGETS",
    "DRO_DATASETS",
    "METHOD_LABELS",
    "MIA_METHODS",
    "PAPER_TABLE2",
    "PAPER_TABLE3",
    "TABLE3_METHODS",
    "Budget",
    "add_arguments",
    "format_table",
    "load_dro_dataset",
    "main",
    "method_params",
    "run_dro_mia",
    "run_dro_table3",
]

# ------------------------------------------------------------------------------ constants
TABLE3_METHODS = ("dp-sgda", "private-diff", "dp-double-spider", "dp-recursive-spider")
MIA_METHODS = ("dp-double-spider", "dp-recursive-spider")
NONPRIVATE_METHOD = "scdro"
METHOD_LABELS = {
    "dp-sgda": "DP-SGDA",
    "private-diff": "PrivateDiff",
    "dp-double-spider": "DP Double-SPIDER",
    "dp-recursive-spider": "DP Recursive-SPIDER",
    "dp-sgd-joint": "DP-SGD on (x,η)",
    "scdro": "SCDRO (non-private)",
    "erm": "ERM (non-private)",
    "sgd": "SGD (non-private)",
    "dp-sgd": "DP-SGD",
}
TABLE3_EPSILONS = (0.5, 1.0, 5.0, 10.0)
MIA_EPSILONS = (0.1, 1.0, 3.0, 5.0, 8.0, 10.0)
RHO, LAM0 = 0.5, 1e-3

# The paper's Table 3 (test accuracy, %), SPEC §2.8: dataset -> epsilon -> method -> value.
_T3_ORDER = ("dp-sgda", "private-diff", "dp-double-spider", "dp-recursive-spider")
PAPER_TABLE3: dict[str, dict[float, dict[str, float]]] = {
    ds: {eps: dict(zip(_T3_ORDER, vals)) for eps, vals in rows.items()}
    for ds, rows in {
        "cifar10-st": {
            0.5: (41.80, 43.06, 56.31, 53.81),
            1.0: (45.10, 46.13, 55.67, 55.93),
            5.0: (51.54, 51.29, 55.69, 56.58),
            10.0: (52.47, 51.68, 57.26, 55.67),
        },
        "mnist-st": {
            0.5: (99.16, 99.18, 99.49, 99.66),
            1.0: (99.48, 99.30, 99.50, 99.56),
            5.0: (99.49, 99.47, 99.47, 99.45),
            10.0: (99.55, 99.32, 99.46, 99.45),
        },
        "fashion-mnist": {
            0.5: (88.13, 88.82, 91.39, 92.27),
            1.0: (89.16, 89.51, 91.37, 91.87),
            5.0: (90.45, 90.70, 91.36, 91.59),
            10.0: (90.39, 91.29, 91.38, 91.58),
        },
        "celeba": {
            0.5: (88.16, 88.18, 89.37, 90.37),
            1.0: (89.17, 89.01, 89.37, 90.32),
            5.0: (89.76, 90.14, 89.38, 90.41),
            10.0: (89.93, 90.35, 89.38, 90.45),
        },
    }.items()
}
PAPER_NONPRIVATE = {"cifar10-st": 67.58}
# The paper's Table 2 (MIA AUC on CIFAR10-ST, mean, std over 5 runs).
PAPER_TABLE2 = {
    "dp-double-spider": {
        0.1: (0.9719, 0.0059),
        1.0: (0.9723, 0.0045),
        3.0: (0.9717, 0.0025),
        5.0: (0.9723, 0.0021),
        8.0: (0.9724, 0.0033),
        10.0: (0.9715, 0.0022),
    },
    "dp-recursive-spider": {
        0.1: (0.8234, 0.0127),
        1.0: (0.7932, 0.0072),
        3.0: (0.7958, 0.0240),
        5.0: (0.8014, 0.0383),
        8.0: (0.8001, 0.0302),
        10.0: (0.7825, 0.0149),
    },
}

# CLI dataset name -> (registry name, options). CIFAR10-ST uses the share 100/5000 = 0.02 so it is
# exact on full CIFAR-10 and still meaningful on a subset.
DRO_DATASETS: dict[str, tuple[str, dict[str, Any]]] = {
    "mnist-st": ("mnist-st", {}),
    "fashion-mnist": ("fashion-mnist", {}),
    "cifar10-st": ("cifar10-st", {"minority_count": None, "minority_fraction": 0.02}),
    "celeba": ("celeba", {}),
    "digits-st": ("digits-st", {}),
}


@dataclass(frozen=True)
class Budget:
    """Compute budget of a reproduction (everything that is not the paper's protocol itself).

    Attributes:
        name: label written into the outputs.
        image_model / tabular_model: model names (+ ``model_params``) for image / tabular data.
        epochs: epoch-equivalents per run (equal for every method).
        batch_size: minibatch / correction batch size (paper: 128).
        refresh: SPIDER refresh batch size (SPEC §8.10: 2048; capped at n).
        q: SPIDER phase length.
        lrs, clips: the tuning grid, identical for every method.
        tune_epochs: epoch-equivalents of a tuning trial.
        tune_at: ``"each"`` (tune at every ε) or one ε whose best setting is reused for all.
        val_fraction: share of the training split used for validation while tuning.
        eval_points: evaluations per run (curves).
        max_train: cap on training records (large tabular sets), None = all.
        ds_lam: the penalty λ of the λ-penalised dual (3) shared by DP Double-SPIDER, DP-SGDA,
            PrivateDiff and DP-SGD on (x, η) (SPEC E-A.5; the literal 1e−3 makes the dual weights
            exp((ℓ−η)/λ) degenerate). Default 1: with cross-entropy losses ~0.1–3, λ = 0.1 made
            the weights so peaked that per-sample clipping flattened them; on the mnist-st
            validation split (quick budget, 5 epochs, tuned lr × clip) λ = 1 scored ≥ λ = 0.1 for
            both DP Double-SPIDER (balanced acc. 0.58 vs 0.54 at ε = 10, ≈ 0.50 both at ε = 1) and
            DP-SGDA (0.58 vs 0.56 at ε = 10).
    """

    name: str
    image_model: str
    tabular_model: str
    model_params: dict[str, Any]
    epochs: float
    batch_size: int
    refresh: int
    q: int
    lrs: tuple[float, ...]
    clips: tuple[float, ...]
    tune_epochs: float
    tune_at: str | float
    val_fraction: float
    eval_points: int
    max_train: int | None
    ds_lam: float = 1.0

    def grid(self) -> list[dict[str, float]]:
        return [{"lr": lr, "clip": c} for lr in self.lrs for c in self.clips]


BUDGETS: dict[str, Budget] = {
    # CPU-sized: MLP-64 on flattened images, 10 epoch-equivalents per run, a 3×2 grid tuned at every
    # ε (5 epoch-equivalents per trial) — about 5 min (MNIST-ST) / 10 min (Fashion-MNIST) on 2 cores.
    "quick": Budget(
        name="quick",
        image_model="mlp",
        tabular_model="mlp",
        model_params={"hidden": 64},
        epochs=10,
        batch_size=128,
        refresh=1024,
        q=16,
        lrs=(0.1, 0.5, 2.0),
        clips=(0.1, 1.0),
        tune_epochs=5,
        tune_at="each",
        val_fraction=0.2,
        eval_points=8,
        max_train=20_000,
    ),
    # The paper's setting (ResNet20 with GroupNorm, batch 128), SPEC §8.10 grid, tuned at every ε.
    "paper": Budget(
        name="paper",
        image_model="resnet20",
        tabular_model="mlp",
        model_params={},
        epochs=20,
        batch_size=128,
        refresh=2048,
        q=32,
        lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
        clips=(0.1, 1.0, 10.0),
        tune_epochs=5,
        tune_at="each",
        val_fraction=0.1,
        eval_points=20,
        max_train=None,
    ),
}


# ------------------------------------------------------------------------------------ data
def load_dro_dataset(
    name: str, *, data_dir=None, seed: int = 0, val_fraction: float = 0.0, max_train: int | None = None
):
    """Load one of :data:`DRO_DATASETS` with the reproduction's options.

    Example:
        >>> ds = load_dro_dataset("digits-st", seed=0)
        >>> ds.num_classes
        2
    """
    from privopt.data import load_dataset

    if name not in DRO_DATASETS:
        raise ConfigError(f"unknown DRO dataset {name!r}; choose from {', '.join(DRO_DATASETS)}")
    reg, opts = DRO_DATASETS[name]
    return load_dataset(reg, data_dir=data_dir, seed=seed, val_fraction=val_fraction, max_train=max_train, **opts)


def _delta(n: int) -> float:
    return float(n) ** -1.1  # Paper A: δ = 1/n^1.1


# --------------------------------------------------------------------------------- methods
# Constructor parameters that get the budget's batch sizes (minibatch / correction vs refresh).
_SMALL_BATCH = ("batch_size", "N2", "N4", "b2", "b4", "s_batch")
_REFRESH_BATCH = ("N1", "N3", "b1", "b3", "refresh_batch")
# Methods whose objective is the λ-penalised dual (2)/(3): they share the penalty ``budget.ds_lam``.
_PENALISED = ("dp-double-spider", "dp-sgda", "private-diff", "dp-sgd-joint")
_METHOD_OVERRIDES: dict[str, dict[str, Any]] = {
    "scdro": {"q": 4, "b1": 512, "b3": 512},
}


def method_params(method: str, *, budget: Budget, lr: float, clip: float, epochs: float) -> dict[str, Any]:
    """Hyper-parameters of ``method`` for one run: the budget's schedule plus a grid point.

    The mapping is by constructor-parameter name, so every method gets the same treatment:
    ``lr`` → the x step ``lr`` (dual/η/λ steps keep the method's defaults),
    ``clip`` → every per-sample clip threshold (``clip``, ``clip_x``, ``clip_v`` ...) and the cap of
    every step-proportional difference threshold (``clip_x_diff`` ...; γ keeps its default),
    batch sizes (incl. Recursive-SPIDER's ``s_batch``; paper: 1) → ``budget.batch_size`` /
    ``budget.refresh``, ``q`` → ``budget.q``, ``epochs`` → ``epochs``, ``output`` → ``"last"``, and
    the KL-DRO constants ρ, λ0 where the method has them.

    Example:
        >>> p = method_params("sgd", budget=BUDGETS["quick"], lr=0.1, clip=1.0, epochs=2)
        >>> p["lr"], p["batch_size"], p["epochs"]
        (0.1, 128, 2)
    """
    from privopt.algorithms import available_algorithms

    algos = available_algorithms()
    if method not in algos:
        raise ConfigError(f"unknown method {method!r}; registered algorithms: {', '.join(algos)}")
    sig = inspect.signature(algos[method].__init__).parameters
    out: dict[str, Any] = {}
    for name, p in sig.items():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if name == "lr":
            out[name] = lr
        elif name.startswith("clip") and isinstance(p.default, (int, float)):
            out[name] = clip
        elif name.startswith("clip") and name.endswith("_diff"):
            # Cap of the step-proportional difference threshold: without a cap, C_t = γ‖Δw‖ and the
            # noise grow with the step, which feeds back into larger steps (observed divergence).
            out[name] = clip
        elif name in _SMALL_BATCH:
            out[name] = budget.batch_size
        elif name in _REFRESH_BATCH:
            out[name] = budget.refresh
        elif name == "q":
            out[name] = budget.q
        elif name == "epochs":
            out[name] = epochs
        elif name == "output":
            out[name] = "last"
        elif name == "rho":
            out[name] = RHO
        elif name == "lam0":
            out[name] = LAM0
    if method in _PENALISED and "lam" in sig:
        out["lam"] = budget.ds_lam
    # Per-method schedule overrides (documented deviations): SCDRO needs short SPIDER phases with
    # moderate refresh batches (its own defaults, see :class:`privopt.algorithms.SCDRO`).
    for name, value in _METHOD_OVERRIDES.get(method, {}).items():
        if name in sig:
            out[name] = value
    return out


# ------------------------------------------------------------------------------ one run
ModelSpec = Union[str, Callable[[], nn.Module]]


def _model_for(model: ModelSpec | None, budget: Budget, data) -> tuple[str, nn.Module | None, dict]:
    """(config model name, module to pass to train() or None, model params)."""
    if callable(model):
        m = model()
        if not isinstance(m, nn.Module):
            raise ConfigError(f"the model factory must return an nn.Module, got {type(m).__name__}")
        return "custom", m, {}
    if model is not None:
        return str(model), None, {}
    image = len(data.input_shape) == 3
    name = budget.image_model if image else budget.tabular_model
    return name, None, (dict(budget.model_params) if name in ("mlp",) else {})


def _planned_steps(method: str, params: dict, n: int) -> int | None:
    """Iterations the method will run on n records (so every method gets ``eval_points`` curve points)."""
    from privopt.algorithms import get_algorithm

    try:
        return int(get_algorithm(method, **params).steps_for(n=n))
    except NotImplementedError:
        return None


def _run(
    method: str,
    *,
    data,
    dataset_label: str,
    budget: Budget,
    model: ModelSpec | None,
    hp: dict,
    epochs: float,
    epsilon: float | None,
    seed: int,
    out_dir: Path,
    eval_split: str,
    metrics: list[str],
    progress: bool,
) -> dict[str, Any]:
    """One training run through the shared loop; returns a flat result row (+ ``history``)."""
    from privopt.algorithms import available_algorithms
    from privopt.config import RunConfig
    from privopt.training import train

    private = available_algorithms()[method].private
    n = int(data.x_train.shape[0])
    delta = _delta(n)
    model_name, module, model_params = _model_for(model, budget, data)
    params = method_params(method, budget=budget, lr=hp["lr"], clip=hp["clip"], epochs=epochs)
    total = _planned_steps(method, params, n) or max(1, math.ceil(epochs * n / budget.batch_size))
    cfg = RunConfig.from_dict(
        {
            "algorithm": method,
            "dataset": data.name,
            "model": model_name if module is None else "mlp",
            "model_params": model_params,
            "seed": seed,
            "eval_split": eval_split,
            "metrics": metrics,
            "algorithm_params": params,
            "privacy": {"epsilon": epsilon if private else None, "delta": delta},
            "eval_every": max(1, total // budget.eval_points),
            "checkpoint_every": 10**9,
            # gradient norms, MIA and validation scores read the training data: non-private diagnostics
            "non_private_diagnostics": bool(metrics) or eval_split == "val",
        }
    )
    t0 = time.perf_counter()
    rec = train(cfg, out_dir=out_dir, progress=progress, dataset=data, model=module)
    wall = time.perf_counter() - t0
    rec = _with_diagnostics(rec, out_dir) if cfg.non_private_diagnostics else rec
    m, p = rec["metrics"], rec["privacy"]
    pre = eval_split
    row = {
        "dataset": dataset_label,
        "method": method,
        "label": METHOD_LABELS.get(method, method),
        "private": private,
        "epsilon": epsilon if private else None,
        "delta": p["delta"] if private else None,
        "epsilon_spent": p["epsilon_spent"],
        "seed": seed,
        "n_train": n,
        "model": model_name,
        "lr": hp["lr"],
        "clip": hp["clip"],
        "epochs": epochs,
        "steps": rec["steps_done"],
        f"{pre}_accuracy": m.get(f"{pre}_accuracy"),
        f"{pre}_auc": m.get(f"{pre}_roc_auc"),
        f"{pre}_f1": m.get(f"{pre}_f1"),
        f"{pre}_worst_class_accuracy": m.get(f"{pre}_worst_class_accuracy"),
        f"{pre}_balanced_accuracy": m.get(f"{pre}_balanced_accuracy"),
        "grad_norm": m.get("grad_norm"),
        "dro_lam_star": m.get("dro_lam_star"),
        "mia_auc": m.get("mia_auc"),
        "mia_bound": m.get("mia_bound"),
        "mia_slack": m.get("mia_slack"),
        "mia_within_bound": None if m.get("mia_within_bound") is None else bool(m["mia_within_bound"]),
        "wall_s": wall,
        "run_dir": str(out_dir),
    }
    if pre == "val":
        row["val_score"] = row["val_balanced_accuracy"]
    row["history"] = [
        {k: h.get(k) for k in ("step", "grad_norm", f"{pre}_accuracy", f"{pre}_roc_auc", f"{pre}_f1")}
        for h in rec["history"]
    ]
    return row


def _with_diagnostics(rec: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The record with the run's non-private diagnostics merged in (for the experiment's tables only)."""
    from privopt.training import load_diagnostics

    diag = load_diagnostics(out_dir)
    by_step = {h["step"]: h for h in diag["history"]}
    history = [{**h, **by_step.get(h["step"], {})} for h in rec["history"]]
    return {**rec, "metrics": {**rec["metrics"], **diag["final"]}, "history": history}


def _failed_row(
    method: str, *, label: str, private: bool, eps, seed: int, hp: dict, error: str, run_dir: Path
) -> dict[str, Any]:
    nan = math.nan
    return {
        "dataset": label,
        "method": method,
        "label": METHOD_LABELS.get(method, method),
        "private": private,
        "epsilon": eps,
        "delta": None,
        "epsilon_spent": None,
        "seed": seed,
        "lr": hp["lr"],
        "clip": hp["clip"],
        "test_accuracy": nan,
        "test_auc": nan,
        "test_f1": nan,
        "test_worst_class_accuracy": nan,
        "grad_norm": nan,
        "mia_auc": None,
        "mia_bound": None,
        "mia_slack": None,
        "mia_within_bound": None,
        "wall_s": nan,
        "steps": 0,
        "run_dir": str(run_dir),
        "error": error,
        "history": [],
    }


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if _finite(x) else "nan"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ------------------------------------------------------------------------------- tuning
def _tune(
    methods: Sequence[str],
    *,
    dataset: Any,
    dataset_label: str,
    data_dir,
    budget: Budget,
    model: ModelSpec | None,
    epsilons: Sequence[float],
    out: Path,
    log: Callable[[str], None],
    progress: bool,
) -> tuple[dict[tuple[str, float | None], dict], dict[str, Any]]:
    """Grid search on the validation split; returns best (lr, clip) per (method, ε) and a report."""
    from privopt.algorithms import available_algorithms

    if isinstance(dataset, str):
        data = load_dro_dataset(
            dataset, data_dir=data_dir, seed=0, val_fraction=budget.val_fraction, max_train=budget.max_train
        )
    else:
        data = dataset
        if data.x_val is None or data.x_val.shape[0] == 0:
            raise ConfigError(
                "tuning needs a validation split: pass a Dataset with x_val/y_val "
                "(e.g. load_dataset(..., val_fraction=0.2)) or tune=False with explicit hyper-parameters"
            )
    grid = budget.grid()
    best: dict[tuple[str, float | None], dict] = {}
    trials: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    per_method_s: dict[str, float] = {}
    for method in methods:
        private = available_algorithms()[method].private
        tune_eps: list[float | None]
        if not private:
            tune_eps = [None]
        elif budget.tune_at == "each":
            tune_eps = list(epsilons)
        else:
            tune_eps = [float(budget.tune_at)]
        t_m = time.perf_counter()
        for eps in tune_eps:
            results = []
            for k, hp in enumerate(grid):
                # Non-private methods have no clip: their grid collapses to the learning rates.
                if not private and hp["clip"] != budget.clips[0]:
                    continue
                run_dir = out / "runs" / "tune" / method / f"eps{eps}" / f"trial{k}"
                try:
                    row = _run(
                        method,
                        data=data,
                        dataset_label=dataset_label,
                        budget=budget,
                        model=model,
                        hp=hp,
                        epochs=budget.tune_epochs,
                        epsilon=eps,
                        seed=0,
                        out_dir=run_dir,
                        eval_split="val",
                        metrics=[],
                        progress=progress,
                    )
                    score = row["val_score"] if _finite(row["val_score"]) else -math.inf
                    wall = row["wall_s"]
                except (PrivoptError, ArithmeticError, RuntimeError, ValueError) as e:  # a diverging trial loses
                    score, wall = -math.inf, float("nan")
                    log(f"    trial failed: {e}")
                results.append((score, k, hp))
                trials.append(
                    {"method": method, "epsilon": eps, "trial": k, **hp, "val_balanced_accuracy": score, "wall_s": wall}
                )
                log(
                    f"  tune {method:20s} eps={eps!s:5s} lr={hp['lr']:<6g} clip={hp['clip']:<5g} "
                    f"val balanced acc {score:.4f} ({wall:.1f} s)"
                )
            score, k, hp = max(results, key=lambda r: (r[0], -r[1]))
            best[(method, eps)] = dict(hp)
        per_method_s[method] = time.perf_counter() - t_m
    report = {
        "grid": {"lr": list(budget.lrs), "clip": list(budget.clips)},
        "trials_per_method_and_tuned_epsilon": len(grid),
        "tune_at": budget.tune_at,
        "tune_epochs": budget.tune_epochs,
        "validation": f"{budget.val_fraction:g} of the training split (stratified, seed 0); score = balanced "
        "validation accuracy (the -ST test splits are class-balanced while the validation split "
        "keeps the training imbalance, so plain accuracy would reward majority-class predictors)",
        "n_trials": len(trials),
        "wall_s": time.perf_counter() - t_all,
        "wall_s_per_method": per_method_s,
        "privacy_note": "tuning runs are not accounted in epsilon (as in the paper)",
        "best": [{"method": m, "epsilon": e, **hp} for (m, e), hp in best.items()],
        "trials": trials,
    }
    return best, report


def _best_for(best: dict, method: str, eps: float | None, budget: Budget) -> dict:
    if (method, eps) in best:
        return best[(method, eps)]
    for (m, _e), hp in best.items():
        if m == method:
            return hp
    return {"lr": budget.lrs[len(budget.lrs) // 2], "clip": budget.clips[-1]}


# -------------------------------------------------------------------------- experiment
def _run_grid(
    *,
    kind: str,
    dataset: Any,
    data_dir,
    methods: Sequence[str],
    epsilons: Sequence[float],
    seeds: int,
    budget: str | Budget,
    model: ModelSpec | None,
    out_dir,
    progress: bool,
    nonprivate: bool,
    tune: bool,
    hyperparameters: dict | None,
    metrics: list[str],
    log: Callable[[str], None] | None,
) -> tuple[list[dict], dict[str, Any], Path]:
    import privopt.experiments.dro_metrics  # noqa: F401  (registers grad_norm / mia)
    from privopt.algorithms import available_algorithms

    b = BUDGETS[budget] if isinstance(budget, str) else budget
    if isinstance(budget, str) and budget not in BUDGETS:
        raise ConfigError(f"unknown budget {budget!r}; choose from {', '.join(BUDGETS)}")
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ConfigError(f"seeds must be a positive integer, got {seeds!r}")
    eps_list = [float(e) for e in epsilons]
    if not eps_list or any(not (math.isfinite(e) and e > 0) for e in eps_list):
        raise ConfigError(f"epsilons must be finite numbers > 0, got {list(epsilons)!r}")
    algos = available_algorithms()
    methods = list(methods) + ([NONPRIVATE_METHOD] if nonprivate and NONPRIVATE_METHOD not in methods else [])
    missing = [m for m in methods if m not in algos]
    if missing:
        raise ConfigError(f"method(s) {missing} are not registered algorithms; available: {', '.join(algos)}")
    out = Path(out_dir)
    if (out / "results.jsonl").exists():
        raise ConfigError(f"{out} already holds a results.jsonl; choose a new --out directory")
    out.mkdir(parents=True, exist_ok=True)
    say = log or (lambda s: print(s, flush=True))
    label = dataset if isinstance(dataset, str) else getattr(dataset, "name", "custom")
    t_start = time.perf_counter()

    if hyperparameters is not None:
        best = {(m, None): dict(hp) for m, hp in hyperparameters.items()}
        tuning = {"tuned": False, "hyperparameters": hyperparameters}
    elif tune:
        say(f"tuning {len(methods)} method(s) on a validation split ({len(b.grid())} grid points each)")
        best, tuning = _tune(
            methods,
            dataset=dataset,
            dataset_label=label,
            data_dir=data_dir,
            budget=b,
            model=model,
            epsilons=eps_list,
            out=out,
            log=say,
            progress=progress,
        )
        tuning["tuned"] = True
    else:
        best, tuning = {}, {"tuned": False, "hyperparameters": "budget defaults"}
    atomic_write_json(out / "tuning.json", tuning)

    rows: list[dict[str, Any]] = []
    results_path = out / "results.jsonl"
    for seed in range(seeds):
        if isinstance(dataset, str):
            data = load_dro_dataset(dataset, data_dir=data_dir, seed=seed, max_train=b.max_train)
        else:
            data = dataset
        for method in methods:
            private = algos[method].private
            for eps in eps_list if private else [None]:
                hp = _best_for(
                    best,
                    method,
                    eps
                    if b.tune_at == "each"
                    else (None if not private else (float(b.tune_at) if isinstance(b.tune_at, (int, float)) else eps)),
                    b,
                )
                run_dir = out / "runs" / "final" / method / f"eps{eps}" / f"seed{seed}"
                try:
                    row = _run(
                        method,
                        data=data,
                        dataset_label=label,
                        budget=b,
                        model=model,
                        hp=hp,
                        epochs=b.epochs,
                        epsilon=eps,
                        seed=seed,
                        out_dir=run_dir,
                        eval_split="test",
                        metrics=metrics,
                        progress=progress,
                    )
                except (ArithmeticError, ValueError) as e:
                    # A diverging optimiser is a result (reported as failed), not a crash of the table.
                    row = _failed_row(
                        method,
                        label=label,
                        private=private,
                        eps=eps,
                        seed=seed,
                        hp=hp,
                        error=f"{type(e).__name__}: {e}",
                        run_dir=run_dir,
                    )
                rows.append(row)
                flat = {k: v for k, v in row.items() if k != "history"}
                with results_path.open("a") as f:
                    f.write(json.dumps(flat) + "\n")
                mia = (
                    ""
                    if row["mia_auc"] is None
                    else f", MIA AUC {row['mia_auc']:.3f}"
                    + ("" if row["mia_bound"] is None else f" (cap {row['mia_bound']:.3f})")
                )
                if row.get("error"):
                    say(f"  {kind} {method:20s} eps={eps} seed {seed}: FAILED ({row['error']})")
                    continue
                eps_txt = "non-private" if eps is None else f"eps={eps:g} (spent {row['epsilon_spent']:.3f})"
                say(
                    f"  {kind} {method:20s} {eps_txt:28s} seed {seed}: test acc {row['test_accuracy']:.4f}, "
                    f"grad norm {_fmt(row['grad_norm'])}{mia} ({row['wall_s']:.1f} s)"
                )
    meta = {
        "kind": kind,
        "dataset": label,
        "budget": asdict(b),
        "methods": methods,
        "epsilons": eps_list,
        "seeds": seeds,
        "rho": RHO,
        "lam0": LAM0,
        "delta_rule": "n^-1.1",
        "tuning_wall_s": tuning.get("wall_s", 0.0),
        "total_wall_s": time.perf_counter() - t_start,
    }
    return rows, meta, out


def _single_threaded(fn: Callable) -> Callable:
    """Run ``fn`` with one torch intra-op thread (restored afterwards).

    Why: these runs are many small, sequential jobs. With 2 intra-op threads on a 2-core machine
    that is also busy with anything else, every small kernel waits for both threads to be
    scheduled; a per-sample-gradient call of the quick MLP measured 0.5 s with 2 threads vs 5 ms
    with 1 thread under load (100×). One thread is never much slower for models this size.
    """
    import torch

    def wrapped(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapped


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    vals = [v for v in values if _finite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _cell(values: Sequence[float], scale: float = 1.0, digits: int = 2, failed: int = 0) -> str:
    m, s = _mean_std(values)
    note = f" ({failed}/{len(values)} failed)" if failed else ""
    if math.isnan(m):
        return "failed" + note if failed else "–"
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}{note}"


def _cell_of(rows: Sequence[dict], metric: str, scale: float, digits: int) -> str:
    """Mean ± std of ``metric`` over ``rows``; runs that diverged (``error``) are counted, not averaged."""
    return _cell([r.get(metric) for r in rows], scale, digits, failed=sum(1 for r in rows if r.get("error")))


def format_table(
    rows: Sequence[dict],
    *,
    metric: str = "test_accuracy",
    scale: float = 100.0,
    digits: int = 2,
    methods: Sequence[str] | None = None,
    epsilons: Sequence[float] | None = None,
) -> str:
    """Markdown table laid out like Table 3: one row per setting (non-private, then each ε), one
    column per method, cells ``mean ± std`` over seeds of ``metric`` (× ``scale``); runs that
    diverged are excluded from the mean and counted as ``(k/N failed)``.

    Example:
        >>> rows = [{"method": "dp-sgda", "epsilon": 1.0, "private": True, "test_accuracy": a} for a in (0.9, 0.92)]
        >>> print(format_table(rows).splitlines()[2])
        | ε = 1 | 91.00 ± 1.41 |
    """
    methods = list(methods or dict.fromkeys(r["method"] for r in rows if r["private"]))
    eps_list = list(epsilons or sorted({r["epsilon"] for r in rows if r["private"]}))
    head = "| setting | " + " | ".join(METHOD_LABELS.get(m, m) for m in methods) + " |"
    lines = [head, "|---" * (len(methods) + 1) + "|"]
    nonpriv = [r for r in rows if not r["private"]]
    if nonpriv:
        # As in the paper, the non-private reference (SCDRO = Recursive-SPIDER without noise) sits in
        # the Recursive-SPIDER column (or the last column when that method is not shown).
        names = ", ".join(sorted({r["method"].upper() for r in nonpriv}))
        cell = _cell_of(nonpriv, metric, scale, digits)
        col = methods.index("dp-recursive-spider") if "dp-recursive-spider" in methods else len(methods) - 1
        lines.append(
            f"| non-private ({names}) | " + " | ".join(cell if i == col else "–" for i in range(len(methods))) + " |"
        )
    for eps in eps_list:
        cells = [
            _cell_of([r for r in rows if r["method"] == m and r["epsilon"] == eps], metric, scale, digits)
            for m in methods
        ]
        lines.append(f"| ε = {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paper_table3(dataset: str, methods: Sequence[str], epsilons: Sequence[float]) -> str | None:
    paper = PAPER_TABLE3.get(dataset)
    if paper is None:
        return None
    cols = [m for m in methods if m in _T3_ORDER]
    lines = ["| setting | " + " | ".join(METHOD_LABELS[m] for m in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    if dataset in PAPER_NONPRIVATE:
        lines.append("| non-private (SCDRO) | " + " | ".join(f"{PAPER_NONPRIVATE[dataset]:.2f}" for _ in cols) + " |")
    for eps in epsilons:
        if eps in paper:
            lines.append(f"| ε = {eps:g} | " + " | ".join(f"{paper[eps][m]:.2f}" for m in cols) + " |")
    return "\n".join(lines)


def _ranking(rows: Sequence[dict], methods: Sequence[str], eps: float) -> list[str]:
    means = {
        m: _mean_std([r["test_accuracy"] for r in rows if r["method"] == m and r["epsilon"] == eps])[0] for m in methods
    }
    return sorted((m for m in methods if not math.isnan(means[m])), key=lambda m: -means[m])


def _ordering_notes(dataset: str, rows: Sequence[dict], methods: Sequence[str], epsilons: Sequence[float]) -> str:
    """Plain statement, per ε, of whether the measured best method / ordering matches the paper's."""
    paper = PAPER_TABLE3.get(dataset)
    if paper is None:
        return ""
    cols = [m for m in methods if m in _T3_ORDER]
    out = []
    for eps in epsilons:
        if eps not in paper:
            continue
        ours = _ranking(rows, cols, eps)
        theirs = sorted(cols, key=lambda m: -paper[eps][m])
        if not ours:
            continue
        same_best = ours[0] == theirs[0]
        proposed = {"dp-double-spider", "dp-recursive-spider"}
        ours_prop = ours[0] in proposed
        theirs_prop = theirs[0] in proposed
        out.append(
            f"- ε = {eps:g}: measured order {' > '.join(METHOD_LABELS[m] for m in ours)}; paper "
            f"{' > '.join(METHOD_LABELS[m] for m in theirs)}. Best method "
            f"{'agrees' if same_best else 'differs'}; a proposed SPIDER method is best: "
            f"measured {'yes' if ours_prop else 'no'}, paper {'yes' if theirs_prop else 'no'}."
        )
    return "\n".join(out)


def _curves(
    rows: Sequence[dict], key: str, methods: Sequence[str], eps: float | None, include_nonprivate: bool
) -> dict[str, tuple[list[float], list[float]]]:
    """Mean (over seeds) curve of ``key`` per method, x = fraction of the run completed."""
    series = {}
    for m in methods:
        rs = [
            r
            for r in rows
            if r["method"] == m and r["history"] and (r["epsilon"] == eps or (not r["private"] and include_nonprivate))
        ]
        if not rs:
            continue
        length = min(len(r["history"]) for r in rs)
        if length == 0:
            continue
        steps = [h["step"] for h in rs[0]["history"][:length]]
        total = max(rs[0]["steps"], 1)
        ys = []
        for i in range(length):
            vals = [r["history"][i].get(key) for r in rs]
            ys.append(_mean_std(vals)[0])
        series[METHOD_LABELS.get(m, m)] = ([s / total for s in steps], ys)
    return series


def _write_figures(
    out: Path, rows: Sequence[dict], methods: Sequence[str], epsilons: Sequence[float], dataset: str
) -> list[str]:
    from privopt.plots import plot_series

    written = []
    all_methods = list(dict.fromkeys(list(methods) + [r["method"] for r in rows if not r["private"]]))
    for fig, key, ylabel, logy in (
        ("fig1_gradnorm", "grad_norm", "‖∇ₓΨ_KL‖ (full training set)", True),
        ("fig2_auc", "test_roc_auc", "test ROC AUC", False),
        ("fig3_f1", "test_f1", "test F1", False),
    ):
        for eps in epsilons:
            series = _curves(rows, key, all_methods, eps, include_nonprivate=True)
            if not series:
                continue
            if logy and any(v is not None and _finite(v) and v <= 0 for _, ys in series.values() for v in ys):
                logy = False
            path = out / f"{fig}_eps{eps:g}.png"
            plot_series(
                path, series, xlabel="fraction of training", ylabel=ylabel, logy=logy, title=f"{dataset}, ε = {eps:g}"
            )
            written.append(path.name)
    return written


def _mia_check(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r["private"] and r.get("mia_within_bound") is False]


def _summary_table(rows: Sequence[dict], methods: Sequence[str], epsilons: Sequence[float]) -> str:
    parts = []
    for title, metric, scale, digits in (
        ("Test ROC AUC", "test_auc", 1.0, 4),
        ("Test F1", "test_f1", 1.0, 4),
        ("Worst-class test accuracy (%)", "test_worst_class_accuracy", 100.0, 2),
        ("Final ‖∇ₓΨ_KL‖ on the training set", "grad_norm", 1.0, 4),
        ("MIA AUC (loss attack, class-matched)", "mia_auc", 1.0, 4),
        ("ε spent (ledger)", "epsilon_spent", 1.0, 3),
    ):
        parts.append(
            f"### {title}\n\n"
            + format_table(rows, metric=metric, scale=scale, digits=digits, methods=methods, epsilons=epsilons)
        )
    return "\n\n".join(parts)


def run_dro_table3(
    *,
    dataset: Any,
    data_dir=None,
    epsilons: Sequence[float] = TABLE3_EPSILONS,
    seeds: int = 3,
    budget: str | Budget = "quick",
    methods: Sequence[str] = TABLE3_METHODS,
    model: ModelSpec | None = None,
    out_dir,
    progress: bool = False,
    nonprivate: bool = True,
    tune: bool = True,
    hyperparameters: dict[str, dict] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Reproduce Paper A's Table 3 / Figures 1–3 on one dataset and write every output.

    Args:
        dataset: a name of :data:`DRO_DATASETS` or your own :class:`privopt.data.Dataset` (with a
            validation split if ``tune``).
        data_dir: folder with the dataset files (names only; default ``$PRIVOPT_DATA``).
        epsilons: privacy budgets (δ = n^{−1.1}).
        seeds: independent runs per (method, ε).
        budget: ``"quick"``, ``"paper"`` or a :class:`Budget`.
        methods: private methods (registered algorithm names); the non-private SCDRO reference is
            added when ``nonprivate``.
        model: None (the budget's model), a registered model name, or a zero-argument callable
            returning a fresh ``nn.Module`` (your own model).
        out_dir: output folder (``results.jsonl``, ``table3.md``, ``summary.json``, ``tuning.json``,
            ``fig1_gradnorm_eps*.png``, ``fig2_auc_eps*.png``, ``fig3_f1_eps*.png``, ``runs/``).
        progress: per-run progress bars.
        tune: grid-search (lr, clip) per method on a validation split (same grid for every method).
        hyperparameters: skip tuning and use ``{method: {"lr": .., "clip": ..}}``.
        log: line printer (default ``print``).

    Returns:
        ``{"rows": [...], "table": markdown, "summary": {...}, "out_dir": path, "mia_violations": [...]}``.

    Example:
        >>> import tempfile
        >>> from privopt.experiments.dro import Budget, BUDGETS, run_dro_table3
        >>> tiny = Budget(**{**BUDGETS["quick"].__dict__, "epochs": 0.5, "eval_points": 2})
        >>> res = run_dro_table3(dataset="digits-st", epsilons=[1.0], seeds=1, budget=tiny,
        ...     methods=["dp-sgd"], tune=False, out_dir=tempfile.mkdtemp(), log=lambda s: None,
        ...     hyperparameters={"dp-sgd": {"lr": 0.5, "clip": 1.0}, "scdro": {"lr": 0.2, "clip": 1.0}})
        >>> sorted(r["method"] for r in res["rows"])
        ['dp-sgd', 'scdro']
    """
    rows, meta, out = _single_threaded(_run_grid)(
        kind="table3",
        dataset=dataset,
        data_dir=data_dir,
        methods=methods,
        epsilons=epsilons,
        seeds=seeds,
        budget=budget,
        model=model,
        out_dir=out_dir,
        progress=progress,
        nonprivate=nonprivate,
        tune=tune,
        hyperparameters=hyperparameters,
        metrics=["grad_norm", "mia"],
        log=log,
    )
    label, eps_list = meta["dataset"], meta["epsilons"]
    private_methods = [m for m in meta["methods"] if m != NONPRIVATE_METHOD]
    table = format_table(rows, metric="test_accuracy", methods=private_methods, epsilons=eps_list)
    figs = _write_figures(out, rows, private_methods, eps_list, label)
    violations = _mia_check(rows)
    md = [
        f"# Paper A Table 3 reproduction — {label} (budget {meta['budget']['name']})",
        "",
        (
            f"Test accuracy (%), mean ± std over {meta['seeds']} seed(s); δ = n^-1.1; KL-DRO ρ = {RHO}, λ0 = {LAM0}; "
            f"{meta['budget']['epochs']} epoch-equivalents per run for every method."
        ),
        "",
        "## Measured",
        "",
        table,
    ]
    paper = _paper_table3(label, private_methods, eps_list)
    if paper:
        md += [
            "",
            "## Paper (Table 3)",
            "",
            paper,
            "",
            "## Ordering",
            "",
            _ordering_notes(label, rows, private_methods, eps_list),
        ]
    md += [
        "",
        "## Other metrics",
        "",
        _summary_table(rows, private_methods, eps_list),
        "",
        "## Tuning",
        "",
        (
            f"grid lr × clip = {list(meta['budget']['lrs'])} × {list(meta['budget']['clips'])} "
            f"(same for every method; see tuning.json); tuning wall time "
            f"{meta['tuning_wall_s']:.0f} s; total wall time {meta['total_wall_s']:.0f} s."
        ),
    ]
    if violations:
        md += [
            "",
            "## PRIVACY CHECK FAILED",
            "",
            f"{len(violations)} DP run(s) have a membership-attack AUC above the DP cap + 3 SE: "
            + "; ".join(
                f"{r['method']} ε={r['epsilon']} seed {r['seed']} AUC {r['mia_auc']:.3f} > "
                f"{r['mia_bound']:.3f}+{r['mia_slack']:.3f}"
                for r in violations
            ),
        ]
    text = "\n".join(md) + "\n"
    atomic_write_text(out / "table3.md", text)
    summary = {**meta, "figures": figs, "mia_violations": len(violations), "table_markdown": table}
    atomic_write_json(out / "summary.json", summary)
    return {
        "rows": rows,
        "table": table,
        "markdown": text,
        "summary": summary,
        "out_dir": str(out),
        "mia_violations": violations,
    }


def run_dro_mia(
    *,
    dataset: Any = "cifar10-st",
    data_dir=None,
    epsilons: Sequence[float] = MIA_EPSILONS,
    seeds: int = 5,
    budget: str | Budget = "quick",
    methods: Sequence[str] = MIA_METHODS,
    model: ModelSpec | None = None,
    out_dir,
    progress: bool = False,
    tune: bool = True,
    hyperparameters: dict[str, dict] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Reproduce Paper A's Table 2: membership-attack AUC per method and ε, next to the DP cap
    and the paper's numbers (which exceed the cap, SPEC E-A.20). Outputs ``results.jsonl``,
    ``table2.md``, ``summary.json``, ``tuning.json``. Arguments as :func:`run_dro_table3`."""
    from privopt.eval.mia import dp_auc_bound

    rows, meta, out = _single_threaded(_run_grid)(
        kind="mia",
        dataset=dataset,
        data_dir=data_dir,
        methods=methods,
        epsilons=epsilons,
        seeds=seeds,
        budget=budget,
        model=model,
        out_dir=out_dir,
        progress=progress,
        nonprivate=False,
        tune=tune,
        hyperparameters=hyperparameters,
        metrics=["mia"],
        log=log,
    )
    eps_list = meta["epsilons"]
    head = "| algorithm | " + " | ".join(f"ε = {e:g}" for e in eps_list) + " |"
    lines = [head, "|---" * (len(eps_list) + 1) + "|"]
    for m in meta["methods"]:
        cells = [
            _cell([r["mia_auc"] for r in rows if r["method"] == m and r["epsilon"] == e], 1.0, 4) for e in eps_list
        ]
        lines.append(f"| {METHOD_LABELS.get(m, m)} (measured) | " + " | ".join(cells) + " |")
        if m in PAPER_TABLE2:
            pc = [
                (f"{PAPER_TABLE2[m][e][0]:.4f} ± {PAPER_TABLE2[m][e][1]:.4f}" if e in PAPER_TABLE2[m] else "–")
                for e in eps_list
            ]
            lines.append(f"| {METHOD_LABELS.get(m, m)} (paper) | " + " | ".join(pc) + " |")
    n = rows[0]["n_train"] if rows else 1
    lines.append("| DP cap e^ε/(1+e^ε)+δ | " + " | ".join(f"{dp_auc_bound(e, _delta(n)):.4f}" for e in eps_list) + " |")
    table = "\n".join(lines)
    violations = _mia_check(rows)
    text = (
        f"# Paper A Table 2 reproduction — {meta['dataset']} (budget {meta['budget']['name']})\n\n"
        f"Loss-attack ROC AUC (members = training points, non-members = test points, class-matched), "
        f"mean ± std over {meta['seeds']} seed(s). The paper's values exceed the DP cap (SPEC E-A.20).\n\n"
        f"{table}\n\nDP runs above cap + 3 SE: {len(violations)}.\n"
    )
    atomic_write_text(out / "table2.md", text)
    summary = {**meta, "mia_violations": len(violations), "table_markdown": table}
    atomic_write_json(out / "summary.json", summary)
    return {
        "rows": rows,
        "table": table,
        "markdown": text,
        "summary": summary,
        "out_dir": str(out),
        "mia_violations": violations,
    }


# ------------------------------------------------------------------------------------ CLI
def _floats(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``dro-table3`` and ``dro-mia`` (defaults depend on the command)."""
    parser.add_argument(
        "--dataset", choices=sorted(DRO_DATASETS), help="dataset (dro-table3: required; dro-mia: default cifar10-st)"
    )
    parser.add_argument("--data-dir", help="folder with one sub-folder per dataset (default $PRIVOPT_DATA)")
    parser.add_argument(
        "--epsilons", type=_floats, help="comma-separated ε (dro-table3: 0.5,1,5,10; dro-mia: 0.1,1,3,5,8,10)"
    )
    parser.add_argument("--seeds", type=int, help="runs per setting (dro-table3: 3, dro-mia: 5)")
    parser.add_argument(
        "--budget",
        choices=sorted(BUDGETS),
        default="quick",
        help="quick: CPU-sized model and schedule; paper: ResNet20-GN, batch 128, SPEC §8.10 grid",
    )
    parser.add_argument("--model", help="override the budget's model (a registered model name)")
    parser.add_argument("--methods", help="comma-separated algorithm names (default: the paper's)")
    parser.add_argument("--no-tune", action="store_true", help="skip tuning (budget-default lr/clip)")
    parser.add_argument("--out", required=True, help="output directory (new)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", action="store_true")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``privopt reproduce dro-table3`` / ``dro-mia``."""
    mia = getattr(args, "experiment", "dro-table3") == "dro-mia"
    dataset = args.dataset or ("cifar10-st" if mia else None)
    if dataset is None:
        raise ConfigError("dro-table3 needs --dataset (one of " + ", ".join(sorted(DRO_DATASETS)) + ")")
    methods = (
        [m.strip() for m in args.methods.split(",")] if args.methods else list(MIA_METHODS if mia else TABLE3_METHODS)
    )
    quiet = args.quiet or args.json
    common = dict(
        dataset=dataset,
        data_dir=args.data_dir,
        budget=args.budget,
        methods=methods,
        model=args.model,
        out_dir=args.out,
        tune=not args.no_tune,
        log=(lambda s: None) if quiet else None,
    )
    if mia:
        res = run_dro_mia(epsilons=args.epsilons or MIA_EPSILONS, seeds=args.seeds or 5, **common)
    else:
        res = run_dro_table3(epsilons=args.epsilons or TABLE3_EPSILONS, seeds=args.seeds or 3, **common)
    if args.json:
        print(json.dumps(res["summary"], default=str))
    elif not args.quiet:
        print("\n" + res["markdown"])
        print(f"outputs in {res['out_dir']}")
    if res["mia_violations"]:
        print(
            f"privopt: {len(res['mia_violations'])} DP run(s) exceed the membership-inference cap — "
            "this is a privacy bug, see table/summary",
            flush=True,
        )
        return 1
    return 0
