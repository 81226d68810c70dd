"""The shared training loop: one place for data, calibration, the ledger and budget guard,
evaluation, logging, checkpoints/resume and the run record.

Example:
    >>> from privopt.config import RunConfig
    >>> from privopt.training import train
    >>> cfg = RunConfig.from_dict({"algorithm": "dp-sgd", "dataset": "digits", "model": "logreg",
    ...     "algorithm_params": {"epochs": 1, "batch_size": 100, "lr": 0.5},
    ...     "privacy": {"epsilon": 2.0, "delta": 1e-5}})
    >>> import tempfile; record = train(cfg, out_dir=tempfile.mkdtemp() + "/run", progress=False)
    >>> record["privacy"]["epsilon_spent"] <= 2.0
    True
"""

from __future__ import annotations

import csv
import math
import platform
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import privopt
from privopt.algorithms.base import RunContext, get_algorithm
from privopt.checkpoint import atomic_write_json, atomic_write_text, load_checkpoint, save_checkpoint
from privopt.config import RunConfig
from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.grads import get_engine, validate_model
from privopt.privacy import PrivacyLedger, calibrate
from privopt.rng import make_sources

__all__ = ["train", "build_loss", "evaluate", "RunInterrupted", "register_run_metric", "available_run_metrics"]

RECORD_NAME = "record.json"


class RunInterrupted(Exception):
    """Raised after a run was interrupted (Ctrl-C / SIGTERM) and its checkpoint saved."""


def build_loss(name: str):
    """Per-sample loss ``(outputs, targets) -> [B]`` by name."""
    if name == "cross_entropy":
        return lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    raise ConfigError(f"unknown loss {name!r}; available: cross_entropy")


@torch.no_grad()
def evaluate(
    model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, *, num_classes: int, prefix: str, chunk: int = 2048
) -> dict[str, float]:
    """Loss and classification metrics of ``model`` on (x, y), keys prefixed by ``prefix``."""
    from privopt.eval.metrics import classification_metrics

    was_training = model.training
    model.eval()
    logits = torch.cat([model(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)])
    model.train(was_training)
    out = {"loss": float(loss_fn(logits, y).mean())}
    out.update(classification_metrics(logits, y, num_classes=num_classes))
    return {f"{prefix}_{k}": float(v) for k, v in out.items() if isinstance(v, (int, float))}


def _interval(value: int, total: int, default_count: int) -> int:
    return value if value > 0 else max(1, math.ceil(total / default_count))


def register_run_metric(name: str, fn: Callable[..., dict[str, float]], *, when: str = "eval") -> None:
    """Add a metric computed by the loop: ``fn(model=, loss_fn=, data=, record=)`` returning a dict.

    ``when="eval"`` runs it at every evaluation (e.g. a gradient-norm curve), ``"final"`` once at
    the end (e.g. a membership-inference attack). Select metrics per run with ``RunConfig.metrics``.
    """
    if when not in ("eval", "final"):
        raise ConfigError(f"run metric timing must be 'eval' or 'final', got {when!r}")
    _RUN_METRICS[name] = (fn, when)


def available_run_metrics() -> list[str]:
    return sorted(_RUN_METRICS)


_RUN_METRICS: dict[str, tuple[Callable[..., dict[str, float]], str]] = {}


def _extra_metrics(names: list[str], when: str, **kw: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in names:
        fn, timing = _RUN_METRICS[name]
        if timing == when or (when == "final" and timing == "eval"):
            out.update({k: float(v) for k, v in fn(**kw).items()})
    return out


def train(
    cfg: RunConfig,
    *,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    max_steps: int | None = None,
    dataset: Any = None,
    model: nn.Module | None = None,
) -> dict[str, Any]:
    """Run one configured training job and write its outputs to ``out_dir``.

    Outputs: ``record.json`` (config, hyper-parameters, privacy inventory, calibrated noise,
    ledger, final (epsilon, delta), neighbouring relation, seeds, metrics, wall time),
    ``metrics.csv``, ``curves.png`` and ``checkpoint.pt`` (for ``resume=True``).

    Args:
        cfg: the validated run configuration.
        out_dir: output directory; must not hold another run unless ``resume``.
        resume: continue from ``out_dir/checkpoint.pt`` (model, estimator state, RNG states and
            the privacy ledger are restored, so no budget is re-spent or forgotten).
        progress: show a progress bar.
        max_steps: stop (with a checkpoint, status ``"paused"``) after this many steps in this
            call — for tests and for splitting long jobs.
        dataset: a :class:`privopt.data.Dataset` to use instead of loading ``cfg.dataset``
            (your own data; pass the same one again on resume).
        model: an ``nn.Module`` to train instead of building ``cfg.model`` (your own model).

    Raises:
        PrivacyBudgetExceeded: a query would have exceeded the target; the checkpoint and a
            partial record (``status: "budget_exhausted"``) are saved first.
        RunInterrupted: on SIGINT/SIGTERM, after saving a checkpoint and a partial record.
    """
    from privopt.data import load_dataset
    from privopt.models import build_model

    out = Path(out_dir)
    cfg.validate()
    if resume:
        ckpt = load_checkpoint(out)
        cfg = RunConfig.from_dict(ckpt["config"])
    elif out.exists() and any(out.iterdir()):
        raise ConfigError(f"output directory {out} already holds files; choose another or pass --resume")

    algo = get_algorithm(cfg.algorithm, **cfg.algorithm_params)
    if algo.private and cfg.privacy.epsilon is None:
        raise ConfigError(f"algorithm {cfg.algorithm!r} is private: set privacy.epsilon")

    unknown = sorted(set(cfg.metrics) - set(_RUN_METRICS))
    if unknown:
        raise ConfigError(f"unknown run metric(s) {unknown}; available: {available_run_metrics()}")
    torch.manual_seed(cfg.seed)
    data = (
        dataset
        if dataset is not None
        else load_dataset(cfg.dataset, data_dir=cfg.data_dir, seed=cfg.seed, **cfg.dataset_params)
    )
    data.validate()  # user datasets especially: NaN/inf, shapes and labels fail here, before any output
    if model is None:
        model = build_model(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes, **cfg.model_params)
    x_eval, y_eval = _eval_split(data, cfg.eval_split)
    validate_model(model)
    loss_fn = build_loss(cfg.loss)
    n = int(data.x_train.shape[0])

    inventory = algo.inventory(n=n) if algo.private else None
    calibration, ledger, noise = None, None, {}
    if inventory is not None:
        p = cfg.privacy
        calibration = calibrate(
            inventory, epsilon=p.epsilon, delta=p.delta, neighbouring=p.neighbouring, accountant=p.accountant
        )
        noise = dict(calibration.noise)
        ledger = PrivacyLedger(
            delta=p.delta,
            neighbouring=p.neighbouring,
            accountant=p.accountant,
            target_epsilon=p.epsilon,
            planned=inventory.steps_for(noise),
        )

    sources = make_sources(insecure_seed=cfg.insecure_seed)
    noise_rng, sampler_rng = sources["noise"], sources["sampler"]
    ctx = RunContext(
        model=model,
        loss_fn=loss_fn,
        x_train=data.x_train,
        y_train=data.y_train,
        engine=get_engine(cfg.engine),
        ledger=ledger,
        noise=noise,
        noise_rng=noise_rng,
        sampler_rng=sampler_rng,
        extra={"dataset": data},
    )
    algo.setup(ctx)
    total = algo.num_steps()
    eval_every = _interval(cfg.eval_every, total, 20)
    ckpt_every = _interval(cfg.checkpoint_every, total, 10)

    history: list[dict[str, float]] = []
    start_step, elapsed_before = 0, 0.0
    if resume:
        model.load_state_dict(ckpt["model"])
        algo.load_state_dict(ckpt["algorithm"])
        noise_rng.load_state_dict(ckpt["rng"]["noise"])
        sampler_rng.load_state_dict(ckpt["rng"]["sampler"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if ledger is not None:
            ledger = PrivacyLedger.from_dict(ckpt["ledger"])
            ctx.ledger = ledger
        history, start_step, elapsed_before = ckpt["history"], ckpt["step"], ckpt["elapsed_s"]
        if ckpt.get("finished"):
            return _read_record(out)

    out.mkdir(parents=True, exist_ok=True)
    base_record = {
        "privopt_version": privopt.__version__,
        "config": cfg.to_dict(),
        "algorithm": cfg.algorithm,
        "hyperparameters": algo.hyperparameters(),
        "dataset": {
            "name": data.name,
            "n_train": n,
            "n_test": int(data.x_test.shape[0]),
            "num_classes": data.num_classes,
            "meta": _jsonable_meta(data.meta),
        },
        "model": {"name": cfg.model, "parameters": sum(p.numel() for p in model.parameters())},
        # The noise/sampling randomness is secret unless the config opted into insecure_seed.
        "randomness": {
            "public_seed": cfg.seed,
            "noise_and_sampling": "seeded (insecure)"
            if cfg.insecure_seed is not None
            else "secret (AES-256-CTR, OS entropy)",
            "insecure_seed": cfg.insecure_seed,
        },
        "engine": type(ctx.engine).name,
        "total_steps": total,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    if inventory is not None:
        base_record["privacy_inventory"] = inventory.to_dict()
        base_record["calibration"] = {
            "noise_multipliers": noise,
            "epsilon_planned": calibration.epsilon,
            "accountant": calibration.accountant,
        }

    t0 = time.perf_counter()
    step = start_step

    def checkpoint(finished: bool = False) -> None:
        save_checkpoint(
            out,
            {
                "config": cfg.to_dict(),
                "step": step,
                "model": model.state_dict(),
                "algorithm": algo.state_dict(),
                # SECRET: the secure sources' keys (the checkpoint is as sensitive as the data).
                "rng": {
                    "noise": noise_rng.state_dict(),
                    "sampler": sampler_rng.state_dict(),
                    "torch": torch.get_rng_state(),
                },
                "ledger": ledger.to_dict() if ledger is not None else None,
                "history": history,
                "elapsed_s": elapsed_before + time.perf_counter() - t0,
                "finished": finished,
            },
        )

    def write_outputs(status: str, final: dict[str, float] | None = None) -> dict[str, Any]:
        record = dict(base_record)
        record["status"] = status
        record["steps_done"] = step
        record["wall_time_s"] = elapsed_before + time.perf_counter() - t0
        record["privacy"] = _privacy_section(cfg, ledger)
        record["metrics"] = final or (history[-1] if history else {})
        record["history"] = history
        _write_metrics_csv(out / "metrics.csv", history)
        _plot_curves(out / "curves.png", history, title=f"{cfg.algorithm} on {data.name}")
        atomic_write_json(out / RECORD_NAME, record)
        return record

    stop_signal = {"hit": False}

    def on_signal(signum, frame):  # finish the current step, then checkpoint and stop
        stop_signal["hit"] = True

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    bar = _progress(total, start_step, progress, desc=f"{cfg.algorithm}")
    try:
        while step < total:
            if max_steps is not None and step - start_step >= max_steps:
                checkpoint()
                return write_outputs("paused")
            logs = algo.step(step)
            step += 1
            bar.update(1)
            if step % eval_every == 0 or step == total:
                row = {"step": step, "epsilon_spent": ledger.epsilon() if ledger is not None else 0.0}
                row.update({k: float(v) for k, v in logs.items()})
                row.update(
                    evaluate(model, loss_fn, x_eval, y_eval, num_classes=data.num_classes, prefix=cfg.eval_split)
                )
                row.update(
                    _extra_metrics(cfg.metrics, "eval", model=model, loss_fn=loss_fn, data=data, record=base_record)
                )
                history.append(row)
                bar.set_postfix(
                    acc=f"{row.get(cfg.eval_split + '_accuracy', float('nan')):.3f}", eps=f"{row['epsilon_spent']:.3g}"
                )
            if step % ckpt_every == 0 and step < total:
                checkpoint()
            if stop_signal["hit"]:
                checkpoint()
                write_outputs("interrupted")
                raise RunInterrupted(f"run interrupted at step {step}/{total}; resume with --resume {out}")
    except PrivacyBudgetExceeded:
        checkpoint()
        write_outputs("budget_exhausted")
        raise
    finally:
        bar.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)

    algo.finalize()
    final = {"step": step, "epsilon_spent": ledger.epsilon() if ledger is not None else 0.0}
    final.update(evaluate(model, loss_fn, x_eval, y_eval, num_classes=data.num_classes, prefix=cfg.eval_split))
    final.update(evaluate(model, loss_fn, data.x_train, data.y_train, num_classes=data.num_classes, prefix="train"))
    record_so_far = dict(base_record, privacy=_privacy_section(cfg, ledger))
    final.update(_extra_metrics(cfg.metrics, "final", model=model, loss_fn=loss_fn, data=data, record=record_so_far))
    checkpoint(finished=True)
    return write_outputs("finished", final)


def _eval_split(data: Any, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    if split == "val":
        if data.x_val is None or data.x_val.shape[0] == 0:
            raise ConfigError("eval_split 'val' needs a validation split: set dataset_params.val_fraction > 0")
        return data.x_val, data.y_val
    return data.x_test, data.y_test


def _privacy_section(cfg: RunConfig, ledger: PrivacyLedger | None) -> dict[str, Any]:
    if ledger is None:
        return {"private": False, "epsilon_spent": None, "delta": None}
    spent = ledger.spent()
    return {
        "private": True,
        "epsilon_target": cfg.privacy.epsilon,
        "epsilon_spent": spent.epsilon,
        "delta": cfg.privacy.delta,
        "accountant": spent.accountant,
        "neighbouring": cfg.privacy.neighbouring,
        "ledger": ledger.to_dict(),
    }


def _jsonable_meta(meta: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in (meta or {}).items():
        if isinstance(v, torch.Tensor):
            continue  # per-example arrays (group ids) stay out of the record
        out[k] = v if isinstance(v, (int, float, str, bool, list, dict, type(None))) else str(v)
    return out


def _write_metrics_csv(path: Path, history: list[dict[str, float]]) -> None:
    keys: list[str] = []
    for row in history:
        keys += [k for k in row if k not in keys]
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys or ["step"])
    w.writeheader()
    for row in history:
        w.writerow(row)
    atomic_write_text(path, buf.getvalue())


def _plot_curves(path: Path, history: list[dict[str, float]], *, title: str) -> None:
    if not history:
        return
    from privopt.plots import plot_training_curves

    plot_training_curves(path, history, title=title)


def _read_record(out: Path) -> dict[str, Any]:
    import json

    return json.loads((out / RECORD_NAME).read_text())


class _NoBar:
    def update(self, n): ...
    def set_postfix(self, **kw): ...
    def close(self): ...


def _progress(total: int, initial: int, enabled: bool, *, desc: str):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", leave=False, dynamic_ncols=True)
