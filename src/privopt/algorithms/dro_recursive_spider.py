"""DP Recursive-SPIDER (Paper A, Algorithm 3; SPEC §2.5–2.6) for KL-constrained DRO, and SCDRO.

Solves ``min_x min_{λ≥λ0} Ψ(x, λ) = λ log mean_i exp(ℓ_i/λ) + λρ`` in compositional form
``f(g(w))`` with ``w = (x, λ)``, through the *shifted* inner function
``h(w; ξ) = exp((ℓ(x; ξ) − c)/λ)`` (c = a public shift, default the loss bound B; SPEC E-A.17).
Three private estimators of inner means, combined by the data-independent outer chain rule:

* ``v_t ≈ ∇_x h2(w_t)``, ``u_t ≈ ∂_λ h2(w_t)`` — SPIDER estimators: every ``q`` iterations a
  refresh (noisy mean of per-sample clipped ``∇_x h`` / ``∇_λ h`` on batches of expected size
  b1 / b3), otherwise ``v_t = v_{t−1} +`` noisy mean of per-sample clipped differences at
  ``w_t`` and ``w_{t−1}`` (b2 / b4; the accumulation of E-A.12);
* ``s_t ≈ h2(w_t)`` — STORM tracking (E-A.14): ``s_t = mean_B[Clip(h(w_t)) − (1−β)Clip(h(w_{t−1}))]
  + (1−β)s_{t−1} + noise`` on a fresh batch of expected size ``s_batch`` (paper: one record),
  initialised by a noisy mean on the first refresh batch (E-A.16); floored and capped to the
  range ``h`` can take (post-processing), so ``log s_t`` and ``λ/s_t`` stay finite;
* ``z_t = ((λ/s)·v, (λ/s)·u + log s + ρ)``, ``w_{t+1} = w_t − lr·z_t`` and ``λ`` projected onto
  ``[λ0, ∞)`` (E-A.16); ``λ`` starts at ``lam_init`` (not 0).

Privacy: per-sample clipping everywhere; difference thresholds are step-proportional
(``C_t = γ·‖w_t − w_{t−1}‖``, optionally capped; SPEC §8.4, E-A.13: this realises the paper's
``min{σ, σ̂}``); a difference query with ``‖Δw‖ = 0`` is skipped (no data access, no event).
The s-query's per-record term ``Clip(h(w_t)) − (1−β)Clip(h(w_{t−1}))`` is bounded by
``(2−β)·C5``, which is the threshold its noise is scaled with. Inventory (uniform noise
multiplier, calibrated by the loop): ``v-refresh``/``u-refresh`` ceil(T/q) times (the first one
also releases ``s``: the s_0 init), ``v-diff``/``u-diff`` T − ceil(T/q) times, ``s`` T times.
Families on a shared batch form one planned step.

Robustness safeguards (all post-processing of released values or public constants; the privacy
inventory is unchanged):

* adaptive shift (default ``shift="adaptive"``): c starts at ``log K`` (the cross-entropy of a
  uniform prediction; data-independent) and is re-centred at every refresh to
  ``c + λ·(log s + shift_offset)`` so that the tracked mean h2 ≈ e^{−shift_offset}. With the fixed
  c = B, h ≈ e^{−(B−ℓ)/λ} ≈ 1e−4 and the noise of the clipped s-query (std ∝ C5) swamps it. The
  change of c rescales s exactly (``s·exp((c_old − c_new)/λ)``); v and u are refreshed at the
  new c on the same step, so the estimators stay consistent;
* ``s_batch`` defaults to the correction batch size b2 (the paper's single record makes s pure
  noise under DP);
* the x-direction uses ``v·min(1, clip_v/‖v‖)`` (v is nominally a mean of clip_v-clipped terms;
  the cap only binds when noise/drift inflates it);
* λ moves by at most ``lam_step_frac·λ_t`` per step and stays in ``[λ0, lam_max]`` with
  ``lam_max = B/√(8ρ)`` by default (Hoeffding: the minimiser over λ is below range/√(8ρ)).

Other documented choices: constant step and momentum (E-A.15; the Lemma-9 schedule needs the
unknown σ²); losses clamped to ``[0, B]`` (straight-through, §8.7); scalars in float64; the
output is a uniformly random iterate among the T produced (index drawn up front).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.dro_common import (
    BatchPlan,
    DROAlgorithm,
    clipped_scalar_sum,
    initial_loss_scale,
    spider_steps,
    step_clip,
)
from privopt.errors import ConfigError
from privopt.objectives.compositional import KLCompositional
from privopt.privacy import Inventory, PlannedStep
from privopt.validation import auto_or_positive, optional_positive, positive, positive_int, unit_interval

__all__ = ["DPRecursiveSPIDER", "SCDRO"]

_TINY = 1e-300


@register_algorithm
class DPRecursiveSPIDER(DROAlgorithm):
    """DP Recursive-SPIDER for KL-constrained DRO (eq. 5), jointly in ``w = (x, λ)``.

    Args:
        rho: KL radius ρ. lam0: lower bound λ0 of λ. lam_init: initial λ.
        q: phase length. b1, b2, b3, b4: refresh/correction batch sizes of the v (∇_x h) and
            u (∂_λ h) estimators (≥ n means the full dataset). s_batch: expected batch size of
            each s update (paper: 1).
        lr: step on x (and on λ unless ``lam_lr``). lam_lr: separate step on λ.
        beta: STORM momentum β ∈ (0, 1] of s (1 = plain minibatch mean).
        clip_v, clip_u, clip_s: thresholds C1, C3, C5.
        gamma_v, gamma_u: step-proportional factors of C2_t, C4_t (None: fixed thresholds).
        clip_v_diff, clip_u_diff: caps of C2_t, C4_t (the fixed thresholds when γ is None).
        loss_bound: public clamp B. shift: the shift c of h: ``"adaptive"`` (default, see the module
            docstring), or a fixed number, or ``None`` for c = B (h ∈ (0, 1]).
        shift_offset: target ``−log h2`` of the adaptive shift (default 1).
        lam_max: upper bound of λ (default ``"auto"`` = B/√(8ρ); ``None``: none).
        lam_step_frac: largest relative λ move per step (default 0.5; ``None``: no cap).
        cap_v: cap ‖v‖ at clip_v before the x step (default True).
        x_step_cap: cap of ‖z_x‖ (the x direction) before the step (default 1: a normalised step
            of length ≤ lr, like clipped SGD; ``None``: none). z_x = (λ/s)·v divides by the tracked
            s, so a momentarily small s would otherwise produce an arbitrarily long step.
        s_min: floor of s (default ``exp(−c/λ_t)``, the smallest value h2 can take).
        exp_cap: cap on the exponent ``(ℓ − c)/λ`` of h (default 20; ``None``: off). A per-record
            transformation before clipping with a public constant (privacy unaffected); without it
            λ ≈ 0.1 and losses near B gave weights h/λ ≈ 1e34 whose products with float32
            per-sample gradients overflowed to inf/nan (the failed mnist-st runs). e^20 times the
            tracked mean (≈ e^{−shift_offset}) saturates any clip threshold anyway.
        share_batches: v- and u-queries share one batch when their sizes agree.
        epochs, steps, output, chunk_size: see :class:`DROAlgorithm`.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-recursive-spider", steps=64, q=16, b1=500, b3=500, b2=50, b4=50)
        >>> sorted((s.mechanisms, s.count) for s in algo.inventory(n=1000).steps)[0]
        ((('s', 1.0),), 64)
    """

    name = "dp-recursive-spider"
    summary = "DP Recursive-SPIDER (Paper A Alg. 3) on KL-constrained DRO"

    def __init__(
        self,
        *,
        rho: float = 0.5,
        lam0: float = 1e-3,
        lam_init: float = 1.0,
        q: int = 32,
        b1: int = 2048,
        b2: int = 128,
        b3: int = 2048,
        b4: int = 128,
        s_batch: int | None = None,
        lr: float = 0.01,
        lam_lr: float | None = None,
        beta: float = 0.5,
        clip_v: float = 1.0,
        clip_u: float = 1.0,
        clip_s: float = 1.0,
        gamma_v: float | None = 10.0,
        gamma_u: float | None = 10.0,
        clip_v_diff: float | None = None,
        clip_u_diff: float | None = None,
        loss_bound: float = 10.0,
        shift: str | float | None = "adaptive",
        shift_offset: float = 1.0,
        lam_max: str | float | None = "auto",
        lam_step_frac: float | None = 0.5,
        cap_v: bool = True,
        x_step_cap: float | None = 1.0,
        s_min: float | None = None,
        exp_cap: float | None = 20.0,
        share_batches: bool = True,
        epochs: float = 20,
        steps: int | None = None,
        output: str = "random",
        chunk_size: int = 256,
        private: bool = True,
    ):
        super().__init__(epochs=epochs, steps=steps, output=output, chunk_size=chunk_size)
        self.private = bool(private)  # False: same clipped updates without noise (reference runs)
        self.rho, self.lam0 = positive("rho", rho), positive("lam0", lam0)
        self.lam_init = positive("lam_init", lam_init)
        if self.lam_init < self.lam0:
            raise ConfigError(f"lam_init ({lam_init}) must be >= lam0 ({lam0})")
        self.q = positive_int("q", q)
        self.b1, self.b2 = positive_int("b1", b1), positive_int("b2", b2)
        self.b3, self.b4 = positive_int("b3", b3), positive_int("b4", b4)
        self.s_batch = self.b2 if s_batch is None else positive_int("s_batch", s_batch)
        self.lr = positive("lr", lr)
        self.lam_lr = optional_positive("lam_lr", lam_lr)
        self.beta = unit_interval("beta", beta)
        self.clip_v, self.clip_u, self.clip_s = (
            positive("clip_v", clip_v),
            positive("clip_u", clip_u),
            positive("clip_s", clip_s),
        )
        self.gamma_v, self.gamma_u = optional_positive("gamma_v", gamma_v), optional_positive("gamma_u", gamma_u)
        self.clip_v_diff = optional_positive("clip_v_diff", clip_v_diff)
        self.clip_u_diff = optional_positive("clip_u_diff", clip_u_diff)
        for g, c, nm in ((self.gamma_v, self.clip_v_diff, "v"), (self.gamma_u, self.clip_u_diff, "u")):
            if g is None and c is None:
                raise ConfigError(f"gamma_{nm} is None (fixed threshold) but clip_{nm}_diff is not set")
        self.loss_bound = positive("loss_bound", loss_bound)
        if shift is not None and shift != "adaptive" and not isinstance(shift, (int, float)):
            raise ConfigError(f"shift must be 'adaptive', a number or None, got {shift!r}")
        self.adaptive_shift = shift == "adaptive"
        self.exp_cap = optional_positive("exp_cap", exp_cap)
        self.objective = KLCompositional(
            rho=self.rho,
            lam0=self.lam0,
            loss_bound=self.loss_bound,
            shift=None if self.adaptive_shift else shift,
            a_max=self.exp_cap,
        )
        self.shift = "adaptive" if self.adaptive_shift else self.objective.shift
        self.shift_offset = positive("shift_offset", shift_offset)
        lam_max = auto_or_positive("lam_max", lam_max)
        self.lam_max = self.loss_bound / math.sqrt(8.0 * self.rho) if lam_max == "auto" else lam_max
        if self.lam_max is not None and self.lam_max < self.lam_init:
            self.lam_max = self.lam_init
        self.lam_step_frac = optional_positive("lam_step_frac", lam_step_frac)
        self.cap_v = bool(cap_v)
        self.x_step_cap = optional_positive("x_step_cap", x_step_cap)
        self.s_min = optional_positive("s_min", s_min)
        self.share_batches = bool(share_batches)
        self._state: dict[str, Any] = {}
        self._last_batches: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ schedule & inventory
    def _planned_T(self, n: int) -> int:
        return spider_steps(epochs=self.epochs, n=n, q=self.q, refresh=self.b1, correction=self.b2)

    def _plans(self, n: int) -> dict[str, BatchPlan]:
        return {
            "v-refresh": BatchPlan(self.b1, n),
            "u-refresh": BatchPlan(self.b3, n),
            "v-diff": BatchPlan(self.b2, n),
            "u-diff": BatchPlan(self.b4, n),
            "s": BatchPlan(self.s_batch, n),
        }

    def inventory(self, *, n: int) -> Inventory | None:
        if not self.private:
            return None
        T = self._T_for(n)
        R = math.ceil(T / self.q)
        p = self._plans(n)
        steps = []
        # Refreshes: the first one also releases the s_0 initialisation on the v-refresh batch.
        if self._shared("v-refresh", "u-refresh", p):
            steps += [
                PlannedStep(p["v-refresh"].sampling, (("v-refresh", 1.0), ("u-refresh", 1.0), ("s", 1.0)), 1),
                PlannedStep(p["v-refresh"].sampling, (("v-refresh", 1.0), ("u-refresh", 1.0)), R - 1),
            ]
        else:
            steps += [
                PlannedStep(p["v-refresh"].sampling, (("v-refresh", 1.0), ("s", 1.0)), 1),
                PlannedStep(p["v-refresh"].sampling, (("v-refresh", 1.0),), R - 1),
                PlannedStep(p["u-refresh"].sampling, (("u-refresh", 1.0),), R),
            ]
        if self._shared("v-diff", "u-diff", p):
            steps.append(PlannedStep(p["v-diff"].sampling, (("v-diff", 1.0), ("u-diff", 1.0)), T - R))
        else:
            steps += [
                PlannedStep(p["v-diff"].sampling, (("v-diff", 1.0),), T - R),
                PlannedStep(p["u-diff"].sampling, (("u-diff", 1.0),), T - R),
            ]
        steps.append(PlannedStep(p["s"].sampling, (("s", 1.0),), T))
        return Inventory(tuple(s for s in steps if s.count > 0))

    # ------------------------------------------------------------------ setup & state
    def setup(self, ctx) -> None:
        self._bind(ctx)
        self._make_samplers(self._plans(ctx.n), pairs=(("v-refresh", "u-refresh"), ("v-diff", "u-diff")))
        c0 = initial_loss_scale(ctx) if self.adaptive_shift else self.objective.shift
        self._state = {
            "lam": self.lam_init,
            "lam_prev": None,
            "x_prev": None,
            "v": None,
            "u": None,
            "s": None,
            "c": float(c0),
        }
        self._last_batches = {}

    def state_dict(self) -> dict[str, Any]:
        return {"state": dict(self._state), **self._base_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = dict(state["state"])
        self._load_base_state(state)

    def _load_output_scalars(self, saved: dict[str, Any]) -> None:
        self._state["lam"] = saved["lam"]

    @property
    def lam(self) -> float:
        """The current dual variable λ_t (released)."""
        return float(self._state["lam"])

    @property
    def estimates(self) -> dict[str, Any]:
        """Current estimates ``v`` (∇_x h2), ``u`` (∂_λ h2), ``s`` (h2)."""
        return {k: self._state[k] for k in ("v", "u", "s")}

    @property
    def last_batches(self) -> dict[str, torch.Tensor]:
        """Indices of the latest v-, u- and s-query batches (diagnostics; never released)."""
        return self._last_batches

    # ------------------------------------------------------------------ pre-noise statistics
    # Sums over the batch of per-record clipped terms (add/remove sensitivity = the threshold;
    # (2−β)·C for the STORM s-query).
    def v_grad_sum(self, idx, *, x: torch.Tensor | None, lam: float, clip: float) -> torch.Tensor:
        """``Σ Clip(∇_x h(w; ξ_i), C)`` with ``∇_x h = (h/λ)·∇ℓ`` ([d])."""
        return self._grad_sum(idx, clip=clip, x=x, weights=self.objective.h_weight_fn(lam, shift=self._c()))

    def v_diff_sum(
        self, idx, *, x: torch.Tensor | None, lam: float, x_prev: torch.Tensor, lam_prev: float, clip: float
    ) -> torch.Tensor:
        """``Σ Clip(∇_x h(w; ξ_i) − ∇_x h(w_prev; ξ_i), C)`` ([d])."""
        c = self._c()
        return self._grad_sum(
            idx,
            clip=clip,
            x=x,
            weights=self.objective.h_weight_fn(lam, shift=c),
            x_prev=x_prev,
            weights_prev=self.objective.h_weight_fn(lam_prev, shift=c),
        )

    def _h_lam(self, idx, x, lam) -> torch.Tensor:
        if idx.numel() == 0:
            return torch.zeros(0, dtype=torch.float64)
        return self.objective.h_lam_grads(self._losses(idx, x), lam, shift=self._c())

    def _h(self, idx, x, lam) -> torch.Tensor:
        if idx.numel() == 0:
            return torch.zeros(0, dtype=torch.float64)
        return self.objective.h(self._losses(idx, x), lam, shift=self._c()).detach()

    def u_grad_sum(self, idx, *, x: torch.Tensor | None, lam: float, clip: float) -> torch.Tensor:
        """``Σ Clip(∇_λ h(w; ξ_i), C)`` (1-element float64)."""
        return clipped_scalar_sum(self._h_lam(idx, x, lam), clip)

    def u_diff_sum(
        self, idx, *, x: torch.Tensor | None, lam: float, x_prev: torch.Tensor, lam_prev: float, clip: float
    ) -> torch.Tensor:
        """``Σ Clip(∇_λ h(w; ξ_i) − ∇_λ h(w_prev; ξ_i), C)`` (1-element float64)."""
        return clipped_scalar_sum(self._h_lam(idx, x, lam) - self._h_lam(idx, x_prev, lam_prev), clip)

    def s_value_sum(self, idx, *, x: torch.Tensor | None, lam: float, clip: float) -> torch.Tensor:
        """``Σ Clip(h(w; ξ_i), C)`` (the s_0 initialisation; 1-element float64)."""
        return clipped_scalar_sum(self._h(idx, x, lam), clip)

    def s_storm_sum(
        self,
        idx,
        *,
        x: torch.Tensor | None,
        lam: float,
        x_prev: torch.Tensor,
        lam_prev: float,
        beta: float,
        clip: float,
    ) -> torch.Tensor:
        """``Σ [Clip(h(w; ξ_i), C) − (1−β)·Clip(h(w_prev; ξ_i), C)]`` (per record ≤ (2−β)C)."""
        now = self._h(idx, x, lam).clamp(-clip, clip)
        before = self._h(idx, x_prev, lam_prev).clamp(-clip, clip)
        return (now - (1.0 - beta) * before).sum().reshape(1)

    def _c(self) -> float:
        """The current (public) shift c of the inner function."""
        if self._state and self._state.get("c") is not None:
            return float(self._state["c"])
        return self.objective.shift

    @property
    def current_shift(self) -> float:
        """The shift c in use (released: a function of noisy estimates and public constants)."""
        return self._c()

    def _recentre(self, lam_prev: float) -> None:
        """Adaptive shift (post-processing): move c so the tracked s becomes e^{−shift_offset}.

        s, v and u estimate h2, ∇_x h2 and ∂_λ h2 at ``w_{t−1}`` (λ = λ_{t−1}) for the old c. A new
        shift rescales them exactly: with ``f = exp((c_old − c_new)/λ)``, ``h ↦ f·h`` so
        ``s ↦ f·s``, ``v ↦ f·v`` and, since ``∂_λ h = −h·(ℓ − c)/λ²``,
        ``u ↦ f·(u − s·(c_old − c_new)/λ²)``. The next correction then adds differences computed
        at the new c for both points, so the SPIDER/STORM recursions stay consistent.
        """
        st = self._state
        s_old, c_old = float(st["s"]), float(st["c"])
        c_new = c_old + lam_prev * (math.log(max(s_old, _TINY)) + self.shift_offset)
        f = math.exp(max(min((c_old - c_new) / lam_prev, 690.0), -690.0))
        st["s"] = s_old * f
        if st.get("v") is not None:
            st["v"] = st["v"] * f
        if st.get("u") is not None:
            st["u"] = f * (float(st["u"]) - s_old * (c_old - c_new) / lam_prev**2)
        st["c"] = c_new

    def _lam_update(self, lam_t: float, z_lam: float) -> float:
        move = (self.lam_lr or self.lr) * z_lam
        if self.lam_step_frac is not None:
            cap = self.lam_step_frac * lam_t
            move = min(max(move, -cap), cap)
        lam = lam_t - move
        if self.lam_max is not None:
            lam = min(lam, self.lam_max)
        return self.objective.project_lam(lam)

    # ------------------------------------------------------------------ one iteration
    def _release(self, key: str, batch, stat: torch.Tensor, clip: float) -> torch.Tensor:
        return batch.gaussian(key, stat, clip=clip, normalizer=self._plans_[key].normalizer)

    def _s_range(self, lam: float) -> tuple[float, float]:
        """Range of h2 for losses in [0, B] (computed in log space; post-processing bounds of s)."""
        c = self._c()
        lo = math.exp(max(-c / lam, -690.0))
        hi = math.exp(min((self.loss_bound - c) / lam, 690.0))
        return max(lo if self.s_min is None else self.s_min, _TINY), hi

    def step(self, t: int) -> dict[str, float]:
        st = self._state
        x_t, lam_t = self._x(), float(st["lam"])
        if t == 0:  # w_0 := w_1 (E-A.16)
            st["x_prev"], st["lam_prev"] = x_t, lam_t
        x_prev, lam_prev = st["x_prev"], float(st["lam_prev"])
        logs: dict[str, float] = {}
        if t > 0 and self.adaptive_shift:
            # Every step (not only at refreshes): between refreshes λ and x move, and a stale c lets
            # h = exp((ℓ − c)/λ) drift over orders of magnitude, which the recursions amplify.
            self._recentre(lam_prev)
        if t % self.q == 0:
            shared = self._samplers["u-refresh"] is self._samplers["v-refresh"]
            names = ["v-refresh"] + (["u-refresh"] if shared else []) + (["s"] if t == 0 else [])
            idx, batch = self._batch(self._samplers["v-refresh"], names)
            self._last_batches["v"] = idx
            v = self._release(
                "v-refresh", batch, self.v_grad_sum(idx, x=None, lam=lam_t, clip=self.clip_v), self.clip_v
            )
            if t == 0:
                s0 = batch.gaussian(
                    "s",
                    self.s_value_sum(idx, x=None, lam=lam_t, clip=self.clip_s),
                    clip=self.clip_s,
                    normalizer=self._plans_["v-refresh"].normalizer,
                )
                st["s"] = float(s0)
            if not shared:
                idx, batch = self._batch(self._samplers["u-refresh"], ["u-refresh"])
            self._last_batches["u"] = idx
            u = float(
                self._release(
                    "u-refresh", batch, self.u_grad_sum(idx, x=None, lam=lam_t, clip=self.clip_u), self.clip_u
                )
            )
        else:
            v, u = st["v"], float(st["u"])
            dw = math.sqrt(float((x_t - x_prev).norm()) ** 2 + (lam_t - lam_prev) ** 2)
            if dw > 0:  # a zero move needs no correction (increment is exactly 0)
                shared = self._samplers["u-diff"] is self._samplers["v-diff"]
                idx, batch = self._batch(self._samplers["v-diff"], ["v-diff", "u-diff"] if shared else ["v-diff"])
                self._last_batches["v"] = idx
                c2 = step_clip(dw, gamma=self.gamma_v, cap=self.clip_v_diff)
                v = v + self._release(
                    "v-diff",
                    batch,
                    self.v_diff_sum(idx, x=None, lam=lam_t, x_prev=x_prev, lam_prev=lam_prev, clip=c2),
                    c2,
                )
                if not shared:
                    idx, batch = self._batch(self._samplers["u-diff"], ["u-diff"])
                self._last_batches["u"] = idx
                c4 = step_clip(dw, gamma=self.gamma_u, cap=self.clip_u_diff)
                u = u + float(
                    self._release(
                        "u-diff",
                        batch,
                        self.u_diff_sum(idx, x=None, lam=lam_t, x_prev=x_prev, lam_prev=lam_prev, clip=c4),
                        c4,
                    )
                )
                logs.update(clip_v_diff=c2, clip_u_diff=c4)
        # STORM update of s on a fresh batch (the per-record term is bounded by (2 − β)·C5).
        idx, batch = self._batch(self._samplers["s"], ["s"])
        self._last_batches["s"] = idx
        bound = (2.0 - self.beta) * self.clip_s
        stat = self.s_storm_sum(
            idx, x=None, lam=lam_t, x_prev=x_prev, lam_prev=lam_prev, beta=self.beta, clip=self.clip_s
        )
        s_raw = float(self._release("s", batch, stat, bound)) + (1.0 - self.beta) * float(st["s"])
        lo, hi = self._s_range(lam_t)
        s = min(max(s_raw, lo), hi)
        v_dir = v
        if self.cap_v and math.isfinite(self.clip_v):
            v_dir = v * min(1.0, self.clip_v / max(float(v.norm()), 1e-300))
        z_x, z_lam = KLCompositional.outer_grads(s=s, v=v_dir, u=u, lam=lam_t, rho=self.rho)
        if self.x_step_cap is not None:
            z_x = z_x * min(1.0, self.x_step_cap / max(float(z_x.norm()), 1e-300))
        # ∂_λΨ = ρ − KL(π‖uniform) lies in [ρ − log n, ρ] (n public); the estimate combines log s
        # and (λ/s)·u, two O((ℓ − c)/λ) terms that cancel — estimation error in either is amplified
        # by 1/λ, so project the estimate onto the range of the true value (post-processing).
        z_lam = min(max(z_lam, self.rho - math.log(self._ctx.n)), self.rho)
        x_next = x_t - self.lr * z_x
        lam_next = self._lam_update(lam_t, z_lam)
        self._set_x(x_next)
        st.update(x_prev=x_t, lam_prev=lam_t, lam=lam_next, v=v, u=u, s=s)
        self._maybe_save(t + 1, x_next, lam=lam_next)
        logs.update(lam=lam_next, s=s, u=u, v_norm=float(v.norm()), z_lam=z_lam, shift=self._c())
        return logs


@register_algorithm
class SCDRO(DPRecursiveSPIDER):
    """Non-private reference (SPEC §2.7, E-A.21): Recursive-SPIDER without noise or clipping.

    Same estimators and updates as :class:`DPRecursiveSPIDER` on KL-constrained DRO (eq. 5), with
    every clip threshold infinite and no privacy noise; the s-estimator uses a minibatch
    (``s_batch``, default 128) as in Qi et al.'s SCDRO. Returns the last iterate by default.

    Defaults (measured on mnist-st, MLP-64, 10 epoch-equivalents: 83.8 % mean test accuracy over
    3 seeds, no failures; the previous q = 32, λ step = x step, β = 0.5 failed 2/3 seeds): short
    phases ``q = 4`` with refresh batches 512 (SPIDER drift grows with the phase length because
    ∇h carries the exp(ℓ/λ) weights), a separate small λ step ``lam_lr = 0.01`` (λ* ≈ 0.3 for
    cross-entropy on this task; λ moving with the x step made h = exp((ℓ − c)/λ) jump by orders
    of magnitude), ``lam_init = 0.5``, and ``β = 1`` (s = the minibatch mean; STORM's stale term
    added variance to log s).
    """

    name = "scdro"
    private = False
    summary = "non-private Recursive-SPIDER on KL-DRO (SCDRO reference)"

    def __init__(
        self,
        *,
        rho: float = 0.5,
        lam0: float = 1e-3,
        lam_init: float = 0.5,
        q: int = 4,
        b1: int = 512,
        b2: int = 128,
        b3: int = 512,
        b4: int = 128,
        s_batch: int = 128,
        lr: float = 0.1,
        lam_lr: float | None = 0.01,
        beta: float = 1.0,
        loss_bound: float = 10.0,
        shift: str | float | None = "adaptive",
        s_min: float | None = None,
        share_batches: bool = True,
        epochs: float = 20,
        steps: int | None = None,
        output: str = "last",
        chunk_size: int = 256,
    ):
        super().__init__(
            rho=rho,
            lam0=lam0,
            lam_init=lam_init,
            q=q,
            b1=b1,
            b2=b2,
            b3=b3,
            b4=b4,
            s_batch=s_batch,
            lr=lr,
            lam_lr=lam_lr,
            beta=beta,
            gamma_v=None,
            gamma_u=None,
            clip_v_diff=1.0,
            clip_u_diff=1.0,
            loss_bound=loss_bound,
            shift=shift,
            s_min=s_min,
            share_batches=share_batches,
            epochs=epochs,
            steps=steps,
            output=output,
            chunk_size=chunk_size,
            private=False,
        )
        # No clipping: infinite thresholds make every clip factor 1 (engine and scalar sums).
        self.clip_v = self.clip_u = self.clip_s = self.clip_v_diff = self.clip_u_diff = math.inf

    def hyperparameters(self) -> dict[str, Any]:
        hp = super().hyperparameters()
        for k in ("clip_v", "clip_u", "clip_s", "clip_v_diff", "clip_u_diff", "gamma_v", "gamma_u"):
            hp.pop(k, None)
        return hp
