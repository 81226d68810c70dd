"""Evaluation and the registry of extra run metrics (the losses: :mod:`privopt.objectives.losses`).

A run metric declares whether it reads the private training data. Metrics that do (a
full-training-set gradient norm, a membership-inference attack) are computed only when the run
enables ``non_private_diagnostics`` and their values go only to ``diagnostics.NOT_PRIVATE.json``;
metrics that do not are handed a view of the dataset without the training split, so they cannot
read it by mistake, and their values are published with the test metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from privopt.errors import ConfigError
from privopt.objectives.losses import LossFn, build_loss
from privopt.registry import Registry

__all__ = [
    "RunMetric",
    "available_run_metrics",
    "build_loss",
    "compute_run_metrics",
    "evaluate",
    "get_run_metrics",
    "public_view",
    "register_run_metric",
]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_classes: int,
    prefix: str,
    chunk=2048,
    logits: torch.Tensor | None = None,
) -> dict[str, float]:
    """Loss and classification metrics of ``model`` on (x, y), keys prefixed by ``prefix``
    (``logits``: its outputs on ``x`` when the caller already has them)."""
    from privopt.eval.metrics import classification_metrics, model_logits

    logits = model_logits(model, x, chunk=chunk) if logits is None else logits
    out = {"loss": float(loss_fn(logits, y).mean())}
    out.update(classification_metrics(logits, y, num_classes=num_classes))
    # the record count is the loop's own ``<prefix>_records`` (an int), not a float column beside it
    out.pop("num_samples", None)
    return {f"{prefix}_{k}": float(v) for k, v in out.items() if isinstance(v, (int, float))}


@dataclass(frozen=True)
class RunMetric:
    """A metric computed by the loop: ``fn(model=, loss_fn=, data=, record=) -> dict``.

    Attributes:
        when: ``"eval"`` (every evaluation and at the end) or ``"final"`` (once, at the end).
        reads_private_data: True when ``fn`` reads the training split (its values are then
            non-private diagnostics); False metrics receive :func:`public_view` of the data.
    """

    name: str
    fn: Callable[..., dict[str, float]]
    when: str
    reads_private_data: bool


_RUN_METRICS: Registry[RunMetric] = Registry("run metric")


def register_run_metric(
    name: str, fn: Callable[..., dict[str, float]], *, when: str = "eval", reads_private_data: bool
) -> None:
    """Add a metric computed by the loop (select it per run with ``RunConfig.metrics``).

    Args:
        name: the name configs use.
        fn: ``fn(model=, loss_fn=, data=, record=)`` returning ``{key: float}``. ``record`` is a
            read-only mapping of the run's record so far; its ``"privacy"`` section (the exact
            epsilon spent, an accountant call) is computed only when read.
        when: ``"eval"`` runs it at every evaluation (e.g. a gradient-norm curve), ``"final"``
            once at the end (e.g. a membership-inference attack).
        reads_private_data: whether ``fn`` reads the private training data (required: there is
            no default, every metric must say). True: the run must enable
            ``non_private_diagnostics`` and the values go to ``diagnostics.NOT_PRIVATE.json`` only.

    Raises:
        ConfigError: a bad ``when`` or ``reads_private_data``, or a name another metric already took.

    Example:
        >>> register_run_metric("n_test", lambda *, data, **kw: {"n_test": len(data.y_test)},
        ...                     when="final", reads_private_data=False)
        >>> "n_test" in available_run_metrics()
        True
    """
    if when not in ("eval", "final"):
        raise ConfigError(f"run metric timing must be 'eval' or 'final', got {when!r}")
    if not isinstance(reads_private_data, bool):
        raise ConfigError(f"run metric {name!r}: reads_private_data must be True or False")
    # A taken name is refused, so no metric's reads_private_data declaration can be swapped silently
    # (the built-in ones included: they are registered first).
    _ensure_builtin()
    _RUN_METRICS.add(name, RunMetric(name, fn, when, reads_private_data))


_BUILTIN_REGISTERED = False


def _ensure_builtin() -> None:
    # The built-in metrics live in privopt.eval (below this layer); they are registered here, once
    # (docs/privacy.md names them).
    global _BUILTIN_REGISTERED
    if _BUILTIN_REGISTERED:
        return
    _BUILTIN_REGISTERED = True
    from privopt.eval.dro_metrics import grad_norm_metric, mia_metric
    from privopt.eval.sosp import sosp_metric

    # The released model on the public test split: public. On the training split: diagnostics only.
    register_run_metric("sosp", sosp_metric("test"), when="final", reads_private_data=False)
    register_run_metric("sosp_train", sosp_metric("train"), when="final", reads_private_data=True)
    register_run_metric("grad_norm", grad_norm_metric, when="eval", reads_private_data=True)
    register_run_metric("mia", mia_metric, when="final", reads_private_data=True)


def available_run_metrics() -> list[str]:
    """Names of the registered run metrics."""
    _ensure_builtin()
    return list(_RUN_METRICS.names())


def get_run_metrics(names: Sequence[str]) -> list[RunMetric]:
    """The registered metrics named in a config; unknown names fail with the list of known ones."""
    _ensure_builtin()
    unknown = sorted(set(names) - set(_RUN_METRICS.names()))
    if unknown:
        raise ConfigError(f"unknown run metric(s) {unknown}; available: {available_run_metrics()}")
    return [_RUN_METRICS.lookup(n) for n in names]


def public_view(data: Any) -> SimpleNamespace:
    """The dataset without its private splits (training and validation): what public metrics see."""
    return SimpleNamespace(
        name=data.name,
        n_train=int(data.y_train.shape[0]),
        num_classes=data.num_classes,
        input_shape=tuple(data.input_shape),
        x_test=data.x_test,
        y_test=data.y_test,
        g_test=getattr(data, "g_test", None),
    )


def compute_run_metrics(
    metrics: Sequence[RunMetric], *, final: bool, private: bool, data: Any, **kw: Any
) -> dict[str, float]:
    """Values of the metrics due now (``final``: every metric; else the ``"eval"`` ones) that read
    (``private=True``) or do not read (``private=False``) the training data."""
    out: dict[str, float] = {}
    view = data if private else public_view(data)
    for m in metrics:
        if m.reads_private_data == private and (final or m.when == "eval"):
            out.update({k: float(v) for k, v in m.fn(data=view, **kw).items()})
    return out
