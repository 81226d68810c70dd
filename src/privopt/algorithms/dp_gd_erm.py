"""DP-GD for linear logistic ERM: full-batch noisy proximal gradient descent (Paper B's baseline).

Each iteration releases ``(sum_i clip_C(g_i(w)) + N(0, (zC)^2 I)) / n`` (one ``FullBatch``
Gaussian step) and takes ``w <- prox(w - eta * noisy_grad)`` with ``prox(v) = v / (1 + eta * l2)``.
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
import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import param, positive, positive_int
from privopt.algorithms.erm_common import LinearERMAlgorithm, LinearERMConfig, single_thread_blas
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, Query, ReleasePlan
from privopt.grads.sums import BoundedSum

__all__ = ["DPGDERM", "DPGDERMConfig"]


@dataclass(frozen=True)
class DPGDERMConfig(LinearERMConfig):
    """``iterations`` noisy full-gradient steps T of constant size ``step_size``."""

    iterations: int = param(1000, positive_int)
    step_size: float = param(0.1, positive, role="lr")


@register_algorithm
class DPGDERM(LinearERMAlgorithm):
    """Full-batch DP gradient descent on (L2-regularised) logistic regression
    (hyper-parameters: :class:`DPGDERMConfig`)."""

    name = "dp-gd-erm"
    summary = "DP-GD for linear logistic ERM: full-batch noisy proximal gradient descent (Paper B baseline)"

    Config = DPGDERMConfig

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._w: np.ndarray | None = None

    def release_plan(self, n: int) -> ReleasePlan:
        query = Query("grad", Fixed(self.config.clip), batch=BatchPlan(n, n))
        return ReleasePlan(phases=(Phase("step", self.config.iterations, (query,)),))

    def num_steps(self) -> int:
        return self.config.iterations

    def _start(self, w0: np.ndarray) -> None:
        self._w = w0.copy()

    def output(self) -> np.ndarray:
        return self._w

    def step(self, t: int) -> dict[str, float]:
        prob, c = self.problem, self.config

        def grad_sum(idx: torch.Tensor, clip: float) -> BoundedSum:
            with single_thread_blas():
                return BoundedSum(torch.from_numpy(prob.grad_coefficients(self._w, clip=clip) @ prob.x), bound=clip)

        g = self.releases.phase("step").release("grad", grad_sum).numpy()
        self._grad_evals += prob.n
        self._w = (self._w - c.step_size * g) / (1.0 + c.step_size * c.l2)
        self._sync_model()
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"w": self._w.tolist(), "grad_evals": self._grad_evals, "releases": self.releases.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._w = np.asarray(state["w"], dtype=np.float64)
        self._grad_evals = int(state["grad_evals"])
        self.releases.load_state_dict(state.get("releases", {}))
