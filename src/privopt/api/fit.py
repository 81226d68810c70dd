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

from privopt.api.losses import per_sample_loss
from privopt.errors import ConfigError

__all__ = ["fit"]


def _config(*, model: Any, dataset: Any, algorithm: str, privacy: dict, params: dict, options: dict):
    from privopt.config import RunConfig

    if not isinstance(algorithm, str):
        raise ConfigError(f"algorithm must be a registered name (privopt list), got {algorithm!r}")
    return RunConfig.from_dict(
        {
            "algorithm": algorithm,
            "algorithm_params": params,
            "dataset": dataset if isinstance(dataset, str) else getattr(dataset, "name", "custom"),
            "model": model if isinstance(model, str) else "mlp",  # unused: the module is passed in
            "privacy": privacy,
            **options,
        }
    )


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
    progress: bool = False,
    data_dir: str | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Train ``model`` on ``dataset`` with a privopt algorithm; returns the run record.

    Args:
        model: your ``nn.Module`` (trained in place) or a registered model name (``privopt list``).
        dataset: a :class:`privopt.data.Dataset` (with a test split, which is public: the
            released model is evaluated on it) or a registered dataset name.
        loss: ``None`` (cross-entropy), a torch loss module (used with ``reduction="none"``) or
            a callable returning one loss per example.
        algorithm: a registered algorithm name, e.g. ``"dp-sgd"``, ``"dp-double-spider"``,
            ``"dp-svrg"`` (docs/algorithms/).
        epsilon, delta: the target; required for a private algorithm, δ below 1/n.
        out_dir: where the run's outputs go (``record.json``, ``model.pt``, the SECRET
            ``checkpoint.pt``, ...); default: a temporary folder, deleted when ``fit`` returns.
        engine: per-example gradient engine (``"auto"``, ``"vmap"``, ``"ghost"``).
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``.
        allow_large_delta: accept δ ≥ 1/n.
        insecure_seed: seed the noise and sampling: reproducible, NOT private.
        seed: public seed (model initialisation when ``model`` is a name, data selection).
        progress: progress output while training.
        data_dir: folder of the original files when ``dataset`` is a name that needs them.
        **params: the algorithm's hyper-parameters (``lr``, ``epochs``, ``batch_size``, ``clip``, ...;
            unknown names are refused).

    Returns:
        The run record (what ``record.json`` holds): ``record["privacy"]["epsilon_spent"]``,
        ``record["metrics"]["test_accuracy"]``, the calibration and the ledger, ...

    Raises:
        ConfigError, DataError, ModelError: invalid arguments, before training starts.
        PrivacyBudgetExceeded, RunDiverged: after writing a record with the ε spent.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import privopt
        >>> from privopt.data import Dataset
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(600, 4, generator=g)
        >>> y = (x[:, 0] > 0.5).long()
        >>> data = Dataset.from_tensors(x[:500], y[:500], x_test=x[500:], y_test=y[500:], num_classes=2)
        >>> record = privopt.fit(model=nn.Linear(4, 2), dataset=data, algorithm="dp-double-spider",
        ...                      epsilon=1.0, delta=1e-4, accountant="rdp",
        ...                      epochs=1, q=4, N1=250, N2=50, N3=250, N4=50)
        >>> record["status"], record["privacy"]["epsilon_spent"] <= 1.0
        ('finished', True)
    """
    from privopt.algorithms import available_algorithms
    from privopt.training import train

    algos = available_algorithms()
    if algorithm not in algos:
        raise ConfigError(f"unknown algorithm {algorithm!r}; available: {', '.join(sorted(algos))}")
    private = algos[algorithm].private
    if private and (epsilon is None or delta is None):
        raise ConfigError(f"algorithm {algorithm!r} is private: pass epsilon= and delta= (delta below 1/n)")
    if not private and (epsilon is not None or delta is not None):
        raise ConfigError(f"algorithm {algorithm!r} is not private: it takes no epsilon/delta")
    privacy = {"epsilon": epsilon, "allow_large_delta": allow_large_delta, "accountant": accountant}
    if delta is not None:
        privacy["delta"] = delta
    options = {"engine": engine, "seed": seed, "insecure_seed": insecure_seed, "data_dir": data_dir}
    cfg = _config(model=model, dataset=dataset, algorithm=algorithm, privacy=privacy, params=params, options=options)
    objects = {
        "dataset": None if isinstance(dataset, str) else dataset,
        "model": None if isinstance(model, str) else model,
        "loss": None if loss is None else per_sample_loss(loss),
    }
    if out_dir is not None:
        return train(cfg, out_dir=out_dir, progress=progress, **objects)
    cfg.plots = False  # nobody would see them
    with tempfile.TemporaryDirectory(prefix="privopt-fit-") as tmp:
        return train(cfg, out_dir=Path(tmp) / "run", progress=progress, **objects)
