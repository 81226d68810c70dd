"""DP-SVRG (strongly convex) and DP-SVRG++ (convex) for linear logistic ERM (Paper B).

Every inner step releases the variance-reduced gradient

    v = [clip(g_i(x)) - clip(g_i(x~))] + N(0, s1^2 I)  +  mean_j clip(g_j(x~)) + N(0, s2^2 I)

as two accounted releases: the one-record difference (``SingleRecord(n)`` sampling —
realised as Poisson(1/n) under add/remove neighbours, one uniform record under replace-one,
per-record bound ``2C``, noise ``"diff"``) and the snapshot mean gradient (``FullBatch``, bound
``C``, normaliser ``n``, noise ``"snapshot"``). The paper re-releases the snapshot gradient with
fresh noise at every inner step and splits the noise equally (``s1 = s2``); the knob
``snapshot_noise_ratio = s2/s1`` keeps that default. The L2 regulariser is data-independent and
handled exactly by the proximal step ``prox(v) = v / (1 + eta * l2)``.

Step sizes are constant: the paper's SVRG-BB rule uses un-noised full gradients and leaks, so it
is not offered. See ``docs/algorithms/erm.md``.

Speed: inner steps touch one record each, so they run as a vectorised numpy loop per block of
steps. The block's steps (derived from the release plan, exactly what
:class:`~privopt.grads.release.PrivateBatch` would record) are recorded in the ledger BEFORE its
noise is drawn, so the budget guard can still refuse them before anything is released; the noise
is drawn from ``ctx.noise_rng`` with the same std ``z * bound / normaliser``. Per-sample gradients at the
snapshot are cached for the epoch, so an epoch costs ``n + m`` gradient evaluations.

Example:
    >>> from privopt.algorithms.svrg import DPSVRG
    >>> algo = DPSVRG(epochs=15, inner=5000, step_size=0.1, l2=1e-2)
    >>> [s.count for s in algo.inventory(n=200_000).steps]
    [75000, 75000]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import non_negative, param, positive, positive_int
from privopt.algorithms.erm_common import LinearERMAlgorithm, LinearERMConfig, single_thread_blas
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, Query, ReleasePlan, SingleRecordBatch
from privopt.grads.release import ReleaseEvent, draw_gaussian_noise, notify_release, releases_observed
from privopt.privacy.events import FullBatch
from privopt.sampling import single_record_draws

__all__ = ["DPSVRG", "DPSVRGConfig", "DPSVRGPlusPlus", "DPSVRGPlusPlusConfig", "svrg_inner_loop"]

_BLOCK = 8192  # inner steps per vectorised block (bounds the noise buffer to ~3.5 MB at p = 54)


def svrg_inner_loop(
    problem,
    *,
    x_start: np.ndarray,
    snap_coef: np.ndarray,
    indices: np.ndarray,
    counts: np.ndarray,
    drift: np.ndarray,
    step_size: float,
    clip: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``len(counts)`` proximal SVRG steps; return ``(last iterate, sum of iterates)``.

    Step t uses the ``counts[t]`` records ``B_t`` that follow in ``indices`` (see
    :func:`privopt.sampling.single_record_draws`; usually one, possibly none or several):
    ``x <- prox(x - eta * (sum_{i in B_t} (c_i(x) - snap_coef[i]) * x_i + drift[t]))`` where
    ``c_i(x) x_i`` is the clipped gradient of record ``i`` at ``x`` and ``drift[t]`` holds
    everything that does not depend on ``x`` (snapshot mean gradient plus both noises).
    """
    xs, ys, norms = problem.x, problem.y, problem.row_norms
    shrink = 1.0 / (1.0 + step_size * problem.l2)
    x = np.array(x_start, dtype=np.float64, copy=True)
    acc = np.zeros_like(x)
    idx_list, pos = indices.tolist(), 0
    for t, c in enumerate(counts.tolist()):
        direction = drift[t]
        for i in idx_list[pos : pos + c]:
            xi = xs[i]
            yi = ys[i]
            margin = yi * float(xi @ x)
            # sigmoid(-margin) without overflow
            if margin >= 0:
                e = math.exp(-margin)
                s = e / (1.0 + e)
            else:
                s = 1.0 / (1.0 + math.exp(margin))
            coef = -yi * s
            gnorm = s * norms[i]
            if gnorm > clip:
                coef *= clip / gnorm
            elif not gnorm <= clip:  # NaN (0·inf, or a margin inf − inf): the record contributes nothing
                coef = 0.0
            direction = direction + (coef - snap_coef[i]) * xi
        pos += c
        x = (x - step_size * direction) * shrink
        acc += x
    return x, acc


def _notify_snapshot_releases(values: np.ndarray, *, std: float, clip: float, n: int) -> None:
    """Hand each inner step's noisy snapshot mean (rows of ``values``; noise std ``std`` on the sum,
    bound ``clip``, full batch, normaliser ``n``) to the release observers, as ``PrivateBatch``
    would: the vectorised loop draws that noise itself. The one-record differences are not handed
    out (their bound combines two clipped gradients)."""
    for row in values:
        notify_release(ReleaseEvent("snapshot", torch.from_numpy(row.copy()), std, clip, FullBatch(), float(n)))


@dataclass(frozen=True)
class DPSVRGConfig(LinearERMConfig):
    """DP-SVRG's hyper-parameters.

    Attributes:
        epochs: number of epochs T (snapshots).
        inner: inner steps m per epoch.
        step_size: constant step eta (theory: eta < 1/(12 L)).
        l2: L2 weight (proximal step); > 0 for the strongly convex setting.
        clip: per-sample gradient bound G (gradients are clipped to it).
        snapshot_noise_ratio: std of the snapshot-gradient noise over the one-record noise (1 = paper).
    """

    l2: float = param(1e-2, non_negative)
    epochs: int = param(15, positive_int, role="epochs")
    inner: int = param(5000, positive_int)
    step_size: float = param(0.1, positive, role="lr")
    snapshot_noise_ratio: float = param(1.0, positive)


@dataclass(frozen=True)
class DPSVRGPlusPlusConfig(DPSVRGConfig):
    """DP-SVRG++: epoch s has ``inner * 2^s`` steps (fields as :class:`DPSVRGConfig`)."""

    l2: float = param(0.0, non_negative)
    inner: int = param(10, positive_int)
    step_size: float = param(0.01, positive, role="lr")


class _SVRGBase(LinearERMAlgorithm):
    doubling: bool = False
    state_arrays = ("x_start", "snapshot")

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._x_start: np.ndarray | None = None
        self._snapshot: np.ndarray | None = None

    # ------------------------------------------------------------------ privacy schedule
    def epoch_length(self, s: int) -> int:
        """Inner steps of epoch ``s`` (1-based)."""
        return self.config.inner * (2**s if self.doubling else 1)

    def total_inner_steps(self) -> int:
        return sum(self.epoch_length(s) for s in range(1, self.config.epochs + 1))

    def release_plan(self, n: int) -> ReleasePlan:
        """Every inner step: the one-record difference (bound 2C) and the snapshot mean (bound C,
        full batch). Equal noise stds s1 = s2 (times the ratio): s1 = z_diff·2C, s2 = z_snap·C/n,
        hence z_snap / z_diff = 2n·ratio."""
        c = self.config
        diff = Query("diff", Fixed(c.clip, factor=2.0), batch=SingleRecordBatch(n))
        snapshot = Query("snapshot", Fixed(c.clip), batch=BatchPlan(n, n), ratio=2.0 * n * c.snapshot_noise_ratio)
        return ReleasePlan(phases=(Phase("inner", self.total_inner_steps(), (diff, snapshot)),))

    # ------------------------------------------------------------------ state
    def _start(self, w0: np.ndarray) -> None:
        self._x_start = w0.copy()
        self._snapshot = w0.copy()

    def output(self) -> np.ndarray:
        return self._snapshot

    def num_steps(self) -> int:
        return self.config.epochs

    # ------------------------------------------------------------------ one epoch
    def step(self, t: int) -> dict[str, float]:
        """Epoch ``t + 1``: snapshot gradient, ``m_s`` noisy proximal steps, epoch average."""
        with single_thread_blas():
            return self._epoch(t)

    def _noise_stds(self) -> tuple[float, float] | None:
        """(std of the one-record difference noise, std of the snapshot-mean noise), or None."""
        ctx, c = self._ctx, self.config
        if not (self.private and ctx.ledger is not None):
            return None
        z = self.releases.noise_for(("diff", "snapshot"))
        return z["diff"] * (c.clip * 2.0), z["snapshot"] * c.clip / self.problem.n

    def _epoch(self, t: int) -> dict[str, float]:
        ctx, prob = self._ctx, self.problem
        n, c = prob.n, self.config.clip
        m = self.epoch_length(t + 1)
        snap_coef = prob.grad_coefficients(self._snapshot, clip=c)
        mu = snap_coef @ prob.x  # clipped SUM (bound C per record), released with normaliser n
        self._grad_evals += n
        stds = self._noise_stds()
        x, acc = self._x_start, np.zeros(prob.dim)
        for start in range(0, m, _BLOCK):
            k = min(_BLOCK, m - start)
            neighbouring = ctx.ledger.neighbouring if stds is not None else "replace_one"
            idx, counts = single_record_draws(n=n, steps=k, neighbouring=neighbouring, rng=ctx.sampler_rng)
            idx, counts = idx.numpy(), counts.numpy()
            drift = np.broadcast_to(mu / n, (k, prob.dim))
            self.releases.record_phase("inner", k)  # recorded before any noise is drawn (budget guard)
            if stds is not None:
                noise = draw_gaussian_noise((2, k, prob.dim), std=1.0, rng=ctx.noise_rng, dtype=torch.float64).numpy()
                drift = drift + stds[0] * noise[0] + stds[1] * noise[1]
                if releases_observed():
                    _notify_snapshot_releases(mu / n + stds[1] * noise[1], std=stds[1] * n, clip=c, n=n)
            x, block_sum = svrg_inner_loop(
                prob,
                x_start=x,
                snap_coef=snap_coef,
                indices=idx,
                counts=counts,
                drift=drift,
                step_size=self.config.step_size,
                clip=c,
            )
            acc += block_sum
            self._grad_evals += int(counts.sum())
        self._snapshot = acc / m
        # DP-SVRG restarts from the new snapshot; SVRG++ continues from the last iterate.
        self._x_start = x if self.doubling else self._snapshot.copy()
        self._sync_model()
        return {"epoch_length": float(m)}


@register_algorithm
class DPSVRG(_SVRGBase):
    """DP-SVRG for L2-regularised logistic regression (hyper-parameters: :class:`DPSVRGConfig`)."""

    name = "dp-svrg"
    summary = "DP-SVRG: noisy proximal SVRG for strongly convex linear logistic ERM (Paper B)"
    Config = DPSVRGConfig


@register_algorithm
class DPSVRGPlusPlus(_SVRGBase):
    """DP-SVRG++: epoch s has ``inner * 2^s`` steps and starts from the previous epoch's last
    iterate; the output is the last epoch's average (hyper-parameters: :class:`DPSVRGPlusPlusConfig`)."""

    name = "dp-svrg-pp"
    summary = "DP-SVRG++: noisy SVRG++ with doubling epochs for convex linear logistic ERM (Paper B)"
    doubling = True
    Config = DPSVRGPlusPlusConfig
