"""What Paper B's Covertype comparison runs: settings, methods, schedule grids and budgets
(:mod:`privopt.experiments.erm_covertype`; ``docs/algorithms/erm.md``, "The Covertype comparison").

Three settings, each comparing one of the paper's methods with DP-GD:

* ``regularized`` (Fig. 1): mean logistic loss + (1e-2/2)||w||², DP-SVRG vs DP-GD;
* ``unregularized`` (Fig. 2): plain logistic loss, DP-SVRG++ vs DP-GD;
* ``l1-constrained``: plain logistic loss over ``||w||_1 <= 10``, DP-AMD (entropy map on the ℓ1
  ball) vs projected DP-GD.

Every method has a grid of schedules (run length × step size). The run length axis (``length``)
is the one that trades optimisation error against noise: longer runs take more noisy queries, so
each carries more noise. A schedule is chosen per method and epsilon on the held-out tuning set
(the run length extended beyond the grid, up to ``max_length``, while the best is the longest);
DP-GD's printed schedule for Fig. 2 (T = 1000, eta = 0.1) is run as a reference; DP-SVRG++'s printed
one (15 epochs of 10·2^s steps, eta = 0.01) lies next to the grid (14 epochs, the same steps) and
is not re-run (its 655,340 steps per run cost minutes here).

Example:
    >>> spec = settings(BUDGETS["quick"])["l1-constrained"]
    >>> [m.label for m in spec.methods]
    ['dp-amd', 'dp-gd']
    >>> spec.methods[0].build({"iterations": 30, "step_size": 4.0}).config.radius
    10.0
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from privopt.algorithms.base import Algorithm, get_algorithm
from privopt.algorithms.mirror import MirrorGeometry, get_geometry

__all__ = ["BUDGETS", "Budget", "L1_RADIUS", "MethodSpec", "REG_L2", "Setting", "settings"]

REG_L2 = 1e-2  # Fig. 1's regulariser
L1_RADIUS = 10.0  # binds: the unconstrained optimum on Covertype has ||w*||_1 in the hundreds


@dataclass(frozen=True)
class MethodSpec:
    """One method of a setting.

    Attributes:
        label: the name used in tables (``dp-gd``, ``dp-svrg``, ...).
        algorithm: the registered algorithm it builds.
        fixed: hyper-parameters common to every schedule (regulariser, constraint, ...).
        grid: schedule axes, e.g. ``{"iterations": (...), "step_size": (...)}``.
        length: the axis that sets the run length (checked for being interior after tuning).
        printed: the paper's printed schedule, run as a reference (``None``: the paper gives none).
        max_length: how far tuning may extend the run length when the best is the longest tried
            (``None``: not extended).
    """

    label: str
    algorithm: str
    fixed: dict[str, Any]
    grid: dict[str, tuple]
    length: str
    printed: dict[str, Any] | None = None
    max_length: int | None = None

    def schedules(self) -> list[dict[str, Any]]:
        """Every point of the grid, run length first."""
        axes = list(self.grid)
        return [dict(zip(axes, values)) for values in itertools.product(*(self.grid[a] for a in axes))]

    def build(self, schedule: dict[str, Any]) -> Algorithm:
        return get_algorithm(self.algorithm, **self.fixed, **schedule)


@dataclass(frozen=True)
class Setting:
    """One comparison: its objective (``l2``, optional ℓ1 ``radius``), the proposed method and DP-GD."""

    name: str
    figure: int
    l2: float
    proposed: str
    methods: tuple[MethodSpec, ...]
    l1_radius: float | None = None

    def geometry(self, dim: int) -> MirrorGeometry | None:
        """The constraint set (``None`` when unconstrained)."""
        return None if self.l1_radius is None else get_geometry("l1-ball", dim=dim, radius=self.l1_radius)

    def method(self, label: str) -> MethodSpec:
        return next(m for m in self.methods if m.label == label)


@dataclass(frozen=True)
class Budget:
    """How much is run: final runs per method and epsilon, tuning runs per grid point, the
    accountant, the curve resolution and the grids (by setting, then method label)."""

    runs: int
    tune_runs: int
    accountant: str  # "rdp" (fast) or "pld" (tighter; calibration takes ~10-80 s each)
    curve_points: int
    grids: dict[str, dict[str, dict[str, tuple]]] = field(default_factory=dict)
    max_lengths: dict[str, dict[str, int]] = field(default_factory=dict)


_QUICK_GRIDS = {
    "regularized": {
        "dp-svrg": {"inner": (1000, 5000, 20000), "step_size": (1e-4, 1e-3)},
        "dp-gd": {"iterations": (10, 30, 100, 300, 1000), "step_size": (0.125, 0.5, 2.0, 8.0)},
    },
    "unregularized": {
        "dp-svrg-pp": {"epochs": (11, 14), "step_size": (0.001, 0.003, 0.01)},
        "dp-gd": {"iterations": (100, 300, 1000, 3000), "step_size": (0.25, 1.0, 4.0, 16.0)},
    },
    "l1-constrained": {
        "dp-amd": {"iterations": (10, 30, 100, 300), "step_size": (1.0, 4.0, 16.0)},
        "dp-gd": {"iterations": (10, 30, 100, 300), "step_size": (1.0, 4.0, 16.0)},
    },
}
_PAPER_GRIDS = {
    "regularized": {
        "dp-svrg": {"inner": (1000, 5000, 20000, 80000), "step_size": (3e-5, 1e-4, 3e-4, 1e-3)},
        "dp-gd": {"iterations": (10, 30, 100, 300, 1000, 3000), "step_size": (0.03, 0.125, 0.5, 2.0, 8.0)},
    },
    "unregularized": {
        "dp-svrg-pp": {"epochs": (11, 13, 15, 17), "step_size": (0.001, 0.003, 0.01, 0.03)},
        "dp-gd": {"iterations": (100, 300, 1000, 3000, 10000), "step_size": (0.25, 1.0, 4.0, 16.0)},
    },
    "l1-constrained": {
        "dp-amd": {"iterations": (10, 30, 100, 300, 1000), "step_size": (1.0, 4.0, 16.0)},
        "dp-gd": {"iterations": (10, 30, 100, 300, 1000), "step_size": (1.0, 4.0, 16.0)},
    },
}

# How far tuning may extend a run length that is best at the grid's edge (the cost of the longest
# runs sets these: a DP-SVRG(++) step is a Python-level step, a DP-GD one a vectorised pass).
_MAX_LENGTHS = {
    "regularized": {"dp-svrg": 40000, "dp-gd": 10000},
    "unregularized": {"dp-svrg-pp": 15, "dp-gd": 10000},
    "l1-constrained": {"dp-amd": 3000, "dp-gd": 3000},
}

BUDGETS = {
    "quick": Budget(
        runs=3, tune_runs=1, accountant="rdp", curve_points=40, grids=_QUICK_GRIDS, max_lengths=_MAX_LENGTHS
    ),
    "paper": Budget(
        runs=10, tune_runs=3, accountant="pld", curve_points=100, grids=_PAPER_GRIDS, max_lengths=_MAX_LENGTHS
    ),
}


def settings(budget: Budget) -> dict[str, Setting]:
    """The three settings with the budget's grids."""
    g = budget.grids

    def spec(setting, label, algorithm, fixed, length, printed=None):
        cap = budget.max_lengths.get(setting, {}).get(label)
        return MethodSpec(label, algorithm, fixed, g[setting][label], length, printed, cap)

    reg, unreg, l1 = {"l2": REG_L2}, {"l2": 0.0}, {"l2": 0.0, "constraint": "l1-ball", "radius": L1_RADIUS}
    return {
        "regularized": Setting(
            "regularized",
            1,
            REG_L2,
            "dp-svrg",
            (
                spec("regularized", "dp-svrg", "dp-svrg", {**reg, "epochs": 15}, "inner"),
                spec("regularized", "dp-gd", "dp-gd-erm", reg, "iterations"),
            ),
        ),
        "unregularized": Setting(
            "unregularized",
            2,
            0.0,
            "dp-svrg-pp",
            (
                spec("unregularized", "dp-svrg-pp", "dp-svrg-pp", {**unreg, "inner": 10}, "epochs"),
                spec(
                    "unregularized",
                    "dp-gd",
                    "dp-gd-erm",
                    unreg,
                    "iterations",
                    printed={"iterations": 1000, "step_size": 0.1},
                ),
            ),
        ),
        "l1-constrained": Setting(
            "l1-constrained",
            3,
            0.0,
            "dp-amd",
            (
                spec("l1-constrained", "dp-amd", "dp-amd", l1, "iterations"),
                spec("l1-constrained", "dp-gd", "dp-gd-erm", l1, "iterations"),
            ),
            l1_radius=L1_RADIUS,
        ),
    }
