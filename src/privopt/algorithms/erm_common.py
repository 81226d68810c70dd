"""Shared plumbing of the linear-logistic ERM algorithms (DP-SVRG, DP-SVRG++, DP-GD-ERM).

These algorithms work on a closed-form problem (:class:`privopt.objectives.erm.LogisticERM`)
rather than through the generic per-sample-gradient engine: the model must be a linear map with
a single trainable weight of ``p`` entries (e.g. ``nn.Linear(p, 1, bias=False)``), and the
labels must be in {-1, +1} (or {0, 1}). The weight is read at :meth:`setup` and the current
output is written back after every step, so the generic training loop's evaluation, checkpoints
and records keep working.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from privopt.algorithms.base import Algorithm, RunContext
from privopt.errors import ConfigError, ModelError
from privopt.objectives.erm import LogisticERM
from privopt.validation import positive

__all__ = ["LinearERMAlgorithm", "single_thread_blas"]

_CONTROLLER = None


def single_thread_blas():
    """Context manager limiting BLAS to one thread.

    The products here are tiny ([n, p] @ [p] with p ~ 50, or length-p dots): multithreaded BLAS
    gains nothing on them and, on a loaded machine, its thread hand-offs made them 10-60x slower
    (measured: 16 ms vs 0.25 ms for a 20,000 x 54 mat-vec on 2 busy cores).
    """
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


class LinearERMAlgorithm(Algorithm):
    """Base: binds a run to a :class:`LogisticERM` and keeps the model's weight in sync.

    Attributes (after setup):
        problem: the bound :class:`LogisticERM` (logistic part + ``l2``).
        grad_evals: per-sample gradient evaluations performed so far (for "passes over the data").
    """

    def __init__(self, *, l2: float, clip: float):
        if not (isinstance(l2, (int, float)) and math.isfinite(l2) and l2 >= 0):
            raise ConfigError(f"l2 must be a finite number >= 0, got {l2!r}")
        self.l2 = float(l2)
        self.clip = positive("clip", clip)
        self._ctx: RunContext | None = None
        self._param: torch.nn.Parameter | None = None
        self.problem: LogisticERM | None = None
        self._grad_evals = 0

    def setup(self, ctx: RunContext) -> None:
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        p_dim = int(ctx.x_train.reshape(ctx.n, -1).shape[1])
        if len(params) != 1 or params[0].numel() != p_dim:
            shapes = [tuple(p.shape) for p in params]
            raise ModelError(
                f"algorithm {self.name!r} needs a linear model with one trainable weight of {p_dim} entries "
                f"(e.g. nn.Linear({p_dim}, 1, bias=False)); got trainable parameters {shapes}"
            )
        self._ctx = ctx
        self._param = params[0]
        self.problem = LogisticERM(
            features=ctx.x_train.reshape(ctx.n, -1).detach().cpu().double().numpy(),
            labels=ctx.y_train.detach().cpu().double().numpy(),
            l2=self.l2,
        )
        self._grad_evals = 0
        self._start(self._param.detach().cpu().double().reshape(-1).numpy().copy())

    def _start(self, w0: np.ndarray) -> None:
        """Initialise the estimator state from the model's initial weight."""
        raise NotImplementedError

    def output(self) -> np.ndarray:
        """The algorithm's current output (what :meth:`finalize` writes into the model)."""
        raise NotImplementedError

    def _sync_model(self) -> None:
        with torch.no_grad():
            w = torch.from_numpy(np.ascontiguousarray(self.output()))
            self._param.copy_(w.reshape(self._param.shape).to(self._param.dtype))

    def finalize(self) -> None:
        self._sync_model()

    @property
    def grad_evals(self) -> int:
        """Per-sample gradient evaluations performed so far."""
        return self._grad_evals

    @property
    def passes(self) -> float:
        """Per-sample gradient evaluations divided by n."""
        return self._grad_evals / self.problem.n if self.problem is not None else 0.0
