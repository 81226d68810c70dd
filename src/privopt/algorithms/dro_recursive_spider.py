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
from privopt.algorithms.dro_common import DROAlgorithm, DROConfig, check_difference_thresholds, initial_loss_scale
from privopt.algorithms.estimators import SpiderEstimator, StormEstimator
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, Query, ReleasePlan, StepProportional
from privopt.errors import ConfigError
from privopt.grads.sums import BoundedSum, clipped_scalar_difference_sum, clipped_scalar_sum
from privopt.objectives.compositional import KLCompositional

__all__ = ["DPRecursiveSPIDER", "DPRecursiveSPIDERConfig", "SCDRO", "SCDROConfig"]

_TINY = 1e-300


def _shift(name: str, value: Any) -> Any:
    if value is not None and value != "adaptive" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{name} must be 'adaptive', a number or None, got {value!r}")
    return value


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else positive_int(name, value)


@dataclass(frozen=True)
class RecursiveSpiderConfig(DROConfig):
    """Hyper-parameters shared by DP Recursive-SPIDER and SCDRO.

    Attributes:
        rho: KL radius ρ. lam0: lower bound λ0 of λ. lam_init: initial λ.
        q: phase length. b1, b2, b3, b4: refresh/correction batch sizes of the v (∇_x h) and
            u (∂_λ h) estimators (≥ n means the full dataset). s_batch: expected batch size of
            each s update (``None``: b2; the paper's single record makes s pure noise under DP).
        lr: step on x (and on λ unless ``lam_lr``). lam_lr: separate step on λ.
        beta: STORM momentum β ∈ (0, 1] of s (1 = plain minibatch mean).
        loss_bound: public clamp B. shift: the shift c of h: ``"adaptive"``, a fixed number, or
            ``None`` for c = B. shift_offset: target ``−log h2`` of the adaptive shift.
        lam_max: upper bound of λ (``"auto"`` = B/√(8ρ); ``None``: none).
        lam_step_frac: largest relative λ move per step (``None``: no cap).
        x_step_cap: cap of ‖z_x‖ before the step (``None``: none). s_min: floor of s.
        exp_cap: cap on the exponent ``(ℓ − c)/λ`` of h (``None``: off).
        share_batches: v- and u-queries share one batch when their sizes agree.
    """

    rho: float = param(0.5, positive, role="rho")
    lam0: float = param(1e-3, positive, role="lam0")
    lam_init: float = param(1.0, positive)
    q: int = param(32, positive_int, role="phase")
    b1: int = param(2048, positive_int, role="refresh_batch")
    b2: int = param(128, positive_int, role="batch")
    b3: int = param(2048, positive_int, role="refresh_batch")
    b4: int = param(128, positive_int, role="batch")
    s_batch: int | None = param(None, _optional_int, role="batch")
    lr: float = param(0.01, positive, role="lr")
    lam_lr: float | None = param(None, optional_positive)
    beta: float = param(0.5, unit_interval)
    loss_bound: float = param(10.0, positive)
    shift: str | float | None = param("adaptive", _shift)
    shift_offset: float = param(1.0, positive)
    lam_max: str | float | None = param("auto", auto_or_positive)
    lam_step_frac: float | None = param(0.5, optional_positive)
    x_step_cap: float | None = param(1.0, optional_positive)
    s_min: float | None = param(None, optional_positive)
    exp_cap: float | None = param(20.0, optional_positive)
    share_batches: bool = param(True, flag)

    def check(self) -> None:
        if self.lam_init < self.lam0:
            raise ConfigError(f"lam_init ({self.lam_init}) must be >= lam0 ({self.lam0})")


@dataclass(frozen=True)
class DPRecursiveSPIDERConfig(RecursiveSpiderConfig):
    """DP Recursive-SPIDER: :class:`RecursiveSpiderConfig` plus the privacy thresholds.

    Attributes:
        clip_v, clip_u, clip_s: thresholds C1, C3, C5.
        gamma_v, gamma_u: step-proportional factors of C2_t, C4_t (None: fixed thresholds).
        clip_v_diff, clip_u_diff: caps of C2_t, C4_t (the fixed thresholds when γ is None).
        cap_v: cap ‖v‖ at clip_v before the x step.
        private: ``False`` runs the same clipped updates without noise (reference runs).
    """

    clip_v: float = param(1.0, positive, role="clip")
    clip_u: float = param(1.0, positive, role="clip")
    clip_s: float = param(1.0, positive, role="clip")
    gamma_v: float | None = param(10.0, optional_positive)
    gamma_u: float | None = param(10.0, optional_positive)
    clip_v_diff: float | None = param(None, optional_positive, role="clip_cap")
    clip_u_diff: float | None = param(None, optional_positive, role="clip_cap")
    cap_v: bool = param(True, flag)
    private: bool = param(True, flag)

    def check(self) -> None:
        super().check()
        check_difference_thresholds(self, ("v", "u"))


@register_algorithm
class DPRecursiveSPIDER(DROAlgorithm):
    """DP Recursive-SPIDER for KL-constrained DRO, jointly in ``w = (x, λ)``.

    Two SPIDER estimators (v, u) and a STORM tracker (s) on the shifted inner function, with the
    hyper-parameters of :class:`DPRecursiveSPIDERConfig` and the privacy schedule of
    :meth:`release_plan`. The STORM release is the one whose per-record bound is wider than its
    threshold: ``(2 − β)·C5``.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-recursive-spider", steps=64, q=16, b1=500, b3=500, b2=50, b4=50)
        >>> sorted((s.mechanisms, s.count) for s in algo.inventory(n=1000).steps)[0]
        ((('s', 1.0),), 64)
    """

    name = "dp-recursive-spider"
    summary = "DP Recursive-SPIDER (Paper A Alg. 3) on KL-constrained DRO"
    Config = DPRecursiveSPIDERConfig

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        c = self.config
        self.adaptive_shift = c.shift == "adaptive"
        shift = None if self.adaptive_shift else c.shift
        self.objective = KLCompositional(rho=c.rho, lam0=c.lam0, loss_bound=c.loss_bound, shift=shift, a_max=c.exp_cap)
        lam_max = c.loss_bound / math.sqrt(8.0 * c.rho) if c.lam_max == "auto" else c.lam_max
        self.lam_max = None if lam_max is None else max(lam_max, c.lam_init)
        self.s_batch = c.b2 if c.s_batch is None else c.s_batch
        self._shift: float | None = None

    # ------------------------------------------------------------------ privacy schedule
    def _sensitivities(self) -> dict[str, Fixed | StepProportional]:
        c = self.config
        return {
            "v-refresh": Fixed(c.clip_v),
            "u-refresh": Fixed(c.clip_u),
            "s-init": Fixed(c.clip_s),
            "v-diff": StepProportional(c.gamma_v, c.clip_v_diff),
            "u-diff": StepProportional(c.gamma_u, c.clip_u_diff),
            # Clip(h(w_t)) − (1−β)·Clip(h(w_{t−1})): a record contributes at most (2 − β)·C5.
            "s": Fixed(c.clip_s, factor=2.0 - c.beta),
        }

    def _v_cap(self) -> float | None:
        return self.config.clip_v if self.config.cap_v else None

    def _phase_sizes(self) -> tuple[int, int]:
        return self.config.b1, self.config.b2

    def release_plan(self, n: int) -> ReleasePlan:
        """v/u refreshes ceil(T/q) times (the first also releases s_0 on the v batch), their
        corrections T − ceil(T/q) times, the STORM s update every iteration."""
        c, (T, refreshes), sens = self.config, self._schedule(n), self._sensitivities()
        v_refresh = Query("v-refresh", sens["v-refresh"], batch=BatchPlan(c.b1, n))
        u_refresh = Query("u-refresh", sens["u-refresh"], batch=BatchPlan(c.b3, n))
        return ReleasePlan(
            share=c.share_batches,
            phases=(
                Phase("first-refresh", 1, (v_refresh, u_refresh, Query("s", sens["s-init"], on="v-refresh"))),
                Phase("refresh", refreshes - 1, (v_refresh, u_refresh)),
                Phase(
                    "diff",
                    T - refreshes,
                    (
                        Query("v-diff", sens["v-diff"], batch=BatchPlan(c.b2, n)),
                        Query("u-diff", sens["u-diff"], batch=BatchPlan(c.b4, n)),
                    ),
                ),
                Phase("s", T, (Query("s", sens["s"], batch=BatchPlan(self.s_batch, n)),)),
            ),
        )

    # ------------------------------------------------------------------ setup & state
    def setup(self, ctx) -> None:
        self._bind(ctx)
        c = self.config
        self.v = SpiderEstimator(refresh="v-refresh", correction="v-diff", period=c.q)
        self.u = SpiderEstimator(refresh="u-refresh", correction="u-diff", period=c.q, scalar=True)
        self.s = StormEstimator(name="s", beta=c.beta)
        self._shift = float(initial_loss_scale(ctx) if self.adaptive_shift else self.objective.shift)
        self._lam, self._lam_prev, self._x_prev = c.lam_init, None, None
        self._last_thresholds: dict[str, float] = {}

    def _state(self) -> dict[str, Any]:
        est = {k: getattr(self, k).state_dict() for k in ("v", "u", "s")}
        return {"lam": self._lam, "lam_prev": self._lam_prev, "x_prev": self._x_prev, "c": self._shift, **est}

    def _load_state(self, state: dict[str, Any]) -> None:
        self._lam, self._lam_prev, self._x_prev, self._shift = (
            state["lam"],
            state["lam_prev"],
            state["x_prev"],
            state["c"],
        )
        for k in ("v", "u", "s"):
            getattr(self, k).load_state_dict(state[k])

    def _load_output_scalars(self, saved: dict[str, Any]) -> None:
        self._lam = saved["lam"]

    @property
    def lam(self) -> float:
        """The current dual variable λ_t (released)."""
        return float(self._lam)

    @property
    def estimates(self) -> dict[str, Any]:
        """Current estimates ``v`` (∇_x h2), ``u`` (∂_λ h2), ``s`` (h2)."""
        return {"v": self.v.value, "u": self.u.value, "s": self.s.value}

    @property
    def current_shift(self) -> float:
        """The shift c in use (released: a function of noisy estimates and public constants)."""
        return self._c()

    def _c(self) -> float:
        return self._shift if self._shift is not None else self.objective.shift

    # ------------------------------------------------------------------ pre-noise statistics
    # Sums over the batch ``idx`` of per-record clipped terms at ``w = (x, lam)`` (``x=None``: the
    # model's parameters) and ``w_prev``, each carrying its per-record bound (threshold ``clip``).
    def v_grad_sum(self, idx, *, x, lam, clip) -> BoundedSum:
        """``Σ Clip(∇_x h(w; ξ_i), C)`` with ``∇_x h = (h/λ)·∇ℓ`` ([d])."""
        return self._grad_sum(idx, clip=clip, x=x, weights=self.objective.h_weight_fn(lam, shift=self._c()))

    def v_diff_sum(self, idx, *, x, lam, x_prev, lam_prev, clip) -> BoundedSum:
        """``Σ Clip(∇_x h(w; ξ_i) − ∇_x h(w_prev; ξ_i), C)`` ([d])."""
        w = self.objective.h_weight_fn(lam, shift=self._c())
        w_prev = self.objective.h_weight_fn(lam_prev, shift=self._c())
        return self._grad_sum(idx, clip=clip, x=x, weights=w, x_prev=x_prev, weights_prev=w_prev)

    def _h_lam(self, idx, x, lam) -> torch.Tensor:
        if idx.numel() == 0:
            return torch.zeros(0, dtype=torch.float64)
        return self.objective.h_lam_grads(self._losses(idx, x), lam, shift=self._c())

    def _h(self, idx, x, lam) -> torch.Tensor:
        if idx.numel() == 0:
            return torch.zeros(0, dtype=torch.float64)
        return self.objective.h(self._losses(idx, x), lam, shift=self._c()).detach()

    def u_grad_sum(self, idx, *, x, lam, clip) -> BoundedSum:
        """``Σ Clip(∇_λ h(w; ξ_i), C)`` (1-element float64)."""
        return clipped_scalar_sum(self._h_lam(idx, x, lam), clip)

    def u_diff_sum(self, idx, *, x, lam, x_prev, lam_prev, clip) -> BoundedSum:
        """``Σ Clip(∇_λ h(w; ξ_i) − ∇_λ h(w_prev; ξ_i), C)`` (1-element float64)."""
        return clipped_scalar_sum(self._h_lam(idx, x, lam) - self._h_lam(idx, x_prev, lam_prev), clip)

    def s_value_sum(self, idx, *, x, lam, clip) -> BoundedSum:
        """``Σ Clip(h(w; ξ_i), C)`` (the s_0 initialisation; 1-element float64)."""
        return clipped_scalar_sum(self._h(idx, x, lam), clip)

    def s_storm_sum(self, idx, *, x, lam, x_prev, lam_prev, beta, clip) -> BoundedSum:
        """``Σ [Clip(h(w; ξ_i), C) − (1−β)·Clip(h(w_prev; ξ_i), C)]`` (bound ``(2−β)·C``)."""
        return clipped_scalar_difference_sum(
            self._h(idx, x, lam), self._h(idx, x_prev, lam_prev), clip=clip, weight_prev=1.0 - beta
        )

    # ------------------------------------------------------------------ post-processing
    def _recentre(self, lam_prev: float) -> None:
        """Adaptive shift: move c so the tracked s becomes e^{−shift_offset}.

        s, v and u estimate h2, ∇_x h2 and ∂_λ h2 at ``w_{t−1}`` for the old c. A new shift
        rescales them exactly: with ``f = exp((c_old − c_new)/λ)``, ``h ↦ f·h`` so ``s ↦ f·s``,
        ``v ↦ f·v`` and, since ``∂_λ h = −h·(ℓ − c)/λ²``, ``u ↦ f·(u − s·(c_old − c_new)/λ²)``.
        """
        s_old, c_old = float(self.s.value), float(self._shift)
        c_new = c_old + lam_prev * (math.log(max(s_old, _TINY)) + self.config.shift_offset)
        f = math.exp(max(min((c_old - c_new) / lam_prev, 690.0), -690.0))
        self.s.value = s_old * f
        self.v.rescale(f)
        if self.u.value is not None:
            self.u.value = f * (float(self.u.value) - s_old * (c_old - c_new) / lam_prev**2)
        self._shift = c_new

    def _lam_update(self, lam_t: float, z_lam: float) -> float:
        c = self.config
        move = (c.lam_lr or c.lr) * z_lam
        if c.lam_step_frac is not None:
            cap = c.lam_step_frac * lam_t
            move = min(max(move, -cap), cap)
        lam = lam_t - move
        if self.lam_max is not None:
            lam = min(lam, self.lam_max)
        return self.objective.project_lam(lam)

    def _s_range(self, lam: float) -> tuple[float, float]:
        """Range of h2 for losses in [0, B] (computed in log space; post-processing bounds of s)."""
        c = self._c()
        lo = math.exp(max(-c / lam, -690.0))
        hi = math.exp(min((self.config.loss_bound - c) / lam, 690.0))
        return max(lo if self.config.s_min is None else self.config.s_min, _TINY), hi

    # ------------------------------------------------------------------ one iteration
    def _inner_estimates(self, t: int, x_t, lam_t: float, x_prev, lam_prev: float) -> tuple[torch.Tensor, float]:
        """SPIDER updates of v and u (and the s_0 release on the first refresh batch)."""
        refresh, first = self.v.refresh_due(t), self.s.value is None
        phase = self.releases.phase(("first-refresh" if first else "refresh") if refresh else "diff")
        dw = 0.0 if refresh else math.sqrt(float((x_t - x_prev).norm()) ** 2 + (lam_t - lam_prev) ** 2)
        at, before = {"x": None, "lam": lam_t}, {"x": x_prev, "lam": lam_prev}
        v = self.v.update_at(phase, t=t, distance=dw, sums=(self.v_grad_sum, self.v_diff_sum), at=at, prev=before)
        if first:
            self.s.value = float(phase.release("s", lambda idx, c: self.s_value_sum(idx, clip=c, **at)))
        u = self.u.update_at(phase, t=t, distance=dw, sums=(self.u_grad_sum, self.u_diff_sum), at=at, prev=before)
        self._last_thresholds = {k: c for k, c in phase.thresholds.items() if k.endswith("-diff")}
        return v, float(u)

    def _storm(self, lam_t: float, x_prev, lam_prev: float) -> float:
        """STORM update of s on a fresh batch, projected onto the range h2 can take."""
        beta = self.config.beta
        raw = self.s.update(
            self.releases.phase("s"),
            lambda idx, c: self.s_storm_sum(
                idx, x=None, lam=lam_t, x_prev=x_prev, lam_prev=lam_prev, beta=beta, clip=c
            ),
        )
        lo, hi = self._s_range(lam_t)
        self.s.value = min(max(raw, lo), hi)
        return self.s.value

    def step(self, t: int) -> dict[str, float]:
        c = self.config
        x_t, lam_t = self._x(), float(self._lam)
        if t == 0:  # w_0 := w_1
            self._x_prev, self._lam_prev = x_t, lam_t
        x_prev, lam_prev = self._x_prev, float(self._lam_prev)
        if t > 0 and self.adaptive_shift:
            # Every step: between refreshes λ and x move, and a stale c lets h drift by orders of magnitude.
            self._recentre(lam_prev)
        v, u = self._inner_estimates(t, x_t, lam_t, x_prev, lam_prev)
        s = self._storm(lam_t, x_prev, lam_prev)
        cap = self._v_cap()
        v_dir = v if cap is None else v * min(1.0, cap / max(float(v.norm()), 1e-300))
        z_x, z_lam = KLCompositional.outer_grads(s=s, v=v_dir, u=u, lam=lam_t, rho=c.rho)
        if c.x_step_cap is not None:
            z_x = z_x * min(1.0, c.x_step_cap / max(float(z_x.norm()), 1e-300))
        # ∂_λΨ = ρ − KL(π‖uniform) lies in [ρ − log n, ρ] (n public): project the estimate there.
        z_lam = min(max(z_lam, c.rho - math.log(self._ctx.n)), c.rho)
        x_next = x_t - c.lr * z_x
        lam_next = self._lam_update(lam_t, z_lam)
        self._set_x(x_next)
        self._x_prev, self._lam_prev, self._lam = x_t, lam_t, lam_next
        self._maybe_save(t + 1, x_next, lam=lam_next)
        logs = {f"clip_{k.replace('-', '_')}": thr for k, thr in self._last_thresholds.items()}
        return {**logs, "lam": lam_next, "s": s, "u": u, "v_norm": float(v.norm()), "z_lam": z_lam, "shift": self._c()}


@dataclass(frozen=True)
class SCDROConfig(RecursiveSpiderConfig):
    """SCDRO's defaults (measured, see ``docs/algorithms/dro.md``): short phases, moderate refresh
    batches, a separate small λ step, β = 1, last-iterate output."""

    lam_init: float = param(0.5, positive)
    q: int = param(4, positive_int, role="phase")
    b1: int = param(512, positive_int, role="refresh_batch")
    b3: int = param(512, positive_int, role="refresh_batch")
    s_batch: int | None = param(128, _optional_int, role="batch")
    lr: float = param(0.1, positive, role="lr")
    lam_lr: float | None = param(0.01, optional_positive)
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
