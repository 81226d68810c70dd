"""DP Double-SPIDER (Paper A, Algorithm 2) on the ψ-dual objective ``L(x, η)``.

Two SPIDER estimators, one per block, with alternating updates (η first, then x at the fresh
η_{t+1}): every ``q`` iterations both refresh (noisy means of per-sample clipped ``∇_η L`` and
``∇_x L``), in between they add noisy means of per-sample clipped differences at the current and
the previous point, with step-proportional thresholds. ``η_{t+1} = η_t − α·g_t``,
``x_{t+1} = x_t − β_t·v_t``; the output is the last iterate (or, as in the paper, a uniformly
random one).

What is implemented, the deviations from the printed algorithm and why, and the privacy
inventory: ``docs/algorithms/dro.md`` ("DP Double-SPIDER").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import (
    auto_or_positive,
    finite_or_none,
    flag,
    mapping,
    optional_positive,
    param,
    positive,
    positive_int,
    text,
)
from privopt.algorithms.dro_common import (
    DROAlgorithm,
    SpiderDROConfig,
    check_difference_thresholds,
    dual_objective,
    initial_loss_scale,
)
from privopt.algorithms.estimators import SpiderEstimator
from privopt.algorithms.releases import BatchPlan, Fixed, Query, ReleasePlan, StepProportional
from privopt.errors import ConfigError
from privopt.grads.sums import BoundedSum, clipped_scalar_sum
from privopt.objectives.divergences import get_divergence

__all__ = ["DPDoubleSPIDER", "DPDoubleSPIDERConfig"]

_MIN_MEAN_WEIGHT = 1e-3  # floor of the estimated mean weight in the KL log step of η


@dataclass(frozen=True)
class DPDoubleSPIDERConfig(SpiderDROConfig):
    """Hyper-parameters of DP Double-SPIDER.

    Attributes:
        divergence, divergence_params: ψ (e.g. ``"kl"``, ``"chi2"``, ``"kl_cvar"`` with
            ``{"alpha": 0.1}``).
        lam: the DRO penalty λ. g_eta: rescaling of η (default 1).
        weight_cap: public cap A on the DRO weights ``(ψ*)'((ℓ−g_η η)/λ)`` (the argument is capped
            where the weight reaches A): a record's x-term ``a_i·Clip(∇ℓ_i, C)`` is at most ``A·C``.
        q: phase length. N1, N2, N3, N4: refresh/correction batch sizes of the η/x estimators
            (a size ≥ n means the full dataset).
        lr: x step β (its maximum). lr_norm: normalised-step constant (the largest x move per
            step); ``"auto"`` = ``lr`` (steps of ``lr·v`` while ``‖v‖ ≤ 1``, of length ``lr`` beyond);
            ``None`` = constant step ``lr``.
        eta_lr: η step α. ``"auto"``: for KL, the log step ``η += (λ/g_η)·log m̂`` with ``m̂ = 1 − g/g_η``
            the estimated mean weight (it lands on the optimal η of the estimate); otherwise
            ``α = λ/g_η²``.
        eta_init: η_0 (``None``: ``log K`` with K the number of model outputs).
        eta_step_cap: cap on ``|η_{t+1} − η_t|``; ``"auto"`` = ``eta_lr·clip_eta``; ``None``: off.
        clip_x: threshold C on each record's loss gradient ``∇ℓ_i`` (the refresh x-query's bound is
            ``A·C``). clip_eta: threshold C1 of the η-query (``"auto"``: ``g_η·max(1, A−1)``, the
            largest ``|g_η(1 − a_i)|``, so it never binds).
        gamma_eta, gamma_x: step-proportional factors of C2_t, C4_t (None: fixed thresholds).
        clip_eta_diff, clip_x_diff: caps of C2_t, C4_t (the fixed thresholds when γ is None);
            ``"auto"``: twice the refresh bound (the largest difference of two bounded terms).
        scalar_noise_ratio: noise multiplier of the 1-dimensional η-queries relative to the x-queries
            (calibrated jointly): a scalar estimate tolerates more noise, and with equal multipliers
            the η-queries cost as much privacy as the d-dimensional x-queries.
        loss_bound: public clamp B of the losses.
        share_batches: one batch for the η- and x-queries of an iteration when sizes agree.
        private: ``False`` runs the same clipped updates without noise (reference runs).

    The defaults are practical ones for a short run (``docs/algorithms/dro.md``, "Defaults"): a
    refresh every step (q = 1) on 128 records, lr 2, weight cap 1.25 and the last iterate. Under
    noise ``‖v‖ > 1``, so each step moves x by lr; the paper-scale 0.1 barely moved the model. The
    paper's schedule (q = 32, refresh batches 2048, lr 0.1, A = 4, a random iterate) is
    :data:`~privopt.algorithms.dro_presets.PAPER_DEFAULTS`.
    """

    lam: float = param(1.0, positive, role="penalty")
    g_eta: float = param(1.0, positive)
    divergence: str = param("kl", text)
    divergence_params: Mapping[str, Any] = param({}, mapping)
    N1: int = param(128, positive_int, role="refresh_batch")
    N2: int = param(128, positive_int, role="batch")
    N3: int = param(128, positive_int, role="refresh_batch")
    N4: int = param(128, positive_int, role="batch")
    lr_norm: str | float | None = param("auto", auto_or_positive)
    lr: float = param(2.0, positive, role="lr")
    eta_lr: str | float = param("auto", auto_or_positive)
    eta_init: float | None = param(None, finite_or_none)
    eta_step_cap: str | float | None = param("auto", auto_or_positive)
    clip_eta: str | float = param("auto", auto_or_positive)
    gamma_eta: float | None = param(10.0, optional_positive, role="gamma")
    clip_eta_diff: str | float | None = param("auto", auto_or_positive)
    clip_x: float = param(1.0, positive, role="clip")
    gamma_x: float | None = param(10.0, optional_positive, role="gamma")
    clip_x_diff: str | float | None = param("auto", auto_or_positive)
    scalar_noise_ratio: float = param(4.0, positive)
    loss_bound: float = param(10.0, positive)
    share_batches: bool = param(True, flag)
    private: bool = param(True, flag)

    def check(self) -> None:
        check_difference_thresholds(self, ("eta", "x"))
        get_divergence(self.divergence, **self.divergence_params)  # a bad divergence fails now
        if self.eta_lr is None or self.clip_eta is None:
            raise ConfigError("eta_lr and clip_eta must be 'auto' or a number > 0")

    # Resolved thresholds and steps ("auto" values), all public functions of the config.
    @property
    def eta_clip(self) -> float:
        return self.g_eta * max(1.0, self.weight_cap - 1.0) if self.clip_eta == "auto" else float(self.clip_eta)

    @property
    def eta_step(self) -> float:
        return self.lam / self.g_eta**2 if self.eta_lr == "auto" else float(self.eta_lr)

    def diff_cap(self, block: str) -> float | None:
        """The cap of a difference threshold (``"auto"``: twice the refresh query's bound)."""
        value = getattr(self, f"clip_{block}_diff")
        if value != "auto":
            return value
        return 2.0 * (self.eta_clip if block == "eta" else self.weight_cap * self.clip_x)


@register_algorithm
class DPDoubleSPIDER(DROAlgorithm):
    """DP Double-SPIDER for ψ-penalised DRO (any ψ of :mod:`privopt.objectives.divergences`),
    configured by :class:`DPDoubleSPIDERConfig`; its privacy schedule is :meth:`release_plan`:

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-double-spider", steps=64, q=16, N1=500, N2=50, N3=500, N4=50)
        >>> [(s.mechanisms, s.count) for s in algo.inventory(n=1000).steps]
        [((('eta-refresh', 4.0), ('x-refresh', 1.0)), 4), ((('eta-diff', 4.0), ('x-diff', 1.0)), 60)]
    """

    name = "dp-double-spider"
    summary = "DP Double-SPIDER (Paper A Alg. 2) on the psi-dual L(x, eta)"
    Config = DPDoubleSPIDERConfig
    state_values, state_estimators = ("eta", "eta_prev", "x_prev"), ("g", "v")

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.objective = dual_objective(self.config)

    # ------------------------------------------------------------------ privacy schedule
    def _phase_sizes(self) -> tuple[int, int]:
        return self.config.N3, self.config.N4

    def release_plan(self, n: int) -> ReleasePlan:
        """Refreshes ceil(T/q) times, corrections T − ceil(T/q) times; η and x share a batch."""
        c, r = self.config, self.config.scalar_noise_ratio
        refresh = (
            Query("eta-refresh", Fixed(c.eta_clip), batch=BatchPlan(c.N1, n), ratio=r),
            # a_i·Clip(∇ℓ_i, C) with a_i ≤ A: a record contributes at most A·C.
            Query("x-refresh", Fixed(c.clip_x, factor=c.weight_cap), batch=BatchPlan(c.N3, n)),
        )
        diff = (
            Query("eta-diff", StepProportional(c.gamma_eta, c.diff_cap("eta")), batch=BatchPlan(c.N2, n), ratio=r),
            Query("x-diff", StepProportional(c.gamma_x, c.diff_cap("x")), batch=BatchPlan(c.N4, n)),
        )
        return self._spider_plan(n, refresh=refresh, diff=diff)

    # ------------------------------------------------------------------ setup & state
    def setup(self, ctx) -> None:
        self._bind(ctx)
        c = self.config
        self.g = SpiderEstimator(refresh="eta-refresh", correction="eta-diff", period=c.q, scalar=True)
        self.v = SpiderEstimator(refresh="x-refresh", correction="x-diff", period=c.q)
        eta0 = c.eta_init if c.eta_init is not None else initial_loss_scale(ctx) / c.g_eta
        self._eta, self._eta_prev, self._x_prev = self._project_eta(eta0), None, None

    @property
    def eta(self) -> float:
        """The current dual variable η_t (released: a function of noisy estimates)."""
        return float(self._eta)

    @property
    def estimates(self) -> dict[str, Any]:
        """The current estimators ``g`` (of ∇_η L) and ``v`` (of ∇_x L)."""
        return {"g": self.g.value, "v": self.v.value}

    def _load_output_scalars(self, saved: dict[str, Any]) -> None:
        self._eta = saved["eta"]

    # ------------------------------------------------------------------ pre-noise statistics
    # Sums over the batch ``idx`` of per-record clipped terms at the point ``(x, eta)`` (``x=None``:
    # the model's parameters), each carrying its bound (the threshold ``clip``; tested on
    # neighbouring datasets in tests/test_dro_sensitivity.py).
    def eta_grad_sum(self, idx, *, x, eta, clip) -> BoundedSum:
        """``Σ_{i∈idx} Clip(∇_η L(x, η; ξ_i), C)`` (1-element float64)."""
        return clipped_scalar_sum(self.objective.eta_grads(self._losses(idx, x), eta), clip)

    def eta_diff_sum(self, idx, *, x, eta, x_prev, eta_prev, clip) -> BoundedSum:
        """``Σ Clip(∇_η L(x, η; ξ_i) − ∇_η L(x_prev, η_prev; ξ_i), C)`` (1-element float64)."""
        now = self.objective.eta_grads(self._losses(idx, x), eta)
        before = self.objective.eta_grads(self._losses(idx, x_prev), eta_prev)
        return clipped_scalar_sum(now - before, clip)

    def x_grad_sum(self, idx, *, x, eta, clip) -> BoundedSum:
        """``Σ a_i·Clip(∇ℓ_i(x), C)`` with ``a_i = (ψ*)'((ℓ_i−g_η η)/λ) ≤ A``: the private surrogate
        of ``Σ ∇_x L(x, η; ξ_i)`` (bound ``A·C``; [d])."""
        return self._weighted_grad_sum(
            idx, clip=clip, x=x, weights=self.objective.weight_fn(eta), cap=self.config.weight_cap
        )

    def x_diff_sum(self, idx, *, x, eta, x_prev, eta_prev, clip) -> BoundedSum:
        """``Σ Clip(f_i(x, η) − f_i(x_prev, η_prev), C_t)`` with ``f_i = a_i·Clip(∇ℓ_i, C)`` ([d])."""
        obj, c = self.objective, self.config
        return self._weighted_diff_sum(
            idx,
            clip=clip,
            grad_clip=c.clip_x,
            weights=obj.weight_fn(eta),
            weights_prev=obj.weight_fn(eta_prev),
            cap=c.weight_cap,
            x=x,
            x_prev=x_prev,
        )

    # ------------------------------------------------------------------ safeguards (post-processing)
    def _project_eta(self, eta: float) -> float:
        bound = self.config.loss_bound / self.config.g_eta
        return min(max(float(eta), -bound), bound)

    def _eta_step(self, eta: float, g: float) -> float:
        c = self.config
        move = c.eta_step * g
        if c.eta_lr == "auto" and self.objective.divergence.name == "kl":
            # KL: the mean weight is m = 1 − g/g_η = e^{(η*−η)/λ}, so η* = η + (λ/g_η)·log m. The
            # linear step λ(m − 1) overshoots when m ≫ 1 (η oscillated between 0 and B); the log
            # step lands on η* from the estimate (its floor keeps it finite under noise).
            m = max(1.0 - g / c.g_eta, _MIN_MEAN_WEIGHT)
            move = -(c.lam / c.g_eta) * math.log(m)
        cap = c.eta_step * c.eta_clip if c.eta_step_cap == "auto" else c.eta_step_cap
        if cap is not None:
            move = min(max(move, -cap), cap)
        return self._project_eta(eta - move)

    def _beta(self, v_norm: float, factor: float = 1.0) -> float:
        """The x step for a direction of norm ``v_norm``, scaled by the schedule's ``factor``."""
        c = self.config
        lr_norm = c.lr if c.lr_norm == "auto" else c.lr_norm
        if lr_norm is None:
            return factor * c.lr
        return min(factor * c.lr, factor * lr_norm / max(v_norm, 1e-12))

    # ------------------------------------------------------------------ one iteration
    def step(self, t: int) -> dict[str, float]:
        x_t, eta_t, x_prev, eta_prev = self._x(), float(self._eta), self._x_prev, self._eta_prev
        refresh = self.g.refresh_due(t)
        phase = self.releases.phase("refresh" if refresh else "diff")
        dx = 0.0 if refresh else float((x_t - x_prev).norm())
        # η first, at (x_t, η_t) against (x_{t−1}, η_{t−1}); then x at the fresh η_{t+1}.
        d_eta = 0.0 if refresh else max(abs(eta_t - eta_prev), dx)
        eta_sums = (self.eta_grad_sum, self.eta_diff_sum)
        g = self.g.update_at(
            phase, t=t, distance=d_eta, sums=eta_sums, at={"x": None, "eta": eta_t}, prev={"x": x_prev, "eta": eta_prev}
        )
        eta_next = self._eta_step(eta_t, g)
        d_x = 0.0 if refresh else max(abs(eta_next - eta_t), dx)
        at, before = {"x": None, "eta": eta_next}, {"x": x_prev, "eta": eta_t}
        v = self.v.update_at(phase, t=t, distance=d_x, sums=(self.x_grad_sum, self.x_diff_sum), at=at, prev=before)
        v_norm = float(v.norm())
        beta = self._beta(v_norm, self._lr_factor(t))
        x_next = x_t - beta * v
        self._set_x(x_next)
        self._x_prev, self._eta_prev, self._eta = x_t, eta_t, eta_next
        self._maybe_save(t + 1, x_next, eta=eta_next)
        # All logged values are functions of released (noisy) estimates: safe to log.
        logs = {f"clip_{k.replace('-', '_')}": c for k, c in phase.thresholds.items() if k.endswith("-diff")}
        return {**logs, "eta": eta_next, "g": g, "v_norm": v_norm, "step_size": beta}
