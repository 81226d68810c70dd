"""Paper A's reproduction runner: one training run, the tuning grid search and the grid of final runs.

Every run goes through the shared training loop (:func:`privopt.training.train`). Noise and
sampling randomness is secret by default (as in any run); a reproduction made for research can
opt into a seeded, *insecure* source with ``insecure_seed`` (run ``s`` of a grid uses
``insecure_seed + s``, shared by every method and ε of that seed), which the outputs record.
The protocol (budgets, grids, δ) is :mod:`privopt.experiments.dro_protocol`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

from torch import nn

from privopt.checkpoint import atomic_write_json
from privopt.errors import ConfigError, PrivoptError
from privopt.experiments.dro_protocol import (
    BUDGETS,
    LAM0,
    METHOD_LABELS,
    NONPRIVATE_METHOD,
    RHO,
    Budget,
    best_hyperparameters,
    final_tuning_key,
    load_dro_dataset,
    method_params,
    paper_delta,
    tuning_epsilons,
)

__all__ = ["GridRequest", "ModelSpec", "RunSpec", "randomness_note", "run_grid", "run_one", "single_threaded", "tune"]

ModelSpec = Union[str, Callable[[], nn.Module]]
Log = Callable[[str], None]


@dataclass(frozen=True)
class RunSpec:
    """What every run of one reproduction shares.

    Attributes:
        dataset_label: the dataset's name in the outputs.
        budget: the compute budget (model, schedule, grid).
        model: None (the budget's model), a registered model name, or a factory of ``nn.Module``.
        progress: per-run progress bars.
        insecure_seed: ``None`` (secret noise and sampling) or the base of seeded, insecure sources.
        device: ``"cpu"`` or ``"cuda"`` for every run (config key ``device``).
    """

    dataset_label: str
    budget: Budget
    model: ModelSpec | None = None
    progress: bool = False
    insecure_seed: int | None = None
    device: str = "cpu"

    def noise_seed(self, seed: int) -> int | None:
        return None if self.insecure_seed is None else self.insecure_seed + seed


def randomness_note(insecure_seed: int | None) -> str:
    """How a reproduction drew its noise and batches (written into its outputs)."""
    if insecure_seed is None:
        return "secret (OS entropy): not reproducible, private"
    return f"seeded, INSECURE (insecure_seed = {insecure_seed} + seed): reproducible, not private"


# ------------------------------------------------------------------------------ one run
def _model_for(
    model: ModelSpec | None, budget: Budget, data, method: str | None = None
) -> tuple[str, nn.Module | None, dict]:
    """(config model name, module for train() or None, model params): an explicit ``model`` (every method),
    else the method's own setting (:class:`~privopt.experiments.dro_protocol.MethodSetting`), else the budget's."""
    if callable(model):
        m = model()
        if not isinstance(m, nn.Module):
            raise ConfigError(f"the model factory must return an nn.Module, got {type(m).__name__}")
        return "custom", m, {}
    if model is not None:
        return str(model), None, {}
    own = budget.setting(method)
    if own.model is not None:
        return own.model, None, dict(own.model_params)
    if "features" in data.meta.get("public", {}):  # a fixed feature map replaced the images
        return budget.feature_model, None, {}
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


def _row(
    method: str,
    spec: RunSpec,
    rec: dict,
    *,
    private: bool,
    n: int,
    hp: dict,
    epochs: float,
    epsilon,
    seed: int,
    pre: str,
) -> dict:
    """A flat result row (+ ``history``) from a run record."""
    m, p = rec["metrics"], rec["privacy"]
    row = {
        "dataset": spec.dataset_label,
        "method": method,
        "label": METHOD_LABELS.get(method, method),
        "private": private,
        "epsilon": epsilon if private else None,
        "delta": p["delta"] if private else None,
        "epsilon_spent": p["epsilon_spent"],
        "seed": seed,
        "n_train": n,
        "lr": hp["lr"],
        "clip": hp["clip"],
        "epochs": epochs,
        "steps": rec["steps_done"],
        **{f"{pre}_{k}": m.get(f"{pre}_{src}") for k, src in _METRIC_KEYS},
        **{k: m.get(k) for k in ("grad_norm", "dro_lam_star", "mia_auc", "mia_bound", "mia_slack")},
        "mia_within_bound": None if m.get("mia_within_bound") is None else bool(m["mia_within_bound"]),
    }
    if pre == "val":
        row["val_score"] = row["val_balanced_accuracy"]
    keys = ("step", "grad_norm", f"{pre}_accuracy", f"{pre}_roc_auc", f"{pre}_f1")
    row["history"] = [{k: h.get(k) for k in keys} for h in rec["history"]]
    return row


_METRIC_KEYS = (
    ("accuracy", "accuracy"),
    ("auc", "roc_auc"),
    ("f1", "f1"),
    ("worst_class_accuracy", "worst_class_accuracy"),
    ("balanced_accuracy", "balanced_accuracy"),
)


def run_one(
    method: str,
    spec: RunSpec,
    *,
    data,
    hp: dict,
    epochs: float,
    epsilon,
    seed: int,
    out_dir: Path,
    eval_split: str,
    metrics: list[str],
) -> dict[str, Any]:
    """One training run through the shared loop; returns a flat result row (+ ``history``)."""
    from privopt.algorithms import available_algorithms
    from privopt.config import RunConfig
    from privopt.training import train

    n = int(data.x_train.shape[0])
    private, budget = available_algorithms()[method].private, spec.budget.for_method(method).fitted(n)
    model_name, module, model_params = _model_for(spec.model, budget, data, method=method)
    params = method_params(method, budget=budget, lr=hp["lr"], clip=hp["clip"], epochs=epochs)
    params.update(hp.get("algorithm_params", {}))  # per-method overrides of fixed hyper-parameters (the demo's)
    total = _planned_steps(method, params, n) or max(1, math.ceil(epochs * n / budget.batch_size))
    cfg = RunConfig.from_dict(
        {
            "algorithm": method,
            "dataset": data.name,
            "model": model_name if module is None else "mlp",
            "model_params": model_params,
            "seed": seed,
            "insecure_seed": spec.noise_seed(seed),
            "device": spec.device,
            "eval_split": eval_split,
            "metrics": metrics,
            "algorithm_params": params,
            "privacy": {"epsilon": epsilon if private else None, "delta": paper_delta(n)},
            "eval_every": max(1, total // budget.eval_points),
            "checkpoint_every": 10**9,
            # gradient norms, MIA and validation scores read the training data: non-private diagnostics
            "non_private_diagnostics": bool(metrics) or eval_split == "val",
        }
    )
    t0 = time.perf_counter()
    rec = train(cfg, out_dir=out_dir, progress=spec.progress, dataset=data, model=module)
    wall = time.perf_counter() - t0
    rec = _with_diagnostics(rec, out_dir) if cfg.non_private_diagnostics else rec
    row = _row(
        method, spec, rec, private=private, n=n, hp=hp, epochs=epochs, epsilon=epsilon, seed=seed, pre=eval_split
    )
    return {**row, "model": model_name, "model_params": model_params, "wall_s": wall, "run_dir": str(out_dir)}


def _with_diagnostics(rec: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The record with the run's non-private diagnostics merged in (for the experiment's tables only)."""
    from privopt.training import load_diagnostics

    diag = load_diagnostics(out_dir)
    by_step = {h["step"]: h for h in diag["history"]}
    history = [{**h, **by_step.get(h["step"], {})} for h in rec["history"]]
    return {**rec, "metrics": {**rec["metrics"], **diag["final"]}, "history": history}


def _failed_row(method: str, spec: RunSpec, *, private: bool, eps, seed: int, hp: dict, error: str, run_dir: Path):
    nan = math.nan
    metrics = ("test_accuracy", "test_auc", "test_f1", "test_worst_class_accuracy", "grad_norm", "wall_s")
    return {
        "dataset": spec.dataset_label,
        "method": method,
        "label": METHOD_LABELS.get(method, method),
        "private": private,
        "epsilon": eps,
        "delta": None,
        "epsilon_spent": None,
        "seed": seed,
        "lr": hp["lr"],
        "clip": hp["clip"],
        **dict.fromkeys(metrics, nan),
        **dict.fromkeys(("mia_auc", "mia_bound", "mia_slack", "mia_within_bound"), None),
        "steps": 0,
        "run_dir": str(run_dir),
        "error": error,
        "history": [],
    }


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ------------------------------------------------------------------------------- tuning
def _tuning_data(dataset: Any, data_dir, budget: Budget):
    if isinstance(dataset, str):
        return load_dro_dataset(
            dataset, data_dir=data_dir, seed=0, val_fraction=budget.val_fraction, **budget.data_options()
        )
    if dataset.x_val is None or dataset.x_val.shape[0] == 0:
        raise ConfigError(
            "tuning needs a validation split: pass a Dataset with x_val/y_val "
            "(e.g. load_dataset(..., val_fraction=0.2)) or tune=False with explicit hyper-parameters"
        )
    return dataset


def _trial(method: str, spec: RunSpec, *, data, eps, hp: dict, run_dir: Path, log: Log) -> tuple[float, float]:
    """(balanced validation accuracy, wall seconds) of one grid point; a diverging trial loses."""
    try:
        point = dict(hp=hp, epochs=spec.budget.tune_epochs, epsilon=eps, seed=0)
        row = run_one(method, spec, data=data, **point, out_dir=run_dir, eval_split="val", metrics=[])
        return (row["val_score"] if _finite(row["val_score"]) else -math.inf), row["wall_s"]
    except (PrivoptError, ArithmeticError, RuntimeError, ValueError) as e:
        log(f"    trial failed: {e}")
        return -math.inf, float("nan")


def tune(methods: Sequence[str], spec: RunSpec, *, data, epsilons: Sequence[float], out: Path, log: Log):
    """Grid search on the validation split; returns best (lr, clip) per (method, ε) and a report."""
    from privopt.algorithms import available_algorithms

    budget, best, trials, per_method_s = spec.budget, {}, [], {}
    t_all = time.perf_counter()
    for method in methods:
        private, t_m = available_algorithms()[method].private, time.perf_counter()
        for eps in tuning_epsilons(budget, epsilons, private=private):
            results = []
            for k, hp in enumerate(budget.grid(method)):
                if not private and hp["clip"] != budget.clips[0]:
                    continue  # non-private methods have no clip: their grid collapses to the learning rates
                run_dir = out / "runs" / "tune" / method / f"eps{eps}" / f"trial{k}"
                score, wall = _trial(method, spec, data=data, eps=eps, hp=hp, run_dir=run_dir, log=log)
                results.append((score, k, hp))
                trials.append(
                    {"method": method, "epsilon": eps, "trial": k, **hp, "val_balanced_accuracy": score, "wall_s": wall}
                )
                log(
                    f"  tune {method:20s} eps={eps!s:5s} lr={hp['lr']:<6g} clip={hp['clip']:<5g} "
                    f"val balanced acc {score:.4f} ({wall:.1f} s)"
                )
            best[(method, eps)] = dict(max(results, key=lambda r: (r[0], -r[1]))[2])
        per_method_s[method] = time.perf_counter() - t_m
    return best, _tuning_report(budget, methods, trials, best, time.perf_counter() - t_all, per_method_s)


def _tuning_report(budget: Budget, methods, trials, best, wall: float, per_method_s) -> dict[str, Any]:
    return {
        "grid": {"lr": list(budget.lrs), "clip": list(budget.clips)},
        "method_lr_grids": {m: list(budget.lrs_for(m)) for m in methods if budget.setting(m).lrs is not None},
        "trials_per_method": {m: sum(1 for t in trials if t["method"] == m) for m in methods},
        "tune_at": budget.tune_at,
        "tune_epochs": budget.tune_epochs,
        "validation": f"{budget.val_fraction:g} of the training split (stratified, seed 0); score = balanced "
        "validation accuracy (the -ST test splits are class-balanced while the validation split "
        "keeps the training imbalance, so plain accuracy would reward majority-class predictors)",
        "n_trials": len(trials),
        "wall_s": wall,
        "wall_s_per_method": per_method_s,
        "privacy_note": "tuning runs are not accounted in epsilon (as in the paper)",
        "best": [{"method": m, "epsilon": e, **hp} for (m, e), hp in best.items()],
        "trials": trials,
    }


# -------------------------------------------------------------------------- the grid
def _checked(budget, seeds, epsilons, methods, nonprivate, out_dir) -> tuple[Budget, list[float], list[str], Path]:
    from privopt.algorithms import available_algorithms

    if isinstance(budget, str) and budget not in BUDGETS:
        raise ConfigError(f"unknown budget {budget!r}; choose from {', '.join(BUDGETS)}")
    b = BUDGETS[budget] if isinstance(budget, str) else budget
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
    return b, eps_list, methods, out


def _log_row(say: Log, kind: str, row: dict) -> None:
    method, eps, seed = row["method"], row["epsilon"], row["seed"]
    if row.get("error"):
        say(f"  {kind} {method:20s} eps={eps} seed {seed}: FAILED ({row['error']})")
        return
    mia = "" if row["mia_auc"] is None else f", MIA AUC {row['mia_auc']:.3f}"
    if row["mia_auc"] is not None and row["mia_bound"] is not None:
        mia += f" (cap {row['mia_bound']:.3f})"
    eps_txt = "non-private" if eps is None else f"eps={eps:g} (spent {row['epsilon_spent']:.3f})"
    gn = row["grad_norm"]
    say(
        f"  {kind} {method:20s} {eps_txt:28s} seed {seed}: test acc {row['test_accuracy']:.4f}, "
        f"grad norm {f'{gn:.3g}' if _finite(gn) else 'nan'}{mia} ({row['model']}, {row['wall_s']:.1f} s)"
    )


def _final_runs(kind, spec: RunSpec, *, dataset, data_dir, methods, eps_list, seeds, best, metrics, out, say):
    from privopt.algorithms import available_algorithms

    rows, b = [], spec.budget
    for seed in range(seeds):
        data = (
            load_dro_dataset(dataset, data_dir=data_dir, seed=seed, **b.data_options())
            if isinstance(dataset, str)
            else dataset
        )
        for method in methods:
            private = available_algorithms()[method].private
            for eps in eps_list if private else [None]:
                hp = best_hyperparameters(best, method, final_tuning_key(b, eps, private=private), b)
                run_dir = out / "runs" / "final" / method / f"eps{eps}" / f"seed{seed}"
                try:
                    point = dict(hp=hp, epochs=b.epochs, epsilon=eps, seed=seed)
                    row = run_one(method, spec, data=data, **point, out_dir=run_dir, eval_split="test", metrics=metrics)
                except (ArithmeticError, ValueError) as e:
                    # A diverging optimiser is a result (reported as failed), not a crash of the table.
                    err = f"{type(e).__name__}: {e}"
                    row = _failed_row(
                        method, spec, private=private, eps=eps, seed=seed, hp=hp, error=err, run_dir=run_dir
                    )
                rows.append(row)
                with (out / "results.jsonl").open("a") as f:
                    f.write(json.dumps({k: v for k, v in row.items() if k != "history"}) + "\n")
                _log_row(say, kind, row)
    return rows


@dataclass(frozen=True)
class GridRequest:
    """One reproduction: tune (or take given hyper-parameters), then run every (seed, method, ε).

    Attributes:
        kind: label of the reproduction (``"table3"``, ``"mia"``).
        dataset: a name of ``DRO_DATASETS`` or your own :class:`privopt.data.Dataset` (with a
            validation split if tuning).
        methods: registered algorithm names; ``nonprivate`` adds the SCDRO reference.
        epsilons: privacy budgets (δ = n^{−1.1}). seeds: independent runs per (method, ε).
        metrics: run metrics of the loop (e.g. ``["grad_norm", "mia"]``).
        out_dir: a new output folder.
        data_dir: folder with the dataset files (default ``$PRIVOPT_DATA``).
        budget: ``"quick"``, ``"paper"`` or a :class:`Budget`.
        model: None (the budget's model), a registered model name, or a zero-argument callable
            returning a fresh ``nn.Module``.
        progress: per-run progress bars. log: line printer (default ``print``).
        tune_grid: grid-search (lr, clip) per method on a validation split (same grid for all).
        hyperparameters: skip tuning and use ``{method: {"lr": .., "clip": ..}}`` (optionally with
            ``"algorithm_params": {field: value}``, which override that method's config fields).
        insecure_seed: ``None`` (secret noise and sampling) or a base seed — NOT private.
        device: ``"cpu"`` or ``"cuda"`` for every run.
    """

    kind: str
    dataset: Any
    methods: Sequence[str]
    epsilons: Sequence[float]
    seeds: int
    metrics: list[str]
    out_dir: Any
    data_dir: Any = None
    budget: str | Budget = "quick"
    model: ModelSpec | None = None
    progress: bool = False
    nonprivate: bool = True
    tune_grid: bool = True
    hyperparameters: dict | None = None
    log: Log | None = None
    insecure_seed: int | None = None
    device: str = "cpu"


def _choose_hyperparameters(req: GridRequest, spec: RunSpec, methods, eps_list, out: Path, say: Log):
    """(best grid point per (method, ε), tuning report): given, tuned, or the budget's defaults."""
    if req.hyperparameters is not None:
        best = {(m, None): dict(hp) for m, hp in req.hyperparameters.items()}
        return best, {"tuned": False, "hyperparameters": req.hyperparameters}
    if not req.tune_grid:
        return {}, {"tuned": False, "hyperparameters": "budget defaults"}
    points = ", ".join(f"{m} {len(spec.budget.grid(m))}" for m in methods)
    say(f"tuning {len(methods)} method(s) on a validation split (grid points: {points})")
    data = _tuning_data(req.dataset, req.data_dir, spec.budget)
    best, tuning = tune(methods, spec, data=data, epsilons=eps_list, out=out, log=say)
    return best, {**tuning, "tuned": True}


def run_grid(req: GridRequest) -> tuple[list[dict], dict[str, Any], Path]:
    """Run a reproduction (:class:`GridRequest`); returns (result rows, its metadata, the output folder)."""
    import privopt.experiments.dro_metrics  # noqa: F401  (registers grad_norm / mia)

    b, eps_list, methods, out = _checked(req.budget, req.seeds, req.epsilons, req.methods, req.nonprivate, req.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = req.log or (lambda s: print(s, flush=True))
    label = req.dataset if isinstance(req.dataset, str) else getattr(req.dataset, "name", "custom")
    from privopt.config import resolve_device

    resolve_device(req.device)  # a missing GPU fails before any tuning run
    spec = RunSpec(label, b, model=req.model, progress=req.progress, insecure_seed=req.insecure_seed, device=req.device)
    t_start = time.perf_counter()
    best, tuning = _choose_hyperparameters(req, spec, methods, eps_list, out, say)
    atomic_write_json(out / "tuning.json", tuning)
    runs = dict(dataset=req.dataset, data_dir=req.data_dir, methods=methods, eps_list=eps_list, seeds=req.seeds)
    rows = _final_runs(req.kind, spec, **runs, best=best, metrics=req.metrics, out=out, say=say)
    meta = {
        "kind": req.kind,
        "dataset": label,
        "budget": asdict(b),
        "methods": methods,
        "epsilons": eps_list,
        "seeds": req.seeds,
        "rho": RHO,
        "lam0": LAM0,
        "delta_rule": "n^-1.1",
        "randomness": randomness_note(req.insecure_seed),
        "insecure_seed": req.insecure_seed,
        "tuning_wall_s": tuning.get("wall_s", 0.0),
        "total_wall_s": time.perf_counter() - t_start,
    }
    return rows, meta, out


def single_threaded(fn: Callable) -> Callable:
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
