"""Resuming a run: what must match, and restoring the state.

A resumed run keeps the config it started with and replays the interrupted run's noise, which must
fall on the same sums: data, model (structure, code, attributes, hooks, the values its code reads),
a custom loss, the algorithm's, engine's and run metrics' code are rebuilt and checked against
fingerprints kept in the (secret) checkpoint (:mod:`privopt.training.fingerprints`; one of another
format is refused, naming it), and it runs on the CPU thread count the run recorded
(:func:`recorded_threads`, which warns when that oversubscribes the usable cores); the public
facts its record states (calibration, plan) against the checkpointed record, and the privopt, torch
and Python versions against those that wrote it (``allow_version_change`` continues under others,
from a paused or interrupted checkpoint only, and the record says so). A run made through the Python
API with its own ``Dataset``, ``nn.Module`` or loss cannot be rebuilt from its config: resuming it
requires passing the same objects again. Fingerprints are hashes of the training data, so they live
only in the checkpoint, never in public outputs (a hash lets anyone test a guess of the whole dataset).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

import privopt
from privopt.config import RunConfig
from privopt.errors import ConfigError, DataError, ModelError
from privopt.training.builder import Run
from privopt.training.fingerprints import (
    code_fingerprint,
    data_fingerprint,
    items_fingerprint,
    loss_fingerprint,
    metrics_fingerprint,
    model_fingerprint,
    model_items,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "data_fingerprint",
    "loss_fingerprint",
    "model_fingerprint",
    "check_versions",
    "code_fingerprint",
    "provenance",
    "recorded_threads",
    "require_objects",
    "resume_config",
    "restore",
    "rng_state",
    "verify",
    "versions",
]

# 3: the provenance holds the versions and the code fingerprints; the model's covers its code and attributes.
# 4: the model's fingerprint is one hash per item a resume names (items_fingerprint), covering the
# module-level values and attribute chains its code reads; run metrics' code; a GPU's generator.
CHECKPOINT_FORMAT = 4
# A finished run's checkpoint of these formats still has its outputs written again (nothing is checked).
_OUTPUTS_ONLY_FORMATS = (3,)


def versions() -> dict[str, str]:
    """What computes a run's sums and draws its noise: privopt, torch, and the Python minor version
    (the code fingerprints read bytecode, which another minor version compiles differently)."""
    return {"privopt": privopt.__version__, "torch": torch.__version__, "python": "{}.{}".format(*sys.version_info[:2])}


def provenance(run: Run) -> dict[str, Any]:
    """Where the run's data, model and loss came from, with fingerprints (kept in the checkpoint only;
    a loss named in the config is checked with the config), the versions and the code that computes it."""
    source, items = run.provenance.get("loss", "config"), model_items(run.model)
    return {
        "dataset": {
            "source": run.provenance["dataset"],
            "name": run.data.name,
            "fingerprint": data_fingerprint(run.data),
        },
        "model": {
            "source": run.provenance["model"],
            "class": type(run.model).__qualname__,
            "fingerprint": items_fingerprint(items),
            "items": items,  # an error names those that changed
        },
        "loss": {"source": source, "fingerprint": loss_fingerprint(run.loss_fn) if source == "api" else None},
        "versions": versions(),
        "code": {
            "algorithm": code_fingerprint(run.algo),
            "engine": code_fingerprint(run.ctx.engine),
            "metrics": metrics_fingerprint(run.metrics),
        },
    }


def _diff(saved: Any, given: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(given, dict):
        out = []
        for k in sorted(set(saved) | set(given), key=str):
            out += _diff(saved.get(k), given.get(k), f"{prefix}{k}.")
        return out
    return [] if saved == given else [f"{prefix[:-1]} ({saved!r} -> {given!r})"]


def _check_format(ckpt: dict[str, Any]) -> None:
    """A checkpoint of another format is refused, naming it and the privopt that wrote it: its
    fingerprints were taken otherwise, so comparing them would blame the model, loss or code for it."""
    fmt, record = ckpt.get("format"), ckpt.get("record")
    if isinstance(record, dict) and (
        fmt == CHECKPOINT_FORMAT or (fmt in _OUTPUTS_ONLY_FORMATS and ckpt.get("status") == "finished")
    ):
        return
    record = record if isinstance(record, dict) else {}
    newer = isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > CHECKPOINT_FORMAT
    wrote = f"privopt {record['privopt_version']}, " if "privopt_version" in record else ""
    what = f"checkpoint format {fmt!r}" if "format" in ckpt else "an unnumbered checkpoint format"
    raise DataError(
        f"this checkpoint was written by {'a newer' if newer else 'an earlier'} version of privopt ({wrote}{what}); "
        f"this privopt ({privopt.__version__}) resumes checkpoint format {CHECKPOINT_FORMAT} only, whose "
        "fingerprints cover what a resume checks (the model's code, attributes and the values its code reads, run "
        "metrics' code, a GPU's generator), so it cannot check that the run would continue the same way: "
        f"start a new run{'' if newer else ' (or resume this one with the privopt that wrote it)'}"
    )


def resume_config(ckpt: dict[str, Any], cfg: RunConfig | None) -> RunConfig:
    """The run's own config; a different ``cfg`` is refused, naming every key it would change."""
    _check_format(ckpt)
    saved = RunConfig.from_dict(ckpt["config"])
    if cfg is not None:
        changes = _diff(saved.to_dict(), cfg.validate().to_dict())
        if changes:
            raise ConfigError(
                "a resumed run keeps the config it started with; cannot honour: "
                + "; ".join(changes)
                + " (start a new run in another directory to change them)"
            )
    return saved


def require_objects(ckpt: dict[str, Any], *, dataset: Any, model: Any, loss: Any = None) -> None:
    """A run made with its own dataset/model/loss through the Python API needs them again; one that
    built them from its config rebuilds them (another object passed in would replace them)."""
    prov = ckpt.get("provenance", {})
    for part, given in (("dataset", dataset), ("model", model), ("loss", loss)):
        if given is not None and prov.get(part, {}).get("source") == "config":
            raise ConfigError(
                f"this run built its {part} from its config, and a resume rebuilds it from there (checked against "
                f"the checkpoint): resume it without {part}=..."
            )
    if prov.get("loss", {}).get("source") == "api" and loss is None:
        raise ConfigError(
            "this run was trained with its own loss function passed through the Python API, which its config "
            "cannot rebuild; resume it from Python with the same one: train(None, out_dir=..., resume=True, loss=...)"
        )
    ds, md = prov.get("dataset", {}), prov.get("model", {})
    if ds.get("source") == "api" and dataset is None:
        raise ConfigError(
            f"this run was trained on a dataset passed through the Python API ({ds.get('name')!r}), which its "
            "config cannot rebuild; resume it from Python with the same one: "
            "train(None, out_dir=..., resume=True, dataset=..., model=...)"
        )
    if md.get("source") == "api" and model is None:
        raise ConfigError(
            f"this run trained its own model passed through the Python API ({md.get('class')}), which its config "
            "cannot rebuild; resume it from Python with the same architecture: "
            "train(None, out_dir=..., resume=True, model=..., dataset=...)"
        )


def check_versions(ckpt: dict[str, Any], *, published: dict[str, Any] | None, allow_change: bool) -> list[dict]:
    """The record's ``version_changes``: those of the run so far, and this resume's, if it changes
    versions. Refused unless ``allow_change``, and then still refused when the run may have published
    what it computed after its last checkpoint (``published``: the record on disk)."""
    changes = list(ckpt["record"].get("version_changes", []))
    saved, now = ckpt["provenance"]["versions"], versions()
    if saved == now:
        return changes
    diff = "; ".join(f"{k} {saved.get(k)} in the checkpoint, {now[k]} here" for k in now if saved.get(k) != now[k])
    if not allow_change:
        raise ConfigError(
            f"this run was checkpointed under other versions ({diff}): a resume replays the run's noise, which "
            "must fall on the same sums, and another version may compute other sums or draw other noise; resume "
            "it where it started, or pass allow_version_change=True (CLI: --allow-version-change) to continue "
            "anyway, which the record then states"
        )
    stale = published is not None and (published.get("status"), published.get("steps_done")) != (
        ckpt["status"],
        ckpt["step"],
    )
    if ckpt["status"] not in ("paused", "interrupted") or stale:
        raise ConfigError(
            f"allow_version_change cannot be honoured ({diff}): this run's last checkpoint (status "
            f"{ckpt['status']!r}, step {ckpt['step']}) is older than what the run may have published after it "
            "(a crash or a failure), and re-computing those steps under another version would publish other "
            "values with the same noise, not accounted in epsilon; resume it under the versions it started with"
        )
    return [*changes, {"at_step": ckpt["step"], "from": saved, "to": now}]


def _check_model(saved: dict[str, Any], model: Any) -> None:
    """The model must be the one the run trained; the error names what changed (names, never values)."""
    items = model_items(model)
    if items_fingerprint(items) == saved["fingerprint"]:
        return
    before = saved.get("items", {})
    changed = sorted(k for k in set(before) | set(items) if before.get(k) != items.get(k))
    listed = "; ".join(changed[:8]) + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "")
    raise ModelError(
        f"the model's architecture differs from the one this run trained ({saved['class']}) in: {listed or '?'}. "
        "Its structure, code (forward, its class, hooks) or settings (plain attributes) changed, or a value its "
        "code reads: a resume replays the run's noise, so it must compute the same sums; pass the same one"
    )


def verify(ckpt: dict[str, Any], run: Run) -> None:
    """The rebuilt data, model, loss and code must be the ones the run was trained with, and the run
    must state what its checkpointed record states (calibration, plan, hyper-parameters)."""
    prov = ckpt["provenance"]
    if data_fingerprint(run.data) != prov["dataset"]["fingerprint"]:
        raise DataError(
            f"the dataset differs from the one this run was trained on ({prov['dataset']['name']!r}): "
            "a resume must continue on exactly the same data"
        )
    _check_model(prov["model"], run.model)
    saved = prov.get("loss", {}).get("fingerprint")
    if saved is not None and loss_fingerprint(run.loss_fn) != saved:
        raise ConfigError(
            "the loss function differs from the one this run was trained with (its code, settings or captured "
            "values changed): a resume replays the run's noise, so it must compute the same sums; pass the same loss"
        )
    for part, obj in (("algorithm", run.algo), ("engine", run.ctx.engine)):
        if code_fingerprint(obj) != prov["code"][part]:
            raise ConfigError(
                f"the code of the {part} ({type(obj).__qualname__}) differs from the one this run was trained "
                "with: a resume replays the run's noise, so it must compute the same sums; resume with the same code"
            )
    saved = prov["code"].get("metrics")  # absent from checkpoints written before metrics were checked
    if (saved is None and run.metrics) or (saved is not None and metrics_fingerprint(run.metrics) != saved):
        raise ConfigError(
            f"the code of the run metrics {[m.name for m in run.metrics]} differs from the one this run was trained "
            "with (or its checkpoint, written by an earlier privopt, does not record it): a resumed run publishes "
            "their values beside the earlier ones; resume with the same code, or start a new run"
        )
    if torch.device(run.cfg.device).type == "cuda" and "cuda" not in ckpt["rng"]:
        raise ConfigError(
            f"this run trains on {run.cfg.device!r} but its checkpoint, written by an earlier privopt, holds no state "
            "of that device's generator (a model's dropout draws from it): it cannot continue the same run; start "
            "a new run"
        )
    _check_record(ckpt["record"], run)


# The public facts of a record that a resume must reproduce (not the environment it runs in).
_STATIC = ("config", "hyperparameters", "dataset", "model", "engine", "total_steps", "randomness")
_STATIC += ("privacy_inventory", "calibration", "released", "prediction")


def _check_record(saved: dict[str, Any], run: Run) -> None:
    from privopt.training.outputs import base_record

    now = base_record(run)
    changes = _diff({k: saved.get(k) for k in _STATIC}, {k: now.get(k) for k in _STATIC})
    if changes:
        raise ConfigError(
            "the rebuilt run differs from the checkpointed one in what its record states: "
            + "; ".join(changes)
            + " (the code that computes them changed?); resume it with the code it started with"
        )


def rng_state(run: Run) -> dict[str, Any]:
    """The generators' states (SECRET: the secure sources' keys): noise, sampler, torch's CPU
    generator (public randomness) and, for a run on a GPU, that device's (a model's dropout there)."""
    state = {k: run.sources[k].state_dict() for k in ("noise", "sampler")} | {"torch": torch.get_rng_state()}
    device = torch.device(run.cfg.device)
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore(run: Run, ckpt: dict[str, Any]) -> None:
    """Load the model, the algorithm's state and the generators from a checkpoint."""
    try:
        run.model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ModelError(f"cannot load the checkpoint's parameters into the model: {str(e).splitlines()[0]}") from None
    run.algo.load_state_dict(ckpt["algorithm"])
    rng = ckpt["rng"]
    run.sources["noise"].load_state_dict(rng["noise"])
    run.sources["sampler"].load_state_dict(rng["sampler"])
    torch.set_rng_state(rng["torch"])  # the ledger was restored by build_run(ledger_state=...)
    if "cuda" in rng:  # only on a GPU (verify refused a GPU run's checkpoint without it)
        torch.cuda.set_rng_state(rng["cuda"], torch.device(run.cfg.device))


@contextlib.contextmanager
def recorded_threads(ckpt: dict[str, Any]) -> Iterator[None]:
    """Run the resumed steps on the torch CPU thread count the run recorded (the caller's count is
    back afterwards): CPU kernels split their sums by thread count, so another count rounds them
    otherwise, and a re-computed release would differ from the published one under the same noise."""
    threads = ckpt["record"].get("environment", {}).get("threads")
    before = torch.get_num_threads()
    if isinstance(threads, int) and threads >= 1:
        _warn_oversubscribed(threads)
    if not isinstance(threads, int) or threads < 1 or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _warn_oversubscribed(threads: int) -> None:
    """One line on stderr when the recorded thread count, in each of the worker processes this one
    runs beside, asks for more threads than there are usable cores: oversubscribed CPU threads wait
    for each other (a busy 2-core machine ran such a resume about 10x slower)."""
    from privopt.cores import pool_jobs, usable_cores

    jobs, cores = pool_jobs(), usable_cores()
    if threads * jobs <= cores:
        return
    each = f" in each of {jobs} worker processes ({threads * jobs} in all)" if jobs > 1 else ""
    print(
        f"privopt: warning: this resume runs on the {threads} CPU threads the run recorded{each}, more than the "
        f"{cores} usable cores here, which can make it many times slower; it keeps that count because another one "
        "rounds the sums otherwise (to train on fewer threads, start a new run)",
        file=sys.stderr,
    )
