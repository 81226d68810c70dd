"""Resuming a run: what must match, and restoring the state.

A resumed run keeps the config it started with; data and model are rebuilt and checked against
fingerprints kept in the (secret) checkpoint, so a resume never silently continues on other data.
A run made through the Python API with its own ``Dataset`` or ``nn.Module`` cannot be rebuilt
from its config: resuming it requires passing the same objects again. Fingerprints are hashes of
the training data, so they live only in the checkpoint, never in public outputs (a hash lets
anyone test a guess of the whole dataset).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from privopt.config import RunConfig
from privopt.errors import ConfigError, DataError, ModelError
from privopt.training.builder import Run

__all__ = ["CHECKPOINT_FORMAT", "data_fingerprint", "model_fingerprint", "provenance", "resume_config", "restore"]

CHECKPOINT_FORMAT = 2
_SPLITS = ("x_train", "y_train", "g_train", "x_val", "y_val", "g_val", "x_test", "y_test", "g_test")


def data_fingerprint(data: Any) -> str:
    """Hash of every split's values, shapes and dtypes (SECRET: identifies the training data)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((data.num_classes, tuple(data.input_shape))).encode())
    for name in _SPLITS:
        t = getattr(data, name, None)
        h.update(name.encode())
        if t is not None:
            h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        if t is not None and t.numel():
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_fingerprint(model: nn.Module) -> str:
    """Hash of a model's architecture: class, parameter and buffer names, shapes and dtypes."""
    items = [type(model).__module__ + "." + type(model).__qualname__]
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        items.append(f"{name}:{tuple(t.shape)}:{t.dtype}")
    return hashlib.blake2b("\n".join(items).encode(), digest_size=20).hexdigest()


def provenance(run: Run) -> dict[str, Any]:
    """Where the run's data and model came from, with fingerprints (kept in the checkpoint only)."""
    return {
        "dataset": {
            "source": run.provenance["dataset"],
            "name": run.data.name,
            "fingerprint": data_fingerprint(run.data),
        },
        "model": {
            "source": run.provenance["model"],
            "class": type(run.model).__qualname__,
            "fingerprint": model_fingerprint(run.model),
        },
        "loss": {"source": run.provenance.get("loss", "config")},
    }


def _diff(saved: Any, given: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(given, dict):
        out = []
        for k in sorted(set(saved) | set(given), key=str):
            out += _diff(saved.get(k), given.get(k), f"{prefix}{k}.")
        return out
    return [] if saved == given else [f"{prefix[:-1]} ({saved!r} -> {given!r})"]


def resume_config(ckpt: dict[str, Any], cfg: RunConfig | None) -> RunConfig:
    """The run's own config; a different ``cfg`` is refused, naming every key it would change."""
    if ckpt.get("format") != CHECKPOINT_FORMAT or "record" not in ckpt:
        raise DataError(
            "this checkpoint was written by another version of privopt and cannot be resumed; start a new run"
        )
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
    """A run made with its own dataset/model/loss through the Python API needs them again."""
    prov = ckpt.get("provenance", {})
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


def verify(ckpt: dict[str, Any], run: Run) -> None:
    """The rebuilt data and model must be the ones the run was trained on."""
    prov = ckpt["provenance"]
    if data_fingerprint(run.data) != prov["dataset"]["fingerprint"]:
        raise DataError(
            f"the dataset differs from the one this run was trained on ({prov['dataset']['name']!r}): "
            "a resume must continue on exactly the same data"
        )
    if model_fingerprint(run.model) != prov["model"]["fingerprint"]:
        raise ModelError(
            f"the model's architecture differs from the one this run trained ({prov['model']['class']}); "
            "pass the same architecture to resume"
        )


def restore(run: Run, ckpt: dict[str, Any]) -> None:
    """Load the model, the algorithm's state and the generators from a checkpoint."""
    try:
        run.model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ModelError(f"cannot load the checkpoint's parameters into the model: {str(e).splitlines()[0]}") from None
    run.algo.load_state_dict(ckpt["algorithm"])
    run.sources["noise"].load_state_dict(ckpt["rng"]["noise"])
    run.sources["sampler"].load_state_dict(ckpt["rng"]["sampler"])
    torch.set_rng_state(ckpt["rng"]["torch"])  # the ledger was restored by build_run(ledger_state=...)
