"""DP-SGDA and PrivateDiff: reconstructions of Paper A's baselines on the primal–dual form.

Both solve ``min_x max_{p∈Δ_n, n·p ≤ A} Σ_i p_i ℓ_i − λ·D_ψ(p, 1/n)`` with the dual iterate stored
as ``r = n·p`` (mean 1, at most the public weight cap A). Each step releases the batch's clamped
losses as an n-vector with Gaussian noise on every coordinate (an unbiased estimate of the full
loss vector) for the ascent on r, followed by a projection onto ``{0 ≤ r ≤ A, mean r = 1}``; the
x-query is the capped-weight sum ``Σ r_i·Clip(∇ℓ_i, C)`` (DP-SGDA) or a SPIDER estimator of it
(PrivateDiff), as for every DRO method. The paper specifies neither: see ``docs/algorithms/dro.md``
("Baselines") for what is reconstructed and the privacy inventory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import flag, mapping, one_of, optional_positive, param, positive, positive_int, text
from privopt.algorithms.dro_common import DROAlgorithm, DROConfig, check_difference_thresholds, weight_cap_value
from privopt.algorithms.estimators import SpiderEstimator
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, Query, ReleasePlan, StepProportional
from privopt.errors import ConfigError
from privopt.grads.sums import BoundedSum, clamped_losses
from privopt.objectives.divergences import get_divergence

__all__ = ["DPSGDA", "DPSGDAConfig", "PrivateDiff", "PrivateDiffConfig", "project_capped_mean_one", "project_mean_one"]

_R_FLOOR = 1e-12
_BISECTION_STEPS = 100  # halves the bracket [min r − A, max r] to below float64 resolution


def project_mean_one(r: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of ``r`` onto ``{r ≥ 0, mean(r) = 1}`` (= n·projection onto Δ_n).

    Sort-based algorithm (Held et al. / Duchi et al. 2008), O(n log n).

    Example:
        >>> project_mean_one(torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)).tolist()
        [3.0, 0.0, 0.0]
        >>> project_mean_one(torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64)).tolist()
        [1.5, 1.5, 0.0]
    """
    n = r.numel()
    total = float(n)
    u, _ = torch.sort(r, descending=True)
    css = torch.cumsum(u, 0) - total
    k = torch.arange(1, n + 1, dtype=r.dtype)
    cond = u - css / k > 0
    rho = int(torch.nonzero(cond).max()) + 1
    theta = css[rho - 1] / rho
    return torch.clamp(r - theta, min=0.0)


def project_capped_mean_one(r: torch.Tensor, cap: float) -> torch.Tensor:
    """Euclidean projection of ``r`` onto ``{0 ≤ r ≤ cap, mean(r) = 1}`` (``cap ≥ 1``).

    The projection is ``clamp(r − θ, 0, cap)`` for the ``θ`` at which the mean is 1 (the mean is
    non-increasing in θ): found by bisection. An infinite cap is :func:`project_mean_one`.

    Example:
        >>> r = project_capped_mean_one(torch.tensor([9.0, 0.0, 0.0, 0.0], dtype=torch.float64), 2.0)
        >>> [round(v, 6) for v in r.tolist()]
        [2.0, 0.666667, 0.666667, 0.666667]
    """
    if math.isinf(cap):
        return project_mean_one(r)
    lo, hi = float(r.min()) - cap, float(r.max())  # mean(clamp(r − lo)) = cap ≥ 1, mean(clamp(r − hi)) = 0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if float((r - mid).clamp(0.0, cap).mean()) >= 1.0:
            lo = mid
        else:
            hi = mid
    return (r - lo).clamp(0.0, cap)


def _aligned(weights: torch.Tensor, chunk: int):
    """The weights of a batch as the per-chunk callable of ``DROAlgorithm._weighted_grad_sum`` (it
    visits the batch in consecutive chunks of ``chunk`` records, once per point)."""
    parts = iter(weights.split(chunk))
    return lambda _losses: next(parts)


@dataclass(frozen=True)
class PrimalDualConfig(DROConfig):
    """Shared hyper-parameters: ψ, the penalty λ, the x step ``lr``, the dual step ``dual_lr``, the
    x-gradient threshold ``clip_x``, the weight cap A (``r ≤ A``: the x-query's per-record bound is
    ``A·clip_x``), the loss clamp B (the loss vector's per-record bound) and ``loss_noise_ratio``,
    the loss vector's noise multiplier relative to the x-query's (one calibration).

    Defaults (``docs/algorithms/dro.md``, "Defaults"): A = 1.25, B = 2 and a loss-vector noise
    multiplier 3 times the x-query's, because the loss vector's noise lands on every one of the n
    dual coordinates, so the dual is mostly noise whatever its budget: a cap near 1 keeps the
    x-query's noise near DP-SGD's, and most of the budget goes to the x-gradient. The former
    values (A = 4, B = 10, ratio 1, lr 0.1) are in
    :data:`~privopt.algorithms.dro_presets.PAPER_DEFAULTS`."""

    divergence: str = param("kl", text)
    divergence_params: Mapping[str, Any] = param({}, mapping)
    lam: float = param(1e-3, positive, role="penalty")
    lr: float = param(0.25, positive, role="lr")
    dual_lr: float = param(0.01, positive)
    clip_x: float = param(1.0, positive, role="clip")
    weight_cap: float = param(1.25, weight_cap_value, role="weight_cap")
    loss_bound: float = param(2.0, positive)
    loss_noise_ratio: float = param(3.0, positive)
    output: str = param("last", one_of("random", "last"), role="output")
    private: bool = param(True, flag)

    def check(self) -> None:
        div = get_divergence(self.divergence, **self.divergence_params)
        probe = div.psi_grad(torch.tensor([_R_FLOOR, 1.0, 1e6], dtype=torch.float64))
        if not bool(torch.isfinite(probe).all()):
            raise ConfigError(
                f"divergence {self.divergence!r} has psi' infinite on (0, inf) (bounded domain); "
                "the primal-dual methods support kl, chi2 and cressie_read"
            )


@dataclass(frozen=True)
class DPSGDAConfig(PrimalDualConfig):
    """DP-SGDA: one Poisson batch of expected size ``batch_size`` per step."""

    batch_size: int = param(128, positive_int, role="batch")


@dataclass(frozen=True)
class PrivateDiffConfig(PrimalDualConfig):
    """PrivateDiff: SPIDER on x with phase ``q``, refresh batch ``refresh_batch``, correction batch
    ``batch_size`` and threshold ``min(clip_x_diff, gamma_x·distance)`` (``clip_x_diff = None``: no cap).

    Defaults: short phases (q = 2) of a refresh on 128 records and cheap corrections on 32 records
    capped at 0.1. The dual moves under the loss vector's noise every step, so ``max_i |Δr_i|`` keeps
    a step-proportional threshold at its cap; the former uncapped threshold (with q = 32) grew with
    the dual's noise and the run diverged (``docs/algorithms/dro.md``, "Defaults")."""

    q: int = param(2, positive_int, role="phase")
    refresh_batch: int = param(128, positive_int, role="refresh_batch")
    batch_size: int = param(32, positive_int, role="batch")
    gamma_x: float | None = param(10.0, optional_positive)
    clip_x_diff: float | None = param(0.1, optional_positive, role="clip_cap")

    def check(self) -> None:
        super().check()
        check_difference_thresholds(self, ("x",))


class _PrimalDualBase(DROAlgorithm):
    """Shared state, statistics and dual step of the reconstructions on the primal–dual form."""

    state_values = ("r", "r_prev", "x_prev")

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._div = get_divergence(self.config.divergence, **self.config.divergence_params)

    def _loss_query(self, host: str) -> Query:
        """The loss-vector release riding on ``host``'s batch (one record moves one coordinate ≤ B)."""
        c = self.config
        return Query("p-grad", Fixed(c.loss_bound), on=host, estimate="total", ratio=c.loss_noise_ratio)

    def _init_state(self, n: int) -> None:
        device = self._ctx.x_train.device
        self._r, self._r_prev, self._x_prev = torch.ones(n, dtype=torch.float64, device=device), None, None

    @property
    def dual_weights(self) -> torch.Tensor:
        """The current dual iterate ``r = n·p`` (released: built from noisy releases only)."""
        return self._r

    # -- pre-noise statistics ----------------------------------------------------------------
    def loss_vector_sum(self, idx: torch.Tensor, *, x: torch.Tensor | None = None, clip: float | None = None):
        """n-vector with the batch's losses clamped to ``[0, clip]`` (default B) at their coordinates."""
        clip = self.config.loss_bound if clip is None else clip
        out = torch.zeros(self._ctx.n, dtype=torch.float64, device=self._ctx.x_train.device)
        if idx.numel():
            out[idx] = clamped_losses(self._losses(idx, x), clip)
        return BoundedSum(out, bound=clip)

    def x_grad_sum(self, idx: torch.Tensor, *, r: torch.Tensor, clip: float, x: torch.Tensor | None = None):
        """``Σ_{i∈idx} r_i·Clip(∇ℓ_i(x), C)`` with ``r_i`` clamped to ``[0, A]`` (bound ``A·C``; [d])."""
        chunk = self.config.chunk_size
        return self._weighted_grad_sum(idx, clip=clip, x=x, weights=_aligned(r[idx], chunk), cap=self.config.weight_cap)

    def x_diff_sum(
        self,
        idx: torch.Tensor,
        *,
        r: torch.Tensor,
        r_prev: torch.Tensor,
        x_prev: torch.Tensor,
        clip: float,
        x: torch.Tensor | None = None,
    ):
        """``Σ Clip(r_i·Clip(∇ℓ_i(x), C_x) − r'_i·Clip(∇ℓ_i(x_prev), C_x), C)`` ([d]): the difference of
        the per-record terms of :meth:`x_grad_sum` at the two points."""
        c = self.config
        return self._weighted_diff_sum(
            idx,
            clip=clip,
            grad_clip=c.clip_x,
            weights=_aligned(r[idx], c.chunk_size),
            weights_prev=_aligned(r_prev[idx], c.chunk_size),
            cap=c.weight_cap,
            x=x,
            x_prev=x_prev,
        )

    def _dual_step(self, r: torch.Tensor, loss_estimate: torch.Tensor) -> torch.Tensor:
        direction = loss_estimate - self.config.lam * self._div.psi_grad(r.clamp_min(_R_FLOOR))
        return project_capped_mean_one(r + self.config.dual_lr * direction, self.config.weight_cap)

    def _losses_released(self, phase) -> torch.Tensor:
        return phase.release("p-grad", lambda idx, c: self.loss_vector_sum(idx, clip=c))


@register_algorithm
class DPSGDA(_PrimalDualBase):
    """DP-SGDA on the primal–dual form — a RECONSTRUCTION (the paper gives no pseudocode).

    Each step draws one Poisson batch and releases, as one accounted step, the x-gradient
    ``(Σ r_i·Clip(∇ℓ_i, C) + N(0,(z A C)² I_d))/b`` and the loss vector
    ``(Σ_{i∈B} ℓ_i e_i + N(0,(z' B)² I_n))/(b/n)`` (``z' = loss_noise_ratio·z``); then simultaneously
    ``x ← x − lr·ĝ_x`` and ``r ← Proj(r + dual_lr·(ℓ̂ − λψ'(r)))`` onto ``{0 ≤ r ≤ A, mean r = 1}``.
    With ``q = 1`` and ``refresh_batch = batch_size``, :class:`PrivateDiff` is this algorithm.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> [s.count for s in get_algorithm("dp-sgda", epochs=2, batch_size=100).inventory(n=1000).steps]
        [20]
    """

    name = "dp-sgda"
    summary = "DP-SGDA on the primal-dual DRO form (reconstruction)"
    Config = DPSGDAConfig

    def _planned_T(self, n: int) -> int:
        return max(1, math.ceil(self.config.epochs * n / min(self.config.batch_size, n)))

    def release_plan(self, n: int) -> ReleasePlan:
        """Every step: the x-gradient and the loss vector from one batch."""
        c = self.config
        x_grad = Query("x-grad", Fixed(c.clip_x, factor=c.weight_cap), batch=BatchPlan(c.batch_size, n))
        return ReleasePlan(phases=(Phase("step", self._T_for(n), (x_grad, self._loss_query("x-grad"))),))

    def setup(self, ctx) -> None:
        self._bind(ctx)
        self._init_state(ctx.n)

    def step(self, t: int) -> dict[str, float]:
        r, x_t = self._r, self._x()
        phase = self.releases.phase("step")
        g_x = phase.release("x-grad", lambda idx, c: self.x_grad_sum(idx, r=r, clip=c))
        loss_hat = self._losses_released(phase)
        x_next = x_t - self.config.lr * self._lr_factor(t) * g_x
        self._set_x(x_next)
        self._r = self._dual_step(r, loss_hat)
        self._maybe_save(t + 1, x_next)
        return {"g_norm": float(g_x.norm()), "r_max": float(self._r.max())}


@register_algorithm
class PrivateDiff(_PrimalDualBase):
    """PrivateDiff-style DP descent–ascent on the primal–dual form — a RECONSTRUCTION.

    x-estimator: SPIDER with refresh every ``q`` steps (batch ``refresh_batch``, threshold
    ``clip_x``) and step-proportional clipped differences in between (batch ``batch_size``,
    threshold ``min(clip_x_diff, gamma_x·max(‖Δx‖, max_i|Δr_i|))``); dual: the DP-SGDA loss-vector
    release on the same batch each step. A difference with zero distance is skipped.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> inv = get_algorithm("private-diff", steps=64, q=16, refresh_batch=500, batch_size=50).inventory(n=1000)
        >>> [(s.mechanisms, s.count) for s in inv.steps]
        [((('x-refresh', 1.0), ('p-grad', 3.0)), 4), ((('x-diff', 1.0), ('p-grad', 3.0)), 60)]
    """

    name = "private-diff"
    summary = "PrivateDiff-style SPIDER descent-ascent on the primal-dual DRO form (reconstruction)"
    Config = PrivateDiffConfig
    state_estimators = ("v",)

    def _phase_sizes(self) -> tuple[int, int]:
        return self.config.refresh_batch, self.config.batch_size

    def release_plan(self, n: int) -> ReleasePlan:
        """Refresh ceil(T/q) times and correct T − ceil(T/q) times; the loss vector every step."""
        c, (T, refreshes) = self.config, self._schedule(n)
        x_refresh = Query("x-refresh", Fixed(c.clip_x, factor=c.weight_cap), batch=BatchPlan(c.refresh_batch, n))
        x_diff = Query("x-diff", StepProportional(c.gamma_x, c.clip_x_diff), batch=BatchPlan(c.batch_size, n))
        return ReleasePlan(
            phases=(
                Phase("refresh", refreshes, (x_refresh, self._loss_query("x-refresh"))),
                Phase("diff", T - refreshes, (x_diff, self._loss_query("x-diff"))),
            )
        )

    def setup(self, ctx) -> None:
        self._bind(ctx)
        self._init_state(ctx.n)
        self.v = SpiderEstimator(refresh="x-refresh", correction="x-diff", period=self.config.q)

    def step(self, t: int) -> dict[str, float]:
        r, x_t, r_prev, x_prev = self._r, self._x(), self._r_prev, self._x_prev
        refresh = self.v.refresh_due(t)
        phase = self.releases.phase("refresh" if refresh else "diff")
        dist = 0.0 if refresh else max(float((x_t - x_prev).norm()), float((r - r_prev).abs().max()))
        sums = (self.x_grad_sum, self.x_diff_sum)
        v = self.v.update_at(phase, t=t, distance=dist, sums=sums, at={"r": r}, prev={"r": r_prev, "x": x_prev})
        loss_hat = self._losses_released(phase)
        x_next = x_t - self.config.lr * self._lr_factor(t) * v
        self._set_x(x_next)
        self._x_prev, self._r_prev, self._r = x_t, r, self._dual_step(r, loss_hat)
        self._maybe_save(t + 1, x_next)
        logs = {"clip_x_diff": phase.thresholds["x-diff"]} if "x-diff" in phase.thresholds else {}
        return {**logs, "v_norm": float(v.norm()), "r_max": float(self._r.max())}
