"""Paper A's reproduction runner: one training run, the tuning grid search and the grid of final runs.

Every run goes through the shared training loop (:func:`privopt.training.train`). Noise and
sampling randomness is secret by default (as in any run); a reproduction made for research can
opt into a seeded, *insecure* source with ``insecure_seed`` (run ``s`` of a grid uses
``insecure_seed + s``, shared by every method and ε of that seed), which the outputs record.
Every run is independent: ``jobs > 1`` runs them in worker processes
(:mod:`privopt.experiments.jobs`) with identical, identically ordered results.
The protocol (budgets, grids, δ) is :mod:`privopt.experiments.dro_protocol`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Union

from torch import nn

from privopt.checkpoint import atomic_write_json
from privopt.errors import ConfigError, PrivoptError, public_reason
from privopt.experiments.dro_protocol import (
    BUDGETS,
    LAM0,
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
from privopt.experiments.dro_rows import failed_row, finite, log_row, result_row, tuning_report
from privopt.experiments.jobs import SHARED, Call, DataRef, Workers, picklable, single_threaded
from privopt.experiments.outdir import reproduction_output
from privopt.experiments.privacy_notes import TRAINING_MEASUREMENTS, dro_defaults_note, hyperparameter_note
from privopt.plugins import import_plugins

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
        tuning_note: how the final runs' hyper-parameters were chosen when that read private
            data (config key ``hyperparameter_tuning``: their records say it is not accounted).
        plugins: the reproduction's plugins as given (config key ``plugins``: every run's record states them).
    """

    dataset_label: str
    budget: Budget
    model: ModelSpec | None = None
    progress: bool = False
    insecure_seed: int | None = None
    device: str = "cpu"
    tuning_note: str | None = None
    plugins: tuple[str, ...] = ()

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
        return budget.feature_model, None, dict(budget.feature_model_params)
    image = len(data.input_shape) == 3
    name = budget.image_model if image else budget.tabular_model
    return name, None, (dict(budget.model_params) if name in ("mlp",) else {})


def _centering(budget: Budget, data) -> dict:
    """The budget's DP feature centring for runs on its fixed features (``{}``: none; raw inputs never)."""
    return dict(budget.feature_centering) if "features" in data.meta.get("public", {}) else {}


def _logit_adjustment(budget: Budget, method: str) -> dict:
    own = budget.setting(method).logit_adjustment
    return budget.logit_adjustment if own is None else own


def _planned_steps(method: str, params: dict, n: int) -> int | None:
    """Iterations the method will run on n records (so every method gets ``eval_points`` curve points)."""
    from privopt.algorithms import get_algorithm

    try:
        return int(get_algorithm(method, **params).steps_for(n=n))
    except NotImplementedError:
        return None


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
    private = available_algorithms()[method].private
    budget = spec.budget.for_method(method).fitted(n).at_epsilon(epsilon if private else None)
    if "weight_cap" in hp:  # a tuned cap (Budget.weight_cap_grid) overrides the budget's rule
        budget = replace(budget, weight_cap=float(hp["weight_cap"]))
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
            "hyperparameter_tuning": spec.tuning_note,
            "feature_centering": _centering(budget, data),
            "logit_adjustment": dict(_logit_adjustment(budget, method)),
            "plugins": list(spec.plugins),  # imported already (Workers): the record states them as given
        }
    )
    t0 = time.perf_counter()
    rec = train(cfg, out_dir=out_dir, progress=spec.progress, dataset=data, model=module)
    wall = time.perf_counter() - t0
    rec = _with_diagnostics(rec, out_dir) if cfg.non_private_diagnostics else rec
    row = result_row(
        method, spec, rec, private=private, n=n, hp=hp, epochs=epochs, epsilon=epsilon, seed=seed, pre=eval_split
    )
    row["weight_cap"] = params.get("weight_cap")  # the cap that ran (None: not a DRO method)
    row["hyperparameter_tuning"] = spec.tuning_note  # not accounted in epsilon_spent
    return {**row, "model": model_name, "model_params": model_params, "wall_s": wall, "run_dir": str(out_dir)}


def _with_diagnostics(rec: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The record with the run's non-private diagnostics merged in (for the experiment's tables only)."""
    from privopt.training import load_diagnostics

    diag = load_diagnostics(out_dir)
    by_step = {h["step"]: h for h in diag["history"]}
    history = [{**h, **by_step.get(h["step"], {})} for h in rec["history"]]
    return {**rec, "metrics": {**rec["metrics"], **diag["final"]}, "history": history}


# ------------------------------------------------------------------------------- tuning
def _data_ref(dataset: Any, data_dir, budget: Budget, *, seed: int, val_fraction: float = 0.0):
    """A registered dataset as a :class:`DataRef` (each worker loads it), else :data:`SHARED` (the object)."""
    if not isinstance(dataset, str):
        return SHARED
    kwargs = {"data_dir": None if data_dir is None else str(data_dir), "seed": seed, "val_fraction": val_fraction}
    return DataRef(load_dro_dataset, {"name": dataset, **kwargs, **budget.data_options()})


def _tuning_data(dataset: Any, data_dir, budget: Budget):
    if isinstance(dataset, str):
        return _data_ref(dataset, data_dir, budget, seed=0, val_fraction=budget.val_fraction)
    if dataset.x_val is None or dataset.x_val.shape[0] == 0:
        raise ConfigError(
            "tuning needs a validation split: pass a Dataset with x_val/y_val "
            "(e.g. load_dataset(..., val_fraction=0.2)) or tune=False with explicit hyper-parameters"
        )
    return dataset


def _trial(
    method: str, spec: RunSpec, *, data, eps, hp: dict, repeat: int, run_dir: Path
) -> tuple[float, float, str | None]:
    """(balanced validation accuracy, wall seconds, error) of one run of a grid point (``repeat``: its
    seed, hence its initialisation and an insecure seed's noise); a diverging trial loses. The error
    is printed: only its type when torch or the user's code raised it (its text may quote a record)."""
    try:
        point = dict(hp=hp, epochs=spec.budget.tune_epochs, epsilon=eps, seed=repeat)
        row = run_one(method, spec, data=data, **point, out_dir=run_dir, eval_split="val", metrics=[])
        return (row["val_score"] if finite(row["val_score"]) else -math.inf), row["wall_s"], None
    except (PrivoptError, ArithmeticError, RuntimeError, ValueError) as e:
        return -math.inf, float("nan"), public_reason(e)


def _tuning_plan(methods: Sequence[str], budget: Budget, epsilons) -> list[tuple[str, Any, int, dict, int]]:
    """(method, ε, grid index, grid point, repeat) of every trial, in the serial order."""
    from privopt.algorithms import available_algorithms

    plan = []
    for method in methods:
        private = available_algorithms()[method].private
        for eps in tuning_epsilons(budget, epsilons, private=private):
            for k, hp in enumerate(budget.grid(method, epsilon=eps)):
                if private or hp["clip"] == budget.clips[0]:  # non-private: no clip, the grid is the lr axis
                    plan += [(method, eps, k, hp, r) for r in range(budget.tune_repeats)]
    return plan


def tune(methods: Sequence[str], spec: RunSpec, *, data, epsilons: Sequence[float], out: Path, log: Log, workers=None):
    """Grid search on the validation split; returns the best grid point per (method, ε) and a report.

    A grid point's score is the mean over its ``budget.tune_repeats`` runs (each draws its own noise).

    ``data``: a Dataset with a validation split, or a :class:`DataRef` each run loads.
    ``workers``: where the trials run (a :class:`Workers` whose ``shared`` is ``data`` if that is a
    Dataset; default: this process). The trials and the best points are the same either way.
    """
    budget, plan = spec.budget, _tuning_plan(methods, spec.budget, epsilons)
    ref = data if isinstance(data, DataRef) else SHARED
    workers = workers or Workers(1, shared=None if ref is data else data)
    run_dir = out / "runs" / "tune"
    calls = []
    for m, e, k, hp, r in plan:
        where = _trial_dir(run_dir, m, e, k, r)
        calls.append(Call(kwargs=dict(method=m, spec=spec, eps=e, hp=hp, repeat=r, run_dir=where), data=ref))
    scored, trials, per_method_s = {}, [], dict.fromkeys(methods, 0.0)
    t_all = t_last = time.perf_counter()
    for (method, eps, k, hp, r), (score, wall, err) in zip(plan, workers.map(_trial, calls)):
        if err is not None:
            log(f"    trial failed: {err}")
        scored.setdefault((method, eps), {}).setdefault(k, (hp, []))[1].append(score)
        trials.append(
            {
                "method": method,
                "epsilon": eps,
                "trial": k,
                "repeat": r,
                **hp,
                "val_balanced_accuracy": score,
                "wall_s": wall,
            }
        )
        cap = f"A={hp['weight_cap']:<5g} " if "weight_cap" in hp else ""
        log(
            f"  tune {method:20s} eps={eps!s:5s} lr={hp['lr']:<6g} clip={hp['clip']:<5g} {cap}"
            f"val balanced acc {score:.4f} ({wall:.1f} s)"
        )
        now = time.perf_counter()  # a method's time: from the previous result to each of its own
        per_method_s[method], t_last = per_method_s[method] + now - t_last, now
    best = {key: _best_point(points) for key, points in scored.items()}
    return best, tuning_report(budget, methods, trials, best, time.perf_counter() - t_all, per_method_s)


def _trial_dir(root: Path, method: str, eps, k: int, repeat: int) -> Path:
    return root / method / f"eps{eps}" / (f"trial{k}" if repeat == 0 else f"trial{k}-repeat{repeat}")


def _best_point(points: dict[int, tuple[dict, list[float]]]) -> dict:
    """The grid point with the best mean score over its repeats (ties: the earlier point)."""
    mean = {k: sum(scores) / len(scores) for k, (_hp, scores) in points.items()}  # one -inf loses
    k_best = max(points, key=lambda k: (mean[k], -k))
    return dict(points[k_best][0])


# -------------------------------------------------------------------------- the grid
def _checked(budget, seeds, epsilons, methods, nonprivate, out_dir) -> tuple[Budget, list[float], list[str], Path]:
    from privopt.algorithms import available_algorithms

    if isinstance(budget, str) and budget not in BUDGETS:
        raise ConfigError(f"unknown budget {budget!r}; choose from {', '.join(BUDGETS)}")
    b = BUDGETS[budget] if isinstance(budget, str) else budget
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ConfigError(f"seeds must be a positive integer, got {seeds!r}")
    if not (isinstance(b.tune_repeats, int) and b.tune_repeats >= 1):
        raise ConfigError(f"the budget's tune_repeats must be a positive integer, got {b.tune_repeats!r}")
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


def _final_run(method: str, spec: RunSpec, *, data, private: bool, hp: dict, eps, seed: int, run_dir, metrics):
    """One final run's row; a diverging optimiser is a result (a failed row), not a crash of the table."""
    try:
        point = dict(hp=hp, epochs=spec.budget.epochs, epsilon=eps, seed=seed)
        return run_one(method, spec, data=data, **point, out_dir=run_dir, eval_split="test", metrics=metrics)
    except (ArithmeticError, ValueError) as e:
        err = public_reason(e)
        return failed_row(method, spec, private=private, eps=eps, seed=seed, hp=hp, error=err, run_dir=run_dir)


def _final_runs(kind, spec: RunSpec, *, dataset, data_dir, methods, eps_list, seeds, best, metrics, out, say, workers):
    from privopt.algorithms import available_algorithms

    calls, b = [], spec.budget
    for seed in range(seeds):
        data = _data_ref(dataset, data_dir, b, seed=seed)
        for method in methods:
            private = available_algorithms()[method].private
            for eps in eps_list if private else [None]:
                hp = best_hyperparameters(best, method, final_tuning_key(b, eps, private=private), b)
                run_dir = out / "runs" / "final" / method / f"eps{eps}" / f"seed{seed}"
                point = dict(private=private, hp=hp, eps=eps, seed=seed, run_dir=run_dir, metrics=metrics)
                calls.append(Call(kwargs=dict(method=method, spec=spec, **point), data=data))
    rows = []
    for row in workers.map(_final_run, calls):
        rows.append(row)  # in the serial (seed, method, ε) order: results.jsonl is always a valid prefix
        with (out / "results.jsonl").open("a") as f:
            f.write(json.dumps({k: v for k, v in row.items() if k != "history"}) + "\n")
        log_row(say, kind, row)
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
        selection_note: how given ``hyperparameters`` were chosen when that read these records
            (e.g. the demo's): written into every output as not accounted.
        insecure_seed: ``None`` (secret noise and sampling) or a base seed — NOT private.
        device: ``"cpu"`` or ``"cuda"`` for every run.
        jobs: runs at a time, each in its own worker process with one torch thread (0: one per
            CPU core). A registered dataset name is loaded by every worker itself; your own
            Dataset and model factory must be picklable. Results do not depend on ``jobs``.
        plugins: module names and ``.py`` files (from the current directory) imported first, here and
            in every worker, so ``methods`` and ``model`` can name what they register
            (:mod:`privopt.plugins`); every run's record states them as given.
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
    selection_note: str | None = None
    log: Log | None = None
    insecure_seed: int | None = None
    device: str = "cpu"
    jobs: int = 1
    plugins: Sequence[str] = ()


def _grid_sizes(budget: Budget, method: str, epsilons) -> str:
    """The number of grid points of ``method``: one number, or its range over ``epsilons``."""
    sizes = {len(budget.grid(method, epsilon=e)) for e in epsilons} or {len(budget.grid(method))}
    return f"{min(sizes)}" if len(sizes) == 1 else f"{min(sizes)}–{max(sizes)}"


def _choose_hyperparameters(req: GridRequest, spec: RunSpec, methods, eps_list, out: Path, say: Log, workers):
    """(best grid point per (method, ε), tuning report): given, tuned, or the budget's defaults."""
    if req.hyperparameters is not None:
        best = {(m, None): dict(hp) for m, hp in req.hyperparameters.items()}
        selection = {"selection": req.selection_note} if req.selection_note else {}
        return best, {"tuned": False, "hyperparameters": req.hyperparameters, **selection}
    if not req.tune_grid:
        return {}, {"tuned": False, "hyperparameters": "budget defaults"}
    points = ", ".join(f"{m} {_grid_sizes(spec.budget, m, eps_list)}" for m in methods)
    say(f"tuning {len(methods)} method(s) on a validation split (grid points: {points})")
    data = _tuning_data(req.dataset, req.data_dir, spec.budget)
    best, tuning = tune(methods, spec, data=data, epsilons=eps_list, out=out, log=say, workers=workers)
    return best, {**tuning, "tuned": True}


def run_grid(req: GridRequest) -> tuple[list[dict], dict[str, Any], Path]:
    """Run a reproduction (:class:`GridRequest`); returns (result rows, its metadata, the output folder)."""
    import_plugins(req.plugins)  # first: the methods and the model may be names a plugin registers
    b, eps_list, methods, out = _checked(req.budget, req.seeds, req.epsilons, req.methods, req.nonprivate, req.out_dir)
    b = b.for_dataset(req.dataset) if isinstance(req.dataset, str) else b
    shared = None if isinstance(req.dataset, str) else req.dataset
    workers = Workers(req.jobs, shared=shared, plugins=req.plugins)  # checked now; each worker imports the plugins
    jobs = workers.jobs
    if jobs > 1 and callable(req.model):
        picklable(req.model, "a model factory")  # before any run, not in the first worker
    with reproduction_output(out):  # a failure before any result leaves no empty folder behind (CLI or Python)
        out.mkdir(parents=True, exist_ok=True)
        say = req.log or (lambda s: print(s, flush=True))
        label = req.dataset if isinstance(req.dataset, str) else getattr(req.dataset, "name", "custom")
        from privopt.config import resolve_device

        resolve_device(req.device)  # a missing GPU fails before any tuning run
        progress = req.progress and jobs == 1  # the bars of parallel runs would interleave; one line per run instead
        spec = RunSpec(label, b, model=req.model, progress=progress, insecure_seed=req.insecure_seed,
                       device=req.device, plugins=tuple(req.plugins))  # fmt: skip
        t_start = time.perf_counter()
        runs = dict(dataset=req.dataset, data_dir=req.data_dir, methods=methods, eps_list=eps_list, seeds=req.seeds)
        with workers:  # one pool for tuning and the final runs: workers start (import torch, warm up) once
            best, tuning = _choose_hyperparameters(req, spec, methods, eps_list, out, say, workers)
            spec = replace(spec, tuning_note=hyperparameter_note(tuning, defaults_note=dro_defaults_note(req.dataset)))
            atomic_write_json(out / "tuning.json", tuning)
            finals = dict(best=best, metrics=req.metrics, out=out, say=say, workers=workers)
            rows = _final_runs(req.kind, spec, **runs, **finals)
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
        "hyperparameter_tuning": spec.tuning_note,
        "not_private": TRAINING_MEASUREMENTS if req.metrics else None,
        "insecure_seed": req.insecure_seed,
        "jobs": jobs,
        "plugins": list(req.plugins),
        "tuning_wall_s": tuning.get("wall_s", 0.0),
        "total_wall_s": time.perf_counter() - t_start,
    }
    return rows, meta, out
