"""DP-GD for linear logistic ERM: full-batch noisy proximal gradient descent (Paper B's baseline).

Each iteration releases ``(sum_i clip_C(g_i(w)) + N(0, (zC)^2 I)) / n`` (one ``FullBatch``
Gaussian step) and takes ``w <- prox(w - eta * noisy_grad)`` with
``prox(v) = Proj_K(v / (1 + eta * l2))``, the exact proximal step of the L2 term plus the optional
constraint set ``K`` (``constraint="l1-ball"``, ...; projected DP-GD).
It is the same mechanism as the generic ``dp-gd`` algorithm (:mod:`privopt.algorithms.dpsgd`) but
uses closed-form logistic gradients (hundreds of times faster than per-sample autograd on a linear
model) and an exact proximal step for the regulariser. Output: the last iterate. See
``docs/algorithms/erm.md``.

Example:
    >>> from privopt.algorithms.dp_gd_erm import DPGDERM
    >>> algo = DPGDERM(iterations=1000, step_size=0.1, l2=0.0)
    >>> algo.inventory(n=20_000).steps[0].count
    1000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import param, positive, positive_int
from privopt.algorithms.erm_common import ConstrainedERMConfig, LinearERMAlgorithm, full_gradient_plan
from privopt.algorithms.releases import ReleasePlan

__all__ = ["DPGDERM", "DPGDERMConfig"]


@dataclass(frozen=True)
class DPGDERMConfig(ConstrainedERMConfig):
    """``iterations`` noisy full-gradient steps T of constant size ``step_size`` (optionally projected
    onto ``constraint``)."""

    iterations: int = param(1000, positive_int)
    step_size: float = param(0.1, positive, role="lr")


@register_algorithm
class DPGDERM(LinearERMAlgorithm):
    """Full-batch DP gradient descent on (L2-regularised) logistic regression
    (hyper-parameters: :class:`DPGDERMConfig`)."""

    name = "dp-gd-erm"
    summary = "DP-GD for linear logistic ERM: full-batch noisy proximal gradient descent (Paper B baseline)"

    Config = DPGDERMConfig
    state_arrays = ("w",)

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._w: np.ndarray | None = None
        self._set = None

    def release_plan(self, n: int) -> ReleasePlan:
        return full_gradient_plan(n, clip=self.config.clip, iterations=self.config.iterations)

    def num_steps(self) -> int:
        return self.config.iterations

    def _start(self, w0: np.ndarray) -> None:
        self._set = self.config.geometry(w0.shape[0])
        self._w = w0.copy() if self._set is None else self._set.project(w0)

    def output(self) -> np.ndarray:
        return self._w

    def step(self, t: int) -> dict[str, float]:
        c = self.config
        g = self.noisy_gradient(self._w)
        w = (self._w - c.step_size * g) / (1.0 + c.step_size * c.l2)
        self._w = w if self._set is None else self._set.project(w)
        self._sync_model()
        return {}
