"""Resuming a run: what must match, and restoring the state.

A resumed run keeps the config it started with; data and model are rebuilt and checked against
fingerprints kept in the (secret) checkpoint, so a resume never silently continues on other data.
A run made through the Python API with its own ``Dataset``, ``nn.Module`` or loss cannot be rebuilt
from its config: resuming it requires passing the same objects again (a custom loss is checked
too: a resume replays the run's noise, which must fall on the same sums). Fingerprints are hashes of
the training data, so they live only in the checkpoint, never in public outputs (a hash lets
anyone test a guess of the whole dataset).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import torch
from torch import nn

from privopt.config import RunConfig
from privopt.errors import ConfigError, DataError, ModelError
from privopt.training.builder import Run

__all__ = [
    "CHECKPOINT_FORMAT",
    "data_fingerprint",
    "loss_fingerprint",
    "model_fingerprint",
    "provenance",
    "resume_config",
    "restore",
]

CHECKPOINT_FORMAT = 2
_SPLITS = ("x_train", "y_train", "g_train", "x_val", "y_val", "g_val", "x_test", "y_test", "g_test")


def data_fingerprint(data: Any) -> str:
    """Hash of every split's values, shapes and dtypes (SECRET: identifies the training data), and
    of the number of groups: the worst-group algorithms size their draws and weights by it."""
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((data.num_classes, tuple(data.input_shape))).encode())
    groups = int(getattr(data, "num_groups", 0) or 0)
    if groups:  # only for data with groups: the fingerprints of other data are unchanged
        h.update(repr(("num_groups", groups)).encode())
    for name in _SPLITS:
        t = getattr(data, name, None)
        h.update(name.encode())
        if t is not None:
            h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        if t is not None and t.numel():
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_fingerprint(model: nn.Module) -> str:
    """Hash of a model's architecture: class, its modules' printed structure and settings (layer
    kinds, activations, strides: ReLU and Tanh between the same layers have the same parameters),
    parameter and buffer names, shapes and dtypes."""
    items = [type(model).__module__ + "." + type(model).__qualname__, repr(model)]
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        items.append(f"{name}:{tuple(t.shape)}:{t.dtype}")
    return hashlib.blake2b("\n".join(items).encode(), digest_size=20).hexdigest()


def _code_parts(code: Any) -> list[Any]:
    """A code object's bytecode, names and constants, nested code objects included."""
    parts: list[Any] = [code.co_code, code.co_names, code.co_varnames]
    for c in code.co_consts:
        parts += _code_parts(c) if hasattr(c, "co_code") else [repr(c)]
    return parts


def _value_parts(v: Any, depth: int = 0) -> list[Any]:
    if isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        return [str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()]
    if isinstance(v, (str, int, float, bool, bytes, type(None))):
        return [repr(v)]
    if hasattr(v, "tobytes") and hasattr(v, "dtype") and hasattr(v, "shape"):  # a NumPy array
        return [str(v.dtype), tuple(v.shape), v.tobytes()]
    if depth < 3 and isinstance(v, (list, tuple)):
        return [len(v), *(x for item in v for x in _value_parts(item, depth + 1))]
    if isinstance(v, nn.Module):  # e.g. the trained model itself: its architecture, not its weights
        return [type(v).__qualname__, repr(v)]
    if depth < 3 and callable(v):
        return _callable_parts(v, depth + 1)
    return [type(v).__module__ + "." + type(v).__qualname__]


def _callable_parts(fn: Any, depth: int = 0) -> list[Any]:
    if isinstance(fn, nn.Module):
        state = [x for t in fn.state_dict().values() for x in _value_parts(t)]
        return [type(fn).__qualname__, repr(fn), *state]
    if isinstance(fn, functools.partial):
        return [
            "partial",
            *_callable_parts(fn.func, depth),
            *_value_parts((fn.args, tuple(sorted(fn.keywords.items())))),
        ]
    code = getattr(fn, "__code__", None)
    if code is None:  # a builtin or another callable: its name
        return [getattr(fn, "__module__", ""), getattr(fn, "__qualname__", type(fn).__qualname__)]
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if c.cell_contents is not fn]
    return [*_code_parts(code), *_value_parts(tuple(fn.__defaults__ or ()), depth), *_value_parts(tuple(cells), depth)]


def loss_fingerprint(loss: Any) -> str:
    """Hash of a loss function's code (bytecode, names, constants, nested functions), defaults and
    captured values, or of a loss module's class, settings and state: a resumed run replays the
    interrupted run's noise, so it must compute the same sums (best effort: what a function
    reads from global variables is not covered)."""
    parts = _callable_parts(loss)
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
    return h.hexdigest()


def provenance(run: Run) -> dict[str, Any]:
    """Where the run's data, model and loss came from, with fingerprints (kept in the checkpoint only;
    a loss named in the config is checked with the config)."""
    source = run.provenance.get("loss", "config")
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
        "loss": {"source": source, "fingerprint": loss_fingerprint(run.loss_fn) if source == "api" else None},
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
    saved = prov.get("loss", {}).get("fingerprint")
    if saved is not None and loss_fingerprint(run.loss_fn) != saved:
        raise ConfigError(
            "the loss function differs from the one this run was trained with (its code, settings or captured "
            "values changed): a resume replays the run's noise, so it must compute the same sums; pass the same loss"
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
