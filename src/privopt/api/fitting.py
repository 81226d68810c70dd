"""``privopt.fit``: any privopt algorithm on your model, loss and data, in one call.

The algorithms that need more than one noisy query per step (gradient differences at two points,
SPIDER refreshes, dual-variable releases) cannot be written as "clip, add noise, step" inside a
user's loop; :func:`fit` runs them on the shared training loop instead (:func:`privopt.training.train`):
the same validation, exact calibration, ledger, budget guard, failure records and checkpoints as
``privopt train``. See ``docs/api.md``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from privopt.api.guards import check_unclaimed, claim
from privopt.api.losses import per_sample_loss
from privopt.errors import ConfigError, close_name

__all__ = ["fit"]


# fit's arguments that are RunConfig options of the same name.
_OPTIONS = ("engine", "seed", "insecure_seed", "data_dir", "model_params", "logit_adjustment", "dataset_params")
_OPTIONS += ("metrics", "non_private_diagnostics")


def _config(model: Any, dataset: Any, algorithm: str, privacy: dict, params: dict, options: dict):
    """fit's RunConfig (validated) and whether the algorithm is private."""
    from privopt.config import RunConfig

    private = _check_algorithm(algorithm, epsilon=privacy["epsilon"], delta=privacy["delta"])
    if not isinstance(algorithm, str):
        raise ConfigError(f"algorithm must be a registered name (privopt list), got {algorithm!r}")
    for key in ("logit_adjustment", "dataset_params"):
        options[key] = dict(options[key] or {})
    options["metrics"] = _names(options["metrics"])
    cfg = RunConfig.from_dict(
        {
            "algorithm": algorithm,
            "algorithm_params": params,
            "dataset": dataset if isinstance(dataset, str) else getattr(dataset, "name", "custom"),
            "model": model if isinstance(model, str) else "mlp",  # unused: the module is passed in
            "model_params": _model_params(model, options.pop("model_params")),
            "privacy": {k: v for k, v in privacy.items() if k != "delta" or v is not None},  # None: the default
            **options,
        }
    )
    return cfg, private


def _model_params(model: Any, params: dict[str, Any] | None) -> dict[str, Any]:
    if params and not isinstance(model, str):
        raise ConfigError(
            "model_params configure a registered model (model='name'); build your nn.Module with its options"
        )
    return dict(params or {})


def _names(metrics: Any) -> Any:
    """A list of names as RunConfig takes them (a tuple too); anything else is left for its check to refuse."""
    if metrics is None:
        return []
    return list(metrics) if isinstance(metrics, tuple) else metrics


def _check_algorithm(algorithm: Any, *, epsilon: Any, delta: Any) -> bool:
    from privopt.algorithms import available_algorithms

    algos = available_algorithms()
    if algorithm not in algos:
        hint = close_name(algorithm, sorted(algos)) if isinstance(algorithm, str) else ""
        raise ConfigError(f"unknown algorithm {algorithm!r}{hint}; available: {', '.join(sorted(algos))}")
    private = algos[algorithm].private
    if private and (epsilon is None or delta is None):
        raise ConfigError(f"algorithm {algorithm!r} is private: pass epsilon= and delta= (delta below 1/n)")
    if not private and (epsilon is not None or delta is not None):
        raise ConfigError(f"algorithm {algorithm!r} is not private: it takes no epsilon/delta")
    return private


def _claimed_run(cfg, private: bool, model: Any, **train: Any) -> dict[str, Any]:
    """:func:`_train`, refused for a module already made private (its ε would be hidden by a fresh
    budget); a module a private fit trained (also partly: interrupted) is marked as private."""
    if not isinstance(model, nn.Module):
        return _train(cfg, model=model, **train)
    check_unclaimed(model, None)
    if not private:
        return _train(cfg, model=model, **train)
    before = [p._version for p in model.parameters()]  # bumped by every in-place update: "was it trained?"
    try:
        record = _train(cfg, model=model, **train)
    except BaseException:
        if [p._version for p in model.parameters()] != before:  # trained, then failed: its updates spent ε
            claim(model, None, lambda: "by a privopt.fit that failed or was interrupted after training began")
        raise
    spent = record["privacy"]["epsilon_spent"]
    claim(model, None, lambda: f"by privopt.fit, which spent epsilon={spent:.4g}")
    return record


def fit(
    *,
    model: nn.Module | str,
    dataset: Any,
    loss: Any = None,
    algorithm: str = "dp-sgd",
    epsilon: float | None = None,
    delta: float | None = None,
    out_dir: str | Path | None = None,
    engine: str = "auto",
    accountant: str = "auto",
    allow_large_delta: bool = False,
    insecure_seed: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
    data_dir: str | None = None,
    logit_adjustment: dict[str, Any] | None = None,
    model_params: dict[str, Any] | None = None,
    dataset_params: dict[str, Any] | None = None,
    metrics: list[str] | None = None,
    non_private_diagnostics: bool = False,
    **params: Any,
) -> dict[str, Any]:
    """Train ``model`` on ``dataset`` with a privopt algorithm; returns the run record.

    Args:
        model, model_params: your ``nn.Module`` (trained in place), or a registered model name and its options.
        dataset, dataset_params, data_dir: a ``Dataset`` with a (public) test split, or a registered name, loaded
            with ``dataset_params`` (e.g. ``dataset="csv"``: its file and schema, docs/data.md; files in data_dir).
        loss: ``None`` (cross-entropy), ``"logistic"`` (one logit, labels 0/1), a torch loss module or a function.
        algorithm: a registered algorithm name, e.g. ``"dp-sgd"``, ``"dp-double-spider"`` (docs/algorithms/).
        epsilon, delta: the target; required for a private algorithm, δ below 1/n (or ``allow_large_delta``).
        out_dir: where the run's outputs go; default: a temporary folder, deleted when ``fit`` returns.
        engine, accountant: per-example gradient engine and accountant (``"auto"`` each).
        seed, insecure_seed: public seed (model init, data selection); noise/sampling seed (NOT private).
        progress: ``None`` (auto): a bar if stderr is a terminal and training lasts 3 s; ``True``/``False``: on/off.
        logit_adjustment: e.g. ``{"noise_ratio": 10.0}``: predict with ``logits − log π`` (docs/data.md).
        metrics, non_private_diagnostics: run metrics by name, as in a config; one reading the training data
            (``"mia"``) needs this flag and ``out_dir``: its values go only to ``diagnostics.NOT_PRIVATE.json``.
        **params: the algorithm's hyper-parameters (``lr``, ``epochs``, ``clip``, ...; unknown names are refused).

    Returns the run record (``record.json``: ε spent, metrics, calibration, ledger). Raises ConfigError, DataError,
    ModelError for bad arguments, before training; PrivacyBudgetExceeded, RunDiverged after a record of the ε spent.

    Example:
        >>> import privopt, torch
        >>> from privopt.data import Dataset
        >>> x = torch.rand(600, 4, generator=torch.Generator().manual_seed(0))
        >>> y = (x[:, 0] > 0.5).long()
        >>> data = Dataset.from_tensors(x[:500], y[:500], x_test=x[500:], y_test=y[500:], num_classes=2)
        >>> record = privopt.fit(model=torch.nn.Linear(4, 2), dataset=data, algorithm="dp-double-spider", epsilon=1.0,
        ...                      delta=1e-4, accountant="rdp", epochs=1, q=4, N1=250, N2=50, N3=250, N4=50)
        >>> record["status"], record["privacy"]["epsilon_spent"] <= 1.0
        ('finished', True)
    """
    given = dict(locals())  # the arguments by name (first: nothing else is bound yet)
    privacy = {k: given[k] for k in ("epsilon", "delta", "allow_large_delta", "accountant")}
    cfg, private = _config(model, dataset, algorithm, privacy, params, {k: given[k] for k in _OPTIONS})
    return _claimed_run(cfg, private, model, out_dir=out_dir, progress=progress, dataset=dataset, loss=loss)


def _train(cfg, *, out_dir, progress: bool | None, model: Any, dataset: Any, loss: Any) -> dict[str, Any]:
    from privopt.training import train

    objects = {
        "dataset": None if isinstance(dataset, str) else dataset,
        "model": None if isinstance(model, str) else model,
        "loss": None if loss is None else per_sample_loss(loss),
    }
    if out_dir is not None:
        return train(cfg, out_dir=out_dir, progress=progress, **objects)
    if cfg.non_private_diagnostics:  # the file would be deleted with the temporary folder, unread
        raise ConfigError("non_private_diagnostics=True writes diagnostics.NOT_PRIVATE.json to out_dir: pass out_dir=")
    cfg.plots = False  # nobody would see them
    with tempfile.TemporaryDirectory(prefix="privopt-fit-") as tmp:
        return train(cfg, out_dir=Path(tmp) / "run", progress=progress, **objects)
