"""DP Recursive-SPIDER (Paper A, Algorithm 3) for KL-constrained DRO, and the non-private SCDRO.

Solves ``min_x min_{λ≥λ0} Ψ(x, λ) = λ log mean_i exp(ℓ_i/λ) + λρ`` in compositional form
``f(g(w))`` with ``w = (x, λ)``, through the shifted inner function ``h(w; ξ) = exp((ℓ − c)/λ)``.
Two SPIDER estimators (``v ≈ ∇_x h2``, ``u ≈ ∂_λ h2``) and a STORM tracker (``s ≈ h2``) are
combined by the data-independent outer chain rule ``z = ((λ/s)·v, (λ/s)·u + log s + ρ)``.

What is implemented, the deviations from the printed algorithm (shift, safeguards, STORM form,
step rules) and why, and the privacy inventory: ``docs/algorithms/dro.md``
("DP Recursive-SPIDER", "SCDRO").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import (
    auto_or_positive,
    flag,
    one_of,
    optional_positive,
    param,
    positive,
    positive_int,
    unit_interval,
)
from privopt.algorithms.dro_common import (
    DROAlgorithm,
    SpiderDROConfig,
    check_difference_thresholds,
    initial_loss_scale,
    weight_cap_value,
)
from privopt.algorithms.estimators import SpiderEstimator, StormEstimator
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, Query, ReleasePlan, StepProportional
from privopt.errors import ConfigError
from privopt.grads.sums import BoundedSum, clipped_scalar_difference_sum, clipped_scalar_sum
from privopt.objectives.compositional import KLCompositional

__all__ = ["DPRecursiveSPIDER", "DPRecursiveSPIDERConfig", "SCDRO", "SCDROConfig"]


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else positive_int(name, value)


@dataclass(frozen=True)
class RecursiveSpiderConfig(SpiderDROConfig):
    """Hyper-parameters shared by DP Recursive-SPIDER and SCDRO.

    Attributes:
        rho: KL radius ρ. lam0: lower bound λ0 of λ. lam_init: initial λ.
        weight_cap: A. The inner function is capped, ``w = min(exp((ℓ − c)/λ), 1)``, and the shift
            c is re-centred at every refresh so that the mean weight is about ``1/A``: a record
            weighs at most about A times the mean.
        q: phase length. b1, b2, b3, b4: refresh/correction batch sizes of the v (∇_x w) and
            u (∂_λ w) estimators (≥ n means the full dataset). s_batch: expected batch size of
            each s update (``None``: b2; the paper's single record makes s pure noise under DP).
        lr: step on x. lr_norm: the largest x move per step (``"auto"``: ``lr``; ``None``: none).
        lam_lr: step on λ (separate from lr: λ moving with the x step made w jump by orders of
            magnitude). lam_step_frac: largest relative λ move per step (``None``: no cap).
        beta: STORM momentum β ∈ (0, 1] of s (1 = plain minibatch mean).
        loss_bound: public clamp B. lam_max: upper bound of λ (``"auto"`` = B/√(8ρ); ``None``: none).
        s_min: floor of s (post-processing; ``"auto"``: ``1e−3/A``, far below the target mean 1/A).
        share_batches: v- and u-queries share one batch when their sizes agree.

    The defaults are practical ones for a short run (``docs/algorithms/dro.md``, "Defaults"): a
    refresh every step (q = 1) on 128 records, lr 2, weight cap 1.25 and the last iterate; the
    paper's schedule (q = 32, refresh batches 2048, lr 0.1, A = 4, a random iterate) is
    :data:`~privopt.algorithms.dro_presets.PAPER_DEFAULTS`. SCDRO keeps its own (:class:`SCDROConfig`).
    """

    rho: float = param(0.5, positive, role="rho")
    lam0: float = param(1e-3, positive, role="lam0")
    lam_init: float = param(1.0, positive)
    b1: int = param(128, positive_int, role="refresh_batch")
    b2: int = param(128, positive_int, role="batch")
    b3: int = param(128, positive_int, role="refresh_batch")
    b4: int = param(128, positive_int, role="batch")
    s_batch: int | None = param(None, _optional_int, role="batch")
    lr: float = param(2.0, positive, role="lr")
    lr_norm: str | float | None = param("auto", auto_or_positive)
    lam_lr: float = param(0.05, positive)
    lam_step_frac: float | None = param(0.1, optional_positive)
    beta: float = param(0.5, unit_interval)
    loss_bound: float = param(10.0, positive)
    lam_max: str | float | None = param("auto", auto_or_positive)
    s_min: str | float = param("auto", auto_or_positive)
    share_batches: bool = param(True, flag)

    def check(self) -> None:
        if self.s_min is None:
            raise ConfigError("s_min must be 'auto' or a number > 0")
        if self.lam_init < self.lam0:
            raise ConfigError(f"lam_init ({self.lam_init}) must be >= lam0 ({self.lam0})")


@dataclass(frozen=True)
class DPRecursiveSPIDERConfig(RecursiveSpiderConfig):
    """DP Recursive-SPIDER: :class:`RecursiveSpiderConfig` plus the privacy thresholds.

    Attributes:
        clip_v: threshold C on each record's loss gradient (the v-query's per-record term
            ``w_i·Clip(∇ℓ_i, C)`` is at most C). clip_u, clip_s: thresholds of the scalar u- and
            s-queries (``"auto"``: 1/e and 1, the largest values their terms take, so they never bind).
        scalar_noise_ratio: noise multiplier of the scalar u- and s-queries relative to the v-queries
            (calibrated jointly; a scalar estimate tolerates more noise than a d-dimensional one).
        gamma_v, gamma_u: step-proportional factors of C2_t, C4_t (None: fixed thresholds).
        clip_v_diff, clip_u_diff: caps of C2_t, C4_t (``"auto"``: twice the refresh threshold).
        private: ``False`` runs the same clipped updates without noise (reference runs).
    """

    clip_v: float = param(1.0, positive, role="clip")
    scalar_noise_ratio: float = param(4.0, positive)
    clip_u: str | float = param("auto", auto_or_positive)
    clip_s: str | float = param("auto", auto_or_positive)
    gamma_v: float | None = param(10.0, optional_positive, role="gamma")
    gamma_u: float | None = param(10.0, optional_positive, role="gamma")
    clip_v_diff: str | float | None = param("auto", auto_or_positive)
    clip_u_diff: str | float | None = param("auto", auto_or_positive)
    private: bool = param(True, flag)

    def check(self) -> None:
        super().check()
        check_difference_thresholds(self, ("v", "u"))
        if self.clip_u is None or self.clip_s is None:
            raise ConfigError("clip_u and clip_s must be 'auto' or a number > 0")

    @property
    def thresholds(self) -> dict[str, float]:
        """Resolved refresh thresholds of v, u and s ("auto": the natural bounds 1/e and 1)."""
        u = 1.0 / math.e if self.clip_u == "auto" else float(self.clip_u)
        s = 1.0 if self.clip_s == "auto" else float(self.clip_s)
        return {"v": self.clip_v, "u": u, "s": s}

    def diff_cap(self, block: str) -> float | None:
        value = getattr(self, f"clip_{block}_diff")
        return 2.0 * self.thresholds[block] if value == "auto" else value


@register_algorithm
class DPRecursiveSPIDER(DROAlgorithm):
    """DP Recursive-SPIDER for KL-constrained DRO, jointly in ``w = (x, λ)``.

    Two SPIDER estimators (v of ``mean w_i·Clip(∇ℓ_i, C)``, u of ``mean λ∂_λ w_i``) and a STORM
    tracker (s of ``mean w_i``) on the capped, shifted inner function ``w = min(exp((ℓ−c)/λ), 1)``,
    combined by the outer chain rule ``z = (v/s, u/s + log s + ρ)``; the hyper-parameters of
    :class:`DPRecursiveSPIDERConfig`, the privacy schedule of :meth:`release_plan`. The STORM
    release is the one whose per-record bound is wider than its threshold: ``(2 − β)·C5``.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-recursive-spider", steps=64, q=16, b1=500, b3=500, b2=50, b4=50)
        >>> sorted((s.mechanisms, s.count) for s in algo.inventory(n=1000).steps)[0]
        ((('s', 4.0),), 60)
    """

    name = "dp-recursive-spider"
    summary = "DP Recursive-SPIDER (Paper A Alg. 3) on KL-constrained DRO"
    Config = DPRecursiveSPIDERConfig
    state_values, state_estimators = ("lam", "lam_prev", "x_prev", "shift"), ("v", "u", "s")

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        c = self.config
        self.objective = KLCompositional(rho=c.rho, lam0=c.lam0, loss_bound=c.loss_bound)
        lam_max = c.loss_bound / math.sqrt(8.0 * c.rho) if c.lam_max == "auto" else c.lam_max
        self.lam_max = None if lam_max is None else max(lam_max, c.lam_init)
        self.s_batch = c.b2 if c.s_batch is None else c.s_batch
        self._shift: float | None = None

    # ------------------------------------------------------------------ privacy schedule
    def _sensitivities(self) -> dict[str, Fixed | StepProportional]:
        c = self.config
        thr = c.thresholds
        return {
            "v-refresh": Fixed(thr["v"]),
            "u-refresh": Fixed(thr["u"]),
            "s-init": Fixed(thr["s"]),
            "v-diff": StepProportional(c.gamma_v, c.diff_cap("v")),
            "u-diff": StepProportional(c.gamma_u, c.diff_cap("u")),
            # Clip(w(w_t)) − (1−β)·Clip(w(w_{t−1})): a record contributes at most (2 − β)·C5.
            "s": Fixed(thr["s"], factor=2.0 - c.beta),
        }

    def _v_cap(self) -> float | None:
        return self.config.clip_v

    def _phase_sizes(self) -> tuple[int, int]:
        return self.config.b1, self.config.b2

    def release_plan(self, n: int) -> ReleasePlan:
        """Each refresh releases v, u and a fresh s on one batch (ceil(T/q) times); in between the
        v/u corrections and the STORM s update (T − ceil(T/q) times each)."""
        c, (T, refreshes), sens = self.config, self._schedule(n), self._sensitivities()
        r = getattr(c, "scalar_noise_ratio", 1.0)
        refresh = (
            Query("v-refresh", sens["v-refresh"], batch=BatchPlan(c.b1, n)),
            Query("u-refresh", sens["u-refresh"], batch=BatchPlan(c.b3, n), ratio=r),
            Query("s-init", sens["s-init"], on="v-refresh", ratio=r),
        )
        diff = (
            Query("v-diff", sens["v-diff"], batch=BatchPlan(c.b2, n)),
            Query("u-diff", sens["u-diff"], batch=BatchPlan(c.b4, n), ratio=r),
        )
        s_phase = Phase("s", T - refreshes, (Query("s", sens["s"], batch=BatchPlan(self.s_batch, n), ratio=r),))
        return self._spider_plan(n, refresh=refresh, diff=diff, extra=(s_phase,))

    # ------------------------------------------------------------------ setup & state
    def setup(self, ctx) -> None:
        self._bind(ctx)
        c = self.config
        self.v = SpiderEstimator(refresh="v-refresh", correction="v-diff", period=c.q)
        self.u = SpiderEstimator(refresh="u-refresh", correction="u-diff", period=c.q, scalar=True)
        self.s = StormEstimator(name="s", beta=c.beta)
        # Losses start near log K: c = log K + λ·log A puts the initial weights near 1/A.
        self._shift = float(initial_loss_scale(ctx) + c.lam_init * math.log(c.weight_cap))
        self._lam, self._lam_prev, self._x_prev = c.lam_init, None, None
        self._last_thresholds: dict[str, float] = {}

    def _load_output_scalars(self, saved: dict[str, Any]) -> None:
        self._lam = saved["lam"]

    @property
    def lam(self) -> float:
        """The current dual variable λ_t (released)."""
        return float(self._lam)

    @property
    def estimates(self) -> dict[str, Any]:
        """Current estimates ``v`` (mean w·Clip(∇ℓ)), ``u`` (mean λ∂_λ w), ``s`` (mean w)."""
        return {"v": self.v.value, "u": self.u.value, "s": self.s.value}

    @property
    def current_shift(self) -> float:
        """The shift c in use (released: a function of noisy estimates and public constants)."""
        return float(self._shift)

    # ------------------------------------------------------------------ pre-noise statistics
    # Sums over the batch ``idx`` of per-record clipped terms at ``w = (x, lam)`` (``x=None``: the
    # model's parameters) and ``w_prev``, each carrying its per-record bound (threshold ``clip``).
    def _weight_fn(self, lam: float):
        obj, shift, lam_f = self.objective, self._shift, float(lam)
        return lambda losses: obj.capped_weights(losses, lam_f, shift=shift)

    def v_grad_sum(self, idx, *, x, lam, clip) -> BoundedSum:
        """``Σ w_i·Clip(∇ℓ_i, C)`` with ``w_i ∈ (0, 1]``: bound C ([d])."""
        return self._weighted_grad_sum(idx, clip=clip, x=x, weights=self._weight_fn(lam), cap=1.0)

    def v_diff_sum(self, idx, *, x, lam, x_prev, lam_prev, clip) -> BoundedSum:
        """``Σ Clip(f_i(w) − f_i(w_prev), C_t)`` with ``f_i = w_i·Clip(∇ℓ_i, C)`` ([d])."""
        grad_clip = self._sensitivities()["v-refresh"].clip
        return self._weighted_diff_sum(
            idx,
            clip=clip,
            grad_clip=grad_clip,
            weights=self._weight_fn(lam),
            weights_prev=self._weight_fn(lam_prev),
            cap=1.0,
            x=x,
            x_prev=x_prev,
        )

    def _scalar(self, idx, x, lam, fn) -> torch.Tensor:
        if idx.numel() == 0:
            return torch.zeros(0, dtype=torch.float64, device=self._ctx.x_train.device)
        return fn(self._losses(idx, x), lam, shift=self._shift)

    def u_grad_sum(self, idx, *, x, lam, clip) -> BoundedSum:
        """``Σ Clip(λ∂_λ w_i, C)`` (1-element float64)."""
        return clipped_scalar_sum(self._scalar(idx, x, lam, self.objective.capped_lam_terms), clip)

    def u_diff_sum(self, idx, *, x, lam, x_prev, lam_prev, clip) -> BoundedSum:
        """``Σ Clip(λ∂_λ w_i(w) − λ'∂_λ w_i(w_prev), C)`` (1-element float64)."""
        terms = self.objective.capped_lam_terms
        return clipped_scalar_sum(self._scalar(idx, x, lam, terms) - self._scalar(idx, x_prev, lam_prev, terms), clip)

    def s_value_sum(self, idx, *, x, lam, clip) -> BoundedSum:
        """``Σ Clip(w_i, C)`` (a refresh of s; 1-element float64)."""
        return clipped_scalar_sum(self._scalar(idx, x, lam, self.objective.capped_weights), clip)

    def s_storm_sum(self, idx, *, x, lam, x_prev, lam_prev, beta, clip) -> BoundedSum:
        """``Σ [Clip(w_i(w), C) − (1−β)·Clip(w_i(w_prev), C)]`` (bound ``(2−β)·C``)."""
        w = self.objective.capped_weights
        return clipped_scalar_difference_sum(
            self._scalar(idx, x, lam, w), self._scalar(idx, x_prev, lam_prev, w), clip=clip, weight_prev=1.0 - beta
        )

    # ------------------------------------------------------------------ post-processing
    def _recentre(self, lam: float) -> None:
        """Move c so the mean weight becomes about 1/A (at a refresh, before its releases).

        With the weights scaled by ``f = exp((c_old − c_new)/λ)`` the mean s becomes ``f·s`` (exact
        when c rises; when it falls, capped records keep weight 1 and the mean lands below the
        target, approached again at the next refresh)."""
        s_old = max(float(self.s.value), self._s_floor())
        self._shift = float(self._shift) + lam * (math.log(s_old) + math.log(self.config.weight_cap))

    def _lam_update(self, lam_t: float, z_lam: float) -> float:
        c = self.config
        move = c.lam_lr * z_lam
        if c.lam_step_frac is not None:
            cap = c.lam_step_frac * lam_t
            move = min(max(move, -cap), cap)
        lam = lam_t - move
        if self.lam_max is not None:
            lam = min(lam, self.lam_max)
        return self.objective.project_lam(lam)

    def _s_floor(self) -> float:
        c = self.config
        return 1e-3 / c.weight_cap if c.s_min == "auto" else float(c.s_min)

    def _clamp_s(self, raw: float) -> float:
        return min(max(float(raw), self._s_floor()), 1.0)

    # ------------------------------------------------------------------ one iteration
    def _estimates(self, t: int, x_t, lam_t: float, x_prev, lam_prev: float) -> tuple[torch.Tensor, float, float]:
        """SPIDER updates of v and u; s refreshed on the refresh batch, else by STORM."""
        refresh = self.v.refresh_due(t)
        if refresh and self.s.value is not None:
            self._recentre(lam_t)
        phase = self.releases.phase("refresh" if refresh else "diff")
        dw = 0.0 if refresh else math.sqrt(float((x_t - x_prev).norm()) ** 2 + (lam_t - lam_prev) ** 2)
        at, before = {"x": None, "lam": lam_t}, {"x": x_prev, "lam": lam_prev}
        v = self.v.update_at(phase, t=t, distance=dw, sums=(self.v_grad_sum, self.v_diff_sum), at=at, prev=before)
        if refresh:
            s_raw = float(phase.release("s-init", lambda idx, c: self.s_value_sum(idx, clip=c, **at)))
        u = self.u.update_at(phase, t=t, distance=dw, sums=(self.u_grad_sum, self.u_diff_sum), at=at, prev=before)
        self._last_thresholds = {k: c for k, c in phase.thresholds.items() if k.endswith("-diff")}
        if not refresh:
            beta = self.config.beta
            s_raw = self.s.update(
                self.releases.phase("s"),
                lambda idx, c: self.s_storm_sum(
                    idx, x=None, lam=lam_t, x_prev=x_prev, lam_prev=lam_prev, beta=beta, clip=c
                ),
            )
        self.s.value = self._clamp_s(s_raw)
        return v, float(u), self.s.value

    def _x_step(self, z_x: torch.Tensor, t: int) -> float:
        c, factor = self.config, self._lr_factor(t)
        lr_norm = c.lr if c.lr_norm == "auto" else c.lr_norm
        lr = factor * c.lr
        return lr if lr_norm is None else min(lr, factor * lr_norm / max(float(z_x.norm()), 1e-300))

    def step(self, t: int) -> dict[str, float]:
        c = self.config
        x_t, lam_t = self._x(), float(self._lam)
        if t == 0:  # w_0 := w_1
            self._x_prev, self._lam_prev = x_t, lam_t
        x_prev, lam_prev = self._x_prev, float(self._lam_prev)
        v, u, s = self._estimates(t, x_t, lam_t, x_prev, lam_prev)
        cap = self._v_cap()
        v_dir = v if cap is None else v * min(1.0, cap / max(float(v.norm()), 1e-300))
        # Outer chain rule in units of the capped inner function: z = (v/s, u/s + log s + ρ).
        z_x = v_dir / s
        z_lam = u / s + math.log(s) + c.rho
        # ∂_λΨ = ρ − KL(π‖uniform) lies in [ρ − log n, ρ] (n public): project the estimate there.
        z_lam = min(max(z_lam, c.rho - math.log(self._ctx.n)), c.rho)
        step = self._x_step(z_x, t)
        x_next = x_t - step * z_x
        lam_next = self._lam_update(lam_t, z_lam)
        self._set_x(x_next)
        self._x_prev, self._lam_prev, self._lam = x_t, lam_t, lam_next
        self._maybe_save(t + 1, x_next, lam=lam_next)
        logs = {f"clip_{k.replace('-', '_')}": thr for k, thr in self._last_thresholds.items()}
        logs.update(lam=lam_next, s=s, u=u, v_norm=float(v.norm()), z_lam=z_lam, shift=self._shift)
        return logs


@dataclass(frozen=True)
class SCDROConfig(RecursiveSpiderConfig):
    """SCDRO's defaults (measured, see ``docs/algorithms/dro.md``): short phases, moderate refresh
    batches, β = 1, last-iterate output, and a weight cap so large that it never binds (exact
    KL-DRO weights).

    Attributes:
        lr_schedule: how the x step (``lr``, and the largest move ``lr_norm``) decays over the
            planned iterations: ``"constant"``, ``"inverse-sqrt"`` or ``"cosine``
            (:mod:`privopt.algorithms.step_schedules`). Without noise or clipping a constant step
            keeps the last iterate moving by a step's length, so its decision threshold is random.
        lr_final: the step's factor at the last planned iteration, in (0, 1] (ignored by
            ``"constant"``).
    """

    lam_init: float = param(0.5, positive)
    weight_cap: float = param(1e6, weight_cap_value, role="weight_cap")
    q: int = param(4, positive_int, role="phase")
    b1: int = param(512, positive_int, role="refresh_batch")
    b3: int = param(512, positive_int, role="refresh_batch")
    s_batch: int | None = param(128, _optional_int, role="batch")
    lr: float = param(0.1, positive, role="lr")
    beta: float = param(1.0, unit_interval)
    output: str = param("last", one_of("random", "last"), role="output")


@register_algorithm
class SCDRO(DPRecursiveSPIDER):
    """Non-private reference: Recursive-SPIDER without noise or clipping (Qi et al.'s SCDRO).

    Same estimators and updates as :class:`DPRecursiveSPIDER`, with every clip threshold infinite
    and no privacy noise; the s-estimator uses a minibatch. Hyper-parameters: :class:`SCDROConfig`.
    """

    name = "scdro"
    private = False
    summary = "non-private Recursive-SPIDER on KL-DRO (SCDRO reference)"
    Config = SCDROConfig

    def _sensitivities(self) -> dict[str, Fixed | StepProportional]:
        # No clipping: infinite thresholds make every clip factor 1 (engine and scalar sums).
        inf = math.inf
        names = ("v-refresh", "u-refresh", "s-init", "v-diff", "u-diff")
        return {**{k: Fixed(inf) for k in names}, "s": Fixed(inf, factor=2.0 - self.config.beta)}

    def _v_cap(self) -> float | None:
        return None
