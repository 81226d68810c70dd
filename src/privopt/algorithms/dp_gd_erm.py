"""DP-GD for linear logistic ERM: full-batch noisy proximal gradient descent (Paper B baseline, SPEC §3.4).

Each iteration releases ``(sum_i clip_C(g_i(w)) + N(0, (zC)^2 I)) / n`` (one ``FullBatch``
Gaussian step, through :class:`~privopt.grads.release.PrivateBatch`) and takes
``w <- prox(w - eta * noisy_grad)`` with ``prox(v) = v / (1 + eta * l2)``. It is the same
mechanism as the generic ``dp-gd`` algorithm (:mod:`privopt.algorithms.dpsgd`) but uses closed-form
logistic gradients (hundreds of times faster than per-sample autograd on a linear model) and an
exact proximal step for the regulariser. Output: the last iterate (SPEC §3.4, Thm 6.2).

Example:
    >>> from privopt.algorithms.dp_gd_erm import DPGDERM
    >>> algo = DPGDERM(iterations=1000, step_size=0.1, l2=0.0)
    >>> algo.inventory(n=20_000).steps[0].count
    1000
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.erm_common import LinearERMAlgorithm, single_thread_blas
from privopt.grads.release import PrivateBatch
from privopt.privacy import FullBatch, Inventory, PlannedStep
from privopt.validation import positive, positive_int

__all__ = ["DPGDERM"]


@register_algorithm
class DPGDERM(LinearERMAlgorithm):
    """Full-batch DP gradient descent on (L2-regularised) logistic regression.

    Args:
        iterations: number of noisy full-gradient steps T.
        step_size: constant step eta.
        l2: L2 weight (exact proximal step, data-independent).
        clip: per-sample gradient bound G (gradients are clipped to it).
    """

    name = "dp-gd-erm"
    summary = "DP-GD for linear logistic ERM: full-batch noisy proximal gradient descent (Paper B baseline)"

    def __init__(self, *, iterations: int = 1000, step_size: float = 0.1, l2: float = 0.0, clip: float = 1.0):
        super().__init__(l2=l2, clip=clip)
        self.iterations = positive_int("iterations", iterations)
        self.step_size = positive("step_size", step_size)
        self._w: np.ndarray | None = None

    def inventory(self, *, n: int) -> Inventory:
        return Inventory([PlannedStep(FullBatch(), (("grad", 1.0),), self.iterations)])

    def num_steps(self) -> int:
        return self.iterations

    def _start(self, w0: np.ndarray) -> None:
        self._w = w0.copy()

    def output(self) -> np.ndarray:
        return self._w

    def step(self, t: int) -> dict[str, float]:
        ctx, prob = self._ctx, self.problem
        batch = PrivateBatch(ctx.ledger, FullBatch(), {"grad": ctx.noise.get("grad", 1.0)}, rng=ctx.noise_rng)
        with single_thread_blas():
            total = prob.grad_coefficients(self._w, clip=self.clip) @ prob.x
        self._grad_evals += prob.n
        g = batch.gaussian("grad", torch.from_numpy(total), clip=self.clip, normalizer=prob.n).numpy()
        self._w = (self._w - self.step_size * g) / (1.0 + self.step_size * self.l2)
        self._sync_model()
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"w": self._w.tolist(), "grad_evals": self._grad_evals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._w = np.asarray(state["w"], dtype=np.float64)
        self._grad_evals = int(state["grad_evals"])
