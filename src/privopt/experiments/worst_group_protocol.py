"""The worst-group reproduction's protocol: datasets, methods, schedules and tuning grids.

Everything decided before anything runs (``docs/algorithms/worst_group.md``, "Reproduction"):

* models: logistic regression (``logreg``) for every method (Paper D's convex setting);
* δ = n^{−1.1}; add/remove neighbours; noise calibrated with the RDP accountant for every method
  (fast; PLD would lower every method's noise alike);
* tuning: every method gets a grid of the SAME size (6 points) over its two most influential knobs,
  searched at ONE ε (``TUNE_EPSILON``) on a validation split carved from the training split, scored
  by worst-group validation accuracy; the best point is used at every ε (tuning runs are not
  accounted, as in the DRO reproduction);
* schedules per dataset (epochs, batch sizes) chosen so that the methods' curves have flattened
  (``docs/algorithms/worst_group.md`` records the check).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from privopt.errors import ConfigError

__all__ = [
    "BASELINES",
    "DATASETS",
    "EPSILONS",
    "METHOD_LABELS",
    "NO_BUDGET",
    "PAPER_D",
    "TUNE_EPSILON",
    "Schedule",
    "evaluation_split",
    "grid",
    "load_group_dataset",
    "method_params",
    "schedule_summary",
]

PAPER_D = ("minimax-phased-erm", "dp-oco-exp3", "noisy-sgd-mgr", "noisy-sgd-ags")
BASELINES = ("dp-sgd", "group-dro", "dp-double-spider", "dp-recursive-spider")
METHOD_LABELS = {
    "minimax-phased-erm": "Minimax Phased ERM",
    "dp-oco-exp3": "DP-OCO + EXP3",
    "noisy-sgd-mgr": "Noisy-SGD-MGR",
    "noisy-sgd-ags": "Noisy-SGD-AGS",
    "dp-sgd": "DP-SGD (ERM)",
    "group-dro": "group DRO (non-private)",
    "dp-double-spider": "DP Double-SPIDER (KL)",
    "dp-recursive-spider": "DP Recursive-SPIDER (KL)",
}
EPSILONS = (0.5, 1.0, 2.0, 5.0)
TUNE_EPSILON = 2.0
LOSS_BOUND = 1.0  # B of the worst-group methods: logistic losses start at log 2 and mostly stay below 1
SYNTHETIC_TUNING_SEED = 10_000  # tuning draws of the synthetic benchmark are independent of every final run
SYNTHETIC = {"num_groups": 4, "dim": 10, "n_train": 8000, "group_fractions": [0.5, 0.3, 0.15, 0.05]}


@dataclass(frozen=True)
class Schedule:
    """A dataset's compute schedule (the same for every method of the dataset).

    Attributes:
        epochs: epoch-equivalents of the gradient methods (DP-SGD, SPIDER, MGR/AGS, group DRO).
        batch: DP-SGD's expected batch (and the SPIDER correction batch; refresh = 4×).
        group_batch: Noisy-SGD-MGR/AGS's batch (sampling rate batch/n within the chosen group).
        oco_batch: DP-OCO + EXP3's records per round and stream for an average-size group.
        val_fraction: share of the training split used for validation while tuning.
    """

    epochs: float
    batch: int
    group_batch: int
    oco_batch: int
    val_fraction: float = 0.2
    options: dict[str, Any] = field(default_factory=dict)


DATASETS: dict[str, tuple[str, Schedule]] = {
    "adult": ("adult", Schedule(epochs=10, batch=512, group_batch=1024, oco_batch=32)),
    "celeba": ("celeba", Schedule(epochs=3, batch=1024, group_batch=2048, oco_batch=64)),
    "synthetic": ("synthetic-groups", Schedule(epochs=20, batch=256, group_batch=512, oco_batch=16, options=SYNTHETIC)),
}

# Why this reproduction, unlike dro-table3, erm-covertype and sosp, takes no --budget {quick,paper}.
NO_BUDGET = (
    "worst-group has no --budget: Paper D prints no experiments, so there is no paper schedule to choose; "
    "each dataset has one schedule (epochs and batch sizes chosen so that every method's curve has flattened, "
    "docs/algorithms/worst_group.md, 'Reproduction'), already CPU-sized. For a cheaper run: fewer --seeds or "
    "--epsilons, --methods, --no-tune, and on synthetic --no-rates or fewer --rate-seeds"
)


def schedule_summary(dataset: str) -> dict[str, Any]:
    """The dataset's schedule as the summary states it (with :data:`NO_BUDGET`'s reason in brief).

    Example:
        >>> s = schedule_summary("adult")
        >>> s["epochs"], s["batch"], s["group_batch"]
        (10, 512, 1024)
    """
    s = DATASETS[dataset][1]
    fields = {"epochs": s.epochs, "batch": s.batch, "group_batch": s.group_batch, "oco_batch": s.oco_batch}
    note = "the project's one schedule for this dataset (Paper D prints no experiments: no quick/paper budget)"
    return {**fields, "val_fraction": s.val_fraction, "note": note}


# Six points per method over its two most influential knobs (the same budget for every method).
_GRIDS: dict[str, tuple[str, tuple, str, tuple]] = {
    "dp-sgd": ("lr", (0.5, 2.0, 8.0), "clip", (0.5, 2.0)),
    "group-dro": ("lr", (0.5, 2.0, 8.0), "group_lr", (0.01, 0.1)),
    "dp-double-spider": ("lr", (0.5, 2.0, 8.0), "clip", (0.5, 2.0)),
    "dp-recursive-spider": ("lr", (0.5, 2.0, 8.0), "clip", (0.5, 2.0)),
    "noisy-sgd-mgr": ("lr", (0.5, 2.0, 8.0), "normalize", ("common", "group")),
    "noisy-sgd-ags": ("lr", (0.5, 2.0, 8.0), "normalize", ("common", "group")),
    "dp-oco-exp3": ("lr", (0.01, 0.05, 0.2), "clip", (0.5, 2.0)),
    "minimax-phased-erm": ("eta", (1e-4, 1e-3, 1e-2), "phases", (1, 2)),
}


def grid(method: str) -> list[dict[str, Any]]:
    """The tuning grid of ``method`` (6 points).

    Example:
        >>> len(grid("dp-sgd")), grid("minimax-phased-erm")[0]
        (6, {'eta': 0.0001, 'phases': 1})
    """
    if method not in _GRIDS:
        raise ConfigError(f"no tuning grid for {method!r}; methods: {', '.join(_GRIDS)}")
    a, av, b, bv = _GRIDS[method]
    return [{a: x, b: y} for x in av for y in bv]


def method_params(method: str, schedule: Schedule, point: dict[str, Any]) -> dict[str, Any]:
    """Hyper-parameters of one run: the dataset's schedule, the method's fixed settings, a grid point.

    Example:
        >>> p = method_params("noisy-sgd-ags", DATASETS["adult"][1], {"lr": 2.0, "normalize": "group"})
        >>> p["batch_size"], p["loss_bound"], p["choice"]
        (1024, 1.0, 'noisy-losses')
    """
    s = schedule
    base: dict[str, Any]
    if method in ("dp-sgd", "group-dro"):
        base = {"epochs": s.epochs, "batch_size": s.batch}
    elif method in ("noisy-sgd-mgr", "noisy-sgd-ags"):
        base = {"epochs": s.epochs, "batch_size": s.group_batch, "loss_bound": LOSS_BOUND}
        if method == "noisy-sgd-ags":
            base["choice"] = "noisy-losses"
    elif method == "dp-oco-exp3":
        base = {"batch_size": s.oco_batch, "loss_bound": LOSS_BOUND}
    elif method == "minimax-phased-erm":
        base = {"radius": 2.0}
    elif method in ("dp-double-spider", "dp-recursive-spider"):
        return _dro_params(method, s, point)
    else:
        raise ConfigError(f"method {method!r} is not part of the worst-group reproduction")
    if method in PAPER_D and "group_sizes" not in base:
        base["group_sizes"] = "public" if s.options else "private"  # the synthetic generator publishes its sizes
    return {**base, **point}


def _dro_params(method: str, s: Schedule, point: dict[str, Any]) -> dict[str, Any]:
    """Paper A's KL-DRO methods through their roles (as in the DRO reproduction)."""
    import dataclasses

    from privopt.experiments.dro_protocol import BUDGETS
    from privopt.experiments.dro_protocol import method_params as dro_params

    budget = dataclasses.replace(BUDGETS["quick"], batch_size=s.batch, refresh=4 * s.batch)
    return dro_params(method, budget=budget, lr=point["lr"], clip=point["clip"], epochs=s.epochs)


def load_group_dataset(name: str, *, data_dir=None, seed: int = 0, val_fraction: float = 0.0):
    """One of :data:`DATASETS` with the reproduction's options (validation carved when tuning;
    the synthetic data is generated, so its tuning data is an independent draw instead).

    Example:
        >>> ds = load_group_dataset("synthetic", seed=0)
        >>> ds.num_groups, ds.n_train
        (4, 8000)
    """
    from privopt.data import load_dataset

    if name not in DATASETS:
        raise ConfigError(f"unknown worst-group dataset {name!r}; choose from {', '.join(DATASETS)}")
    reg, schedule = DATASETS[name]
    kw = dict(schedule.options)
    if reg == "synthetic-groups":
        return load_dataset(reg, seed=seed + (SYNTHETIC_TUNING_SEED if val_fraction else 0), **kw)
    if val_fraction:
        kw["val_fraction"] = val_fraction
    return load_dataset(reg, data_dir=data_dir, seed=seed, **kw)


def evaluation_split(data, *, tuning: bool):
    """``(x, y, groups)`` a run is scored on: the validation split while tuning (the test split of
    the independent synthetic draw), the test split otherwise."""
    if tuning and data.y_val.shape[0] > 0:
        return data.x_val, data.y_val, data.g_val
    return data.x_test, data.y_test, data.g_test
