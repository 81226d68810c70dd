"""Logistic-regression ERM with closed-form per-sample gradients (Paper B; ``docs/algorithms/erm.md``).

The objective is ``F^r(w) = (1/n) sum_i log(1 + exp(-y_i w^T x_i)) + (lam/2) ||w||^2`` with labels
``y_i in {-1, +1}`` (the supplement's ``exp(1 + y w^T x)`` is a misprint). The L2 term is
data-independent, so private algorithms handle it with a proximal step; only the logistic part is
queried through noisy releases.

For a linear model the per-sample gradient is ``g_i(w) = -y_i * sigmoid(-y_i w^T x_i) * x_i``: a
scalar coefficient times the feature row. Everything here works on those coefficients (an
``[n]`` vector) instead of ``[n, p]`` gradient matrices, which is exact and much faster than
autograd — the SVRG inner loop takes one single-sample step at a time, so per-step cost matters.
Per-sample clipping at ``C`` reduces to scaling the coefficient by ``min(1, C / |coef_i| ||x_i||)``.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = normalize_rows(rng.normal(size=(200, 5)))
    >>> y = np.where(rng.random(200) < 0.5, -1.0, 1.0)
    >>> prob = LogisticERM(features=X, labels=y, l2=1e-2)
    >>> w_star, f_star = prob.solve()
    >>> bool(np.linalg.norm(prob.gradient(w_star)) < 1e-8)
    True
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy.special import expit

from privopt.errors import ConfigError, DataError, PrivoptWarning

__all__ = [
    "LogisticERM",
    "logistic_loss",
    "normalize_rows",
    "minmax_scale",
    "prox_l2",
]


def logistic_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample logistic loss ``log(1 + exp(-y * out))`` for labels in {-1, +1}; shape ``[B]``.

    ``outputs`` may be ``[B]`` or ``[B, 1]`` (a linear model's output). This is the ``loss_fn`` to
    give the generic training loop for the ERM algorithms.
    """
    out = outputs.reshape(outputs.shape[0], -1)[:, 0]
    return torch.nn.functional.softplus(-targets.to(out.dtype) * out)


def prox_l2(v: np.ndarray, *, step: float, l2: float) -> np.ndarray:
    """``argmin_w (1/(2 step)) ||w - v||^2 + (l2/2) ||w||^2 = v / (1 + step * l2)``."""
    return v / (1.0 + step * l2)


def minmax_scale(
    features: np.ndarray, *, lower: np.ndarray | None = None, upper: np.ndarray | None = None
) -> np.ndarray:
    """Scale each column to [0, 1] with the given public bounds (clipping values outside them).

    Without ``lower``/``upper`` the column min/max of ``features`` are used: that couples every
    record's scaling to the others (not differentially private), so it warns. Constant columns map to 0.
    """
    x = np.asarray(features, dtype=np.float64)
    if lower is None or upper is None:
        warnings.warn(
            "minmax_scale without lower/upper scales with the data's own min/max: not private; "
            "pass public bounds (docs/data.md)",
            PrivoptWarning,
            stacklevel=2,
        )
    lo = x.min(axis=0) if lower is None else np.asarray(lower, dtype=np.float64)
    hi = x.max(axis=0) if upper is None else np.asarray(upper, dtype=np.float64)
    span = np.where(hi > lo, hi - lo, 1.0)
    return np.clip((x - lo) / span, 0.0, 1.0)


def normalize_rows(features: np.ndarray) -> np.ndarray:
    """Scale every non-zero row to unit L2 norm, so the logistic loss is 1-Lipschitz (G = 1)."""
    x = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _row_norms(x: np.ndarray) -> np.ndarray:
    """L2 norm of every row; rows whose plain norm overflows (finite entries above ~1e154) are
    rescaled by their largest entry first, so the norm is inf only if the true norm is."""
    with np.errstate(over="ignore"):
        norms = np.linalg.norm(x, axis=1)
        bad = ~np.isfinite(norms)
        if bad.any():
            top = np.abs(x[bad]).max(axis=1)
            norms[bad] = top * np.linalg.norm(x[bad] / top[:, None], axis=1)
    return norms


class LogisticERM:
    """L2-regularised (or plain) logistic regression on a fixed dataset, in float64 numpy.

    Args:
        features: ``[n, p]`` finite feature matrix.
        labels: ``[n]`` labels in {-1, +1} ({0, 1} is accepted and mapped 0 -> -1).
        l2: regularisation weight ``lam >= 0`` of ``(lam/2) ||w||^2``.

    Raises:
        DataError: non-finite features, wrong shapes or labels outside {-1, 0, +1}.
        ConfigError: negative ``l2``.
    """

    def __init__(self, *, features, labels, l2: float = 0.0):
        x = np.ascontiguousarray(np.asarray(features, dtype=np.float64))
        y = np.asarray(labels, dtype=np.float64).reshape(-1)
        if x.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
            raise DataError(f"features must be [n, p] with n = len(labels) > 0; got {x.shape} and {y.shape}")
        if not np.all(np.isfinite(x)):
            raise DataError("features contain NaN or inf")
        vals = set(np.unique(y).tolist())
        if not vals <= {-1.0, 1.0, 0.0} or (0.0 in vals and -1.0 in vals):
            # The problem, never the values: a label outside the set is one record's data.
            what = "both 0 and -1 occur" if vals <= {-1.0, 1.0, 0.0} else "some label is outside {-1, 0, +1}"
            raise DataError(f"labels must be in {{-1, +1}} (or {{0, 1}}): {what}")
        if not (math.isfinite(l2) and l2 >= 0):
            raise ConfigError(f"l2 must be a finite number >= 0, got {l2!r}")
        self.x = x
        self.y = np.where(y == 0.0, -1.0, y)
        self.l2 = float(l2)
        self.row_norms = _row_norms(x)

    # ------------------------------------------------------------------ sizes and constants
    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def dim(self) -> int:
        return int(self.x.shape[1])

    def lipschitz(self) -> float:
        """G = max_i ||x_i|| bounds every per-sample gradient norm of the logistic part."""
        return float(self.row_norms.max())

    def smoothness(self) -> float:
        """L of ``F^r``: ``max_i ||x_i||^2 / 4 + lam`` (the logistic curvature is at most 1/4)."""
        return float(self.row_norms.max() ** 2 / 4.0 + self.l2)

    # ------------------------------------------------------------------ values
    def losses(self, w: np.ndarray) -> np.ndarray:
        """Per-sample logistic losses ``[n]``."""
        return np.logaddexp(0.0, -self.y * (self.x @ w))

    def objective(self, w: np.ndarray) -> float:
        """``F^r(w)``: mean logistic loss plus the L2 term."""
        w = np.asarray(w, dtype=np.float64)
        return float(self.losses(w).mean() + 0.5 * self.l2 * (w @ w))

    # ------------------------------------------------------------------ gradients
    def grad_coefficients(self, w: np.ndarray, idx=None, *, clip: float | None = None) -> np.ndarray:
        """Scalar ``c_i`` with per-sample gradient ``g_i(w) = c_i * x_i``, optionally clipped at ``clip``.

        ``c_i = -y_i sigmoid(-y_i w^T x_i)``; with ``clip`` the coefficient is scaled by
        ``min(1, clip / ||g_i||)`` (the usual per-sample L2 clipping, in closed form), and a record
        whose clipped coefficient is not finite (``0·inf`` for a row norm that overflows, a margin
        ``inf − inf``) contributes nothing: a NaN would make the released sum NaN.
        """
        x = self.x if idx is None else self.x[idx]
        y = self.y if idx is None else self.y[idx]
        s = expit(-y * (x @ w))  # sigmoid(-margin), stable at any margin; x, not y*x: one matrix in cache
        coef = -y * s
        if clip is not None:
            norms = s * (self.row_norms if idx is None else self.row_norms[idx])  # ||g_i||, as |y_i| = 1
            with np.errstate(invalid="ignore"):
                coef *= np.minimum(1.0, clip / np.maximum(norms, 1e-300))
            coef = np.where(np.isfinite(coef), coef, 0.0)
        return coef

    def per_sample_grads(self, w: np.ndarray, idx=None, *, clip: float | None = None) -> np.ndarray:
        """Per-sample gradients of the logistic loss, ``[B, p]`` (no regulariser)."""
        x = self.x if idx is None else self.x[idx]
        return self.grad_coefficients(w, idx, clip=clip)[:, None] * x

    def loss_gradient(self, w: np.ndarray) -> np.ndarray:
        """Gradient of the mean logistic loss (no regulariser)."""
        return self.grad_coefficients(w) @ self.x / self.n

    def gradient(self, w: np.ndarray) -> np.ndarray:
        """Gradient of ``F^r``."""
        w = np.asarray(w, dtype=np.float64)
        return self.loss_gradient(w) + self.l2 * w

    # ------------------------------------------------------------------ reference optimum
    def solve(self, *, tol: float = 1e-12, max_iter: int = 20000, constraint=None) -> tuple[np.ndarray, float]:
        """Non-private minimiser; returns ``(w_star, F_star)``.

        Used only to report optimality gaps ``F^r(w_private) - F*`` (evaluation, not training).
        Unconstrained: scipy L-BFGS (``tol`` on the gradient). Without regularisation the optimum then
        exists only for non-separable data; the returned value is the infimum reached to tolerance.

        Args:
            tol: unconstrained: gradient tolerance; constrained: the certified Frank-Wolfe gap
                (``<grad F(w), w - s>`` with ``s`` the set's linear minimiser, an upper bound on
                ``F(w) - F*``) to reach. That gap is first-order in the distance to the optimum, so
                in float64 it stalls near 1e-9 while ``F(w) - F*`` is already at rounding level; the
                solver stops there too (no projected step decreases ``F``).
            max_iter: iteration cap.
            constraint: a constraint set with ``project(x)`` and ``linear_minimizer(g)`` (e.g. a
                :mod:`privopt.algorithms.mirror` geometry); solved by accelerated projected gradient
                (FISTA with backtracking and adaptive restart).
        """
        if constraint is not None:
            return self._solve_constrained(constraint, tol=tol, max_iter=max_iter)
        from scipy.optimize import minimize

        res = minimize(
            lambda w: (self.objective(w), self.gradient(w)),
            np.zeros(self.dim),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "maxfun": 2 * max_iter, "gtol": tol, "ftol": 1e-15, "maxcor": 30},
        )
        w = self._newton_polish(np.asarray(res.x, dtype=np.float64))
        return w, self.objective(w)

    def _newton_polish(self, w: np.ndarray, steps: int = 10) -> np.ndarray:
        """A few Newton steps after L-BFGS (p is small): the optimum to rounding, not to L-BFGS's tolerance."""
        for _ in range(steps):
            g = self.gradient(w)
            s = expit(-self.y * (self.x @ w))
            hessian = (self.x.T * (s * (1.0 - s))) @ self.x / self.n + self.l2 * np.eye(self.dim)
            try:
                w_new = w - np.linalg.solve(hessian, g)
            except np.linalg.LinAlgError:
                break
            f, f_new = self.objective(w), self.objective(w_new)
            if not (f_new <= f + 1e-14 * abs(f) and np.linalg.norm(self.gradient(w_new)) < np.linalg.norm(g)):
                break
            w = w_new
        return w

    def frank_wolfe_gap(self, w: np.ndarray, constraint) -> float:
        """``max_{s in K} <grad F(w), w - s>``: an upper bound on ``F(w) - min_K F`` for ``w`` in ``K``."""
        g = self.gradient(w)
        return float(g @ (w - constraint.linear_minimizer(g)))

    def _solve_constrained(self, constraint, *, tol: float, max_iter: int) -> tuple[np.ndarray, float]:
        w = constraint.project(np.zeros(self.dim))
        v, f_w, momentum = w.copy(), self.objective(w), 1.0
        lip = self.smoothness() / 64.0  # backtracking raises it as needed
        stalled = False
        for _ in range(max_iter):
            g_v, f_v = self.gradient(v), self.objective(v)
            while True:
                w_new = constraint.project(v - g_v / lip)
                d = w_new - v
                f_new = self.objective(w_new)
                if f_new <= f_v + g_v @ d + 0.5 * lip * (d @ d) + 1e-15 * abs(f_v):
                    break
                lip *= 2.0
            if f_new > f_w:  # adaptive restart: drop the momentum when the objective goes up
                if stalled:  # a plain projected step from w cannot decrease F either: F(w) is F* to rounding
                    break
                v, momentum, stalled = w.copy(), 1.0, True
                continue
            stalled = False
            nxt = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * momentum**2))
            v = w_new + ((momentum - 1.0) / nxt) * (w_new - w)
            w, f_w, momentum = w_new, f_new, nxt
            if self.frank_wolfe_gap(w, constraint) <= tol:
                break
        return w, self.objective(w)
