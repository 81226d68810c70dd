"""Paper C's experiment as privopt runs it: methods, budgets, data and the config of one run.

Setting (docs/algorithms/sosp.md, "Reproduction"): n = 6,000 training records of MNIST (CIFAR-10:
as many as the data folder holds, up to 6,000), the official test split, MLP-128 with Kaiming
initialisation, δ = 1e-5, ε ∈ {0.5, 1, 2}, m ∈ {1, 2, 5, 10} clients holding label-sorted shards
with local noise. Methods: Gauss-PSGD, the reconstructed Liu et al. baseline and DP-SGD, on the
same data and the same data budget (``epochs`` passes); batch sizes are totals over the clients
(each client's is the total divided by m), so every method touches the same number of records per
query whatever m. With local noise the step size is divided by sqrt(m): the average of m clients'
independent noises is sqrt(m) times larger than one central noise, and this keeps the noise's
displacement per step that of m = 1 (measured on the tuning records at m = 10: it helps all three
methods, docs/algorithms/sosp.md).

Budgets fix everything the paper leaves open. ``quick`` uses the hyper-parameters chosen by
:func:`tuning_grid` (``privopt reproduce sosp --tune``) on MNIST records that are not among the
6,000 training records; ``paper`` uses the printed values and the project's defaults.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from privopt.errors import ConfigError

__all__ = [
    "METHODS",
    "METHOD_LABELS",
    "CLIENTS",
    "EPSILONS",
    "DELTA",
    "N_TRAIN",
    "DATASETS",
    "Budget",
    "BUDGETS",
    "method_params",
    "run_config",
    "tuning_grid",
]

METHODS = ("gauss-psgd", "dp-spider-sosp", "fed-dp-sgd")
METHOD_LABELS = {"gauss-psgd": "Gauss-PSGD", "dp-spider-sosp": "Liu et al. (reconstr.)", "fed-dp-sgd": "DP-SGD"}
CLIENTS = (1, 2, 5, 10)
EPSILONS = (0.5, 1.0, 2.0)
DELTA = 1e-5
N_TRAIN = 6000
DATASETS = ("mnist", "cifar10")
# Fields of each method that are batch sizes: totals over the clients, split evenly between them.
BATCH_FIELDS = {"gauss-psgd": ("b1", "b2"), "dp-spider-sosp": ("b1", "b2"), "fed-dp-sgd": ("batch_size",)}


@dataclass(frozen=True)
class Budget:
    """Everything a reproduction fixes besides (method, m, ε, seed).

    Attributes:
        epochs: data budget (passes over each client's records) of every method.
        sampling: ``"poisson"`` or ``"disjoint"`` (docs/algorithms/sosp.md, "Accounting").
        params: per method, hyper-parameters at m = 1 (batch sizes are totals over the clients).
        diag_records, diag_tol: training records and Lanczos tolerance of the SOSP diagnostics.
        evals: evaluations of the test split per run (the curves).
        n_train: training records (per-record keyed selection).
    """

    name: str
    epochs: float
    sampling: str
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    diag_records: int = 1000
    diag_tol: float = 1e-2
    evals: int = 12
    n_train: int = N_TRAIN


_SPIDER = {"gamma": 3.0, "clip_diff_cap": 0.1, "clip": 1.0, "refresh_share": 0.4}
BUDGETS = {
    # Chosen by `privopt reproduce sosp --tune` (docs/algorithms/sosp.md, "Tuning").
    "quick": Budget(
        name="quick",
        epochs=5,
        sampling="poisson",
        params={
            "gauss-psgd": {**_SPIDER, "b1": 512, "b2": 128, "lr": 2.0, "kappa": 1.0, "chi": 0.01},
            "dp-spider-sosp": {**_SPIDER, "b1": 512, "b2": 128, "lr": 1.0, "kappa": 4.0, "chi": 0.01, "period": 8},
            "fed-dp-sgd": {"batch_size": 128, "lr": 0.5, "clip": 1.0},
        },
        diag_tol=1e-2,
        evals=6,
    ),
    # The printed values (χ, κ, Γ, Q, lr) and the project's defaults where the paper is silent.
    "paper": Budget(
        name="paper",
        epochs=20,
        sampling="disjoint",
        params={
            "gauss-psgd": {"b1": 256, "b2": 32, "lr": 1e-3, "kappa": 0.1, "chi": 0.01, "gamma": 10.0},
            "dp-spider-sosp": {"b1": 256, "b2": 32, "lr": 1e-3, "kappa": 0.1, "chi": 0.01, "gamma": 10.0},
            "fed-dp-sgd": {"batch_size": 256, "lr": 1e-3},
        },
        diag_records=6000,
        diag_tol=1e-4,
        evals=20,
    ),
}


def method_params(method: str, budget: Budget, *, clients: int, split: str, trust: str) -> dict[str, Any]:
    """The algorithm parameters of one run: the budget's, batch sizes divided over the clients."""
    if method not in budget.params:
        raise ConfigError(f"budget {budget.name!r} has no parameters for {method!r}; methods: {sorted(budget.params)}")
    params = dict(budget.params[method])
    for name in BATCH_FIELDS.get(method, ()):
        params[name] = max(1, round(params[name] / clients))
    if trust == "local":  # the averaged local noise grows like sqrt(m): keep its displacement per step
        params["lr"] = params["lr"] / math.sqrt(clients)
    params.update(clients=clients, split=split, trust=trust, epochs=budget.epochs, sampling=budget.sampling)
    return params


def run_config(
    method: str,
    *,
    dataset: str,
    data_dir: str | None,
    epsilon: float,
    seed: int,
    clients: int,
    budget: Budget,
    split: str = "label",
    trust: str = "local",
    insecure_seed: int | None = None,
    n_train: int = N_TRAIN,
) -> dict[str, Any]:
    """The :class:`~privopt.config.RunConfig` (as a dict) of one run; ``seed`` is the public seed of
    the 6,000-record selection, the initialisation and the client split."""
    params = method_params(method, budget, clients=clients, split=split, trust=trust)
    steps = _expected_queries(method, params, n_train // clients)
    return {
        "algorithm": method,
        "algorithm_params": params,
        "dataset": dataset,
        "dataset_params": {"max_train": n_train},
        "data_dir": data_dir,
        "model": "mlp",
        "model_params": {"hidden": 128},
        "privacy": {"epsilon": float(epsilon), "delta": DELTA},
        "seed": int(seed),
        "insecure_seed": insecure_seed,
        "eval_every": max(1, steps // budget.evals),
        "plots": False,
    }


def _expected_queries(method: str, params: dict[str, Any], n_client: int) -> int:
    batch = params.get("batch_size") or (params["b1"] + params["b2"]) / 2
    return max(1, int(params["epochs"] * n_client / batch))


def tuning_grid(method: str, budget: Budget) -> list[dict[str, Any]]:
    """The hyper-parameter grid of ``--tune`` (the same size for every method): step size × the
    method's other main knob (κ for the SPIDER methods, the batch size for DP-SGD)."""
    base = dict(budget.params[method])
    lrs = (0.25, 0.5, 1.0, 2.0)
    knob = ("batch_size", (128, 256)) if method == "fed-dp-sgd" else ("kappa", (1.0, 4.0))
    return [{**base, "lr": lr, knob[0]: v} for lr, v in itertools.product(lrs, knob[1])]
