"""DP accelerated mirror descent (DP-AMD) over a constraint set, for linear logistic ERM (Paper B).

Linear coupling of a projected gradient step and a mirror step, both driven by ONE noisy
full-batch gradient per iteration (``docs/algorithms/erm.md``, "DP-AMD")::

    x_{k+1} = r_k * z_k + (1 - r_k) * y_k                 r_k = 2 / (k + 2)
    g       = (sum_i clip_C(grad f_i(x_{k+1})) + N(0, (z C)^2 I)) / n  +  l2 * x_{k+1}
    y_{k+1} = Proj_K(x_{k+1} - eta * g)                   Euclidean gradient step, eta = 1/L
    z_{k+1} = argmin_{z in K} <g, z> + D(z, z_k) / alpha_{k+1}       alpha_k = (k + 1) eta / (4 kappa^2)

over ``K`` = an ℓ1 ball or the simplex (entropy mirror map) or an ℓ2 ball (Euclidean map), from
:mod:`privopt.algorithms.mirror`; ``kappa`` is the geometry's dual-norm factor (``R`` for the ℓ1
ball of radius ``R``, else 1), so ``kappa^2 / eta`` bounds the smoothness in the map's norm. The
output is ``y_T``. The release is DP-GD's (one ``FullBatch`` Gaussian, per-record bound ``C``,
``iterations`` times), so the privacy inventory and calibration are the same.

Example:
    >>> from privopt.algorithms.dp_amd import DPAMD
    >>> algo = DPAMD(iterations=200, step_size=4.0, constraint="l1-ball", radius=10.0)
    >>> algo.inventory(n=20_000).steps[0].count
    200
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import one_of, param, positive, positive_int
from privopt.algorithms.erm_common import ConstrainedERMConfig, LinearERMAlgorithm, full_gradient_plan
from privopt.algorithms.mirror import available_geometries
from privopt.algorithms.releases import ReleasePlan

__all__ = ["DPAMD", "DPAMDConfig", "amd_weights"]


def amd_weights(k: int, *, step_size: float, kappa: float) -> tuple[float, float]:
    """``(r_k, alpha_{k+1})`` of iteration ``k`` (0-based): the coupling weight and the mirror step."""
    return 2.0 / (k + 2), (k + 2) * step_size / (4.0 * kappa**2)


@dataclass(frozen=True)
class DPAMDConfig(ConstrainedERMConfig):
    """DP-AMD's hyper-parameters.

    Attributes:
        iterations: T, the number of noisy full gradients.
        step_size: eta = 1/L, the gradient step (L: ℓ2 smoothness of the objective; 4 for
            unit-norm rows without regulariser).
        constraint: the set and its mirror map: ``"l1-ball"`` or ``"simplex"`` (entropy),
            ``"l2-ball"`` (Euclidean).
        radius: the balls' radius.
        l2: L2 weight; its gradient ``l2 * x`` is added exactly (data-independent).
        clip: per-sample gradient bound C.
    """

    iterations: int = param(100, positive_int, role="epochs")
    step_size: float = param(4.0, positive, role="lr")
    constraint: str = param("l1-ball", one_of(*available_geometries()))


@register_algorithm
class DPAMD(LinearERMAlgorithm):
    """DP accelerated mirror descent over a constraint set (hyper-parameters: :class:`DPAMDConfig`)."""

    name = "dp-amd"
    summary = "DP accelerated mirror descent over an l1 ball / simplex (entropy) or l2 ball (Paper B)"
    Config = DPAMDConfig
    state_arrays = ("y", "z")

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.geometry = None
        self._y: np.ndarray | None = None
        self._z: np.ndarray | None = None  # mirror state (on the 2d-simplex for the l1 ball)

    def release_plan(self, n: int) -> ReleasePlan:
        return full_gradient_plan(n, clip=self.config.clip, iterations=self.config.iterations)

    def num_steps(self) -> int:
        return self.config.iterations

    def steps_for(self, *, n: int) -> int:
        return self.config.iterations

    def _start(self, w0: np.ndarray) -> None:
        self.geometry = self.config.geometry(w0.shape[0])
        self._y = self.geometry.project(w0)
        self._z = self.geometry.from_primal(w0)

    def output(self) -> np.ndarray:
        return self._y

    def query_point(self, k: int) -> np.ndarray:
        """``x_{k+1}``, where iteration ``k`` queries the gradient."""
        r, _ = amd_weights(k, step_size=self.config.step_size, kappa=self.geometry.dual_norm_factor())
        return r * self.geometry.to_primal(self._z) + (1.0 - r) * self._y

    def step(self, t: int) -> dict[str, float]:
        c, geo = self.config, self.geometry
        _, alpha = amd_weights(t, step_size=c.step_size, kappa=geo.dual_norm_factor())
        x = self.query_point(t)
        g = self.noisy_gradient(x) + c.l2 * x
        self._y = geo.project(x - c.step_size * g)
        self._z = geo.prox_step(self._z, g, step=alpha)
        self._sync_model()
        return {}
