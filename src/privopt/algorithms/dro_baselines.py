"""Baselines of Paper A (SPEC §2.7): DP-SGDA, PrivateDiff, DP-SGD on (x, η), and ERM.

* ``dp-sgda`` and ``private-diff`` are **reconstructions** (the seed specifies neither): noisy
  descent on x / ascent on ``p ∈ Δ_n`` for the primal–dual form (2)
  ``min_x max_p Σ_i p_i ℓ_i − λ·D_ψ(p, 1/n)``. The dual iterate is stored as ``r = n·p``
  (mean 1). Its ascent direction ``ℓ_i − λ·ψ'(r_i)`` needs the n-vector of losses; each step
  releases the batch's losses (clamped to ``[0, B]``) as an n-vector with Gaussian noise on
  EVERY coordinate (a record moves one coordinate by ≤ B, so B is its per-record bound),
  divided by the sampling rate (an unbiased estimate of the full loss vector), then projects
  onto ``{r ≥ 0, mean r = 1}``. The x-query is the usual clipped sum of ``r_i·∇ℓ_i``.
  PrivateDiff replaces the x-estimate by a SPIDER (refresh every q steps, step-proportional
  clipped differences ``r_i^t ∇ℓ_i(x_t) − r_i^{t−1} ∇ℓ_i(x_{t−1})`` in between, threshold
  ``γ·max(‖Δx‖, max_i |Δr_i|)``) — "private gradient differences" after Zhang et al. 2025c.
  Both need ψ' finite on (0, ∞) (KL, χ², Cressie–Read); ψ' is evaluated at ``max(r, 1e−12)``.
* ``dp-sgd-joint``: DP-SGD on ``z = (x, η)`` for the dual (3) (Remark 1), clipping the
  concatenated per-sample gradient ``(∇_x L, ∇_η L)`` as one vector.
* ``erm``: the non-private ERM reference (minibatch SGD on the mean loss).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.dpsgd import SGD, _BatchAlgorithm
from privopt.algorithms.dro_common import (
    BatchPlan,
    DROAlgorithm,
    spider_steps,
    step_clip,
)
from privopt.errors import ConfigError
from privopt.grads.flat import num_trainable
from privopt.grads.release import PrivateBatch
from privopt.objectives.divergences import get_divergence
from privopt.objectives.dual import DualObjective
from privopt.privacy import Inventory, PlannedStep, Poisson
from privopt.validation import optional_positive, positive, positive_int

__all__ = ["DPSGDA", "PrivateDiff", "DPSGDJoint", "ERM", "project_mean_one"]

_R_FLOOR = 1e-12


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


class _PrimalDualBase(DROAlgorithm):
    """Shared state and dual step of the reconstructions on the primal–dual form (2)."""

    def __init__(
        self,
        *,
        divergence: str,
        divergence_params: dict | None,
        lam: float,
        lr: float,
        dual_lr: float,
        clip_x: float,
        loss_bound: float,
        epochs: float,
        steps: int | None,
        output: str,
        chunk_size: int,
    ):
        super().__init__(epochs=epochs, steps=steps, output=output, chunk_size=chunk_size)
        self.divergence = divergence
        self.divergence_params = dict(divergence_params or {})
        self._div = get_divergence(divergence, **self.divergence_params)
        probe = self._div.psi_grad(torch.tensor([_R_FLOOR, 1.0, 1e6], dtype=torch.float64))
        if not bool(torch.isfinite(probe).all()):
            raise ConfigError(
                f"divergence {divergence!r} has psi' infinite on (0, inf) (bounded domain); "
                f"{self.name} supports kl, chi2 and cressie_read"
            )
        self.lam = positive("lam", lam)
        self.lr = positive("lr", lr)
        self.dual_lr = positive("dual_lr", dual_lr)
        self.clip_x = positive("clip_x", clip_x)
        self.loss_bound = positive("loss_bound", loss_bound)
        self._state: dict[str, Any] = {}

    def _init_state(self, n: int) -> None:
        self._state = {"r": torch.ones(n, dtype=torch.float64), "r_prev": None, "x_prev": None, "v": None}

    def state_dict(self) -> dict[str, Any]:
        return {"state": dict(self._state), **self._base_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = dict(state["state"])
        self._load_base_state(state)

    @property
    def dual_weights(self) -> torch.Tensor:
        """The current dual iterate ``r = n·p`` (released: built from noisy releases only)."""
        return self._state["r"]

    # -- pre-noise statistics ----------------------------------------------------------------
    def loss_vector_sum(self, idx: torch.Tensor, *, x: torch.Tensor | None = None, n: int | None = None):
        """n-vector with the batch's clamped losses at their coordinates (per record ≤ B)."""
        n = self._ctx.n if n is None else n
        out = torch.zeros(n, dtype=torch.float64)
        if idx.numel():
            out[idx] = self._losses(idx, x).to(torch.float64).clamp(0.0, self.loss_bound)
        return out

    def x_grad_sum(self, idx: torch.Tensor, *, r: torch.Tensor, clip: float, x: torch.Tensor | None = None):
        """``Σ_{i∈idx} Clip(r_i ∇ℓ_i(x), C)`` ([d])."""
        return self._grad_sum(idx, clip=clip, x=x, weights=r[idx].to(torch.float32))

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
        """``Σ Clip(r_i ∇ℓ_i(x) − r'_i ∇ℓ_i(x_prev), C)`` ([d])."""
        return self._grad_sum(
            idx,
            clip=clip,
            x=x,
            weights=r[idx].to(torch.float32),
            x_prev=x_prev,
            weights_prev=r_prev[idx].to(torch.float32),
        )

    def _dual_step(self, r: torch.Tensor, loss_estimate: torch.Tensor) -> torch.Tensor:
        direction = loss_estimate - self.lam * self._div.psi_grad(r.clamp_min(_R_FLOOR))
        return project_mean_one(r + self.dual_lr * direction)


@register_algorithm
class DPSGDA(_PrimalDualBase):
    """DP-SGDA on the primal–dual form (2) — a RECONSTRUCTION (SPEC §2.7; the seed gives none).

    Each step draws one Poisson batch and releases, as one accounted step, the x-gradient
    ``(Σ Clip(r_i ∇ℓ_i, C) + N(0,(z C)² I_d))/b`` and the loss vector
    ``(Σ_{i∈B} ℓ_i e_i + N(0,(z B)² I_n))/(b/n)``; then simultaneously
    ``x ← x − lr·ĝ_x`` and ``r ← Proj(r + dual_lr·(ℓ̂ − λψ'(r)))``.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> [s.count for s in get_algorithm("dp-sgda", epochs=2, batch_size=100).inventory(n=1000).steps]
        [20]
    """

    name = "dp-sgda"
    summary = "DP-SGDA on the primal-dual DRO form (reconstruction)"

    def __init__(
        self,
        *,
        divergence: str = "kl",
        divergence_params: dict | None = None,
        lam: float = 1e-3,
        batch_size: int = 128,
        lr: float = 0.1,
        dual_lr: float = 0.01,
        clip_x: float = 1.0,
        loss_bound: float = 10.0,
        epochs: float = 20,
        steps: int | None = None,
        output: str = "last",
        chunk_size: int = 256,
        private: bool = True,
    ):
        super().__init__(
            divergence=divergence,
            divergence_params=divergence_params,
            lam=lam,
            lr=lr,
            dual_lr=dual_lr,
            clip_x=clip_x,
            loss_bound=loss_bound,
            epochs=epochs,
            steps=steps,
            output=output,
            chunk_size=chunk_size,
        )
        self.private = bool(private)  # False: same clipped updates without noise (reference runs)
        self.batch_size = positive_int("batch_size", batch_size)

    def _planned_T(self, n: int) -> int:
        return max(1, math.ceil(self.epochs * n / min(self.batch_size, n)))

    def inventory(self, *, n: int) -> Inventory | None:
        if not self.private:
            return None
        plan = BatchPlan(self.batch_size, n)
        return Inventory((PlannedStep(plan.sampling, (("x-grad", 1.0), ("p-grad", 1.0)), self._T_for(n)),))

    def setup(self, ctx) -> None:
        self._bind(ctx)
        self._plan = BatchPlan(self.batch_size, ctx.n)
        self._sampler = self._plan.sampler(ctx.sampler_rng)
        self._init_state(ctx.n)

    def step(self, t: int) -> dict[str, float]:
        st = self._state
        r, x_t = st["r"], self._x()
        idx, batch = self._batch(self._sampler, ["x-grad", "p-grad"])
        g_x = batch.gaussian(
            "x-grad", self.x_grad_sum(idx, r=r, clip=self.clip_x), clip=self.clip_x, normalizer=self._plan.normalizer
        )
        loss_hat = batch.gaussian(
            "p-grad", self.loss_vector_sum(idx), clip=self.loss_bound, normalizer=self._plan.normalizer / self._ctx.n
        )
        x_next = x_t - self.lr * g_x
        self._set_x(x_next)
        st["r"] = self._dual_step(r, loss_hat)
        self._maybe_save(t + 1, x_next)
        return {"g_norm": float(g_x.norm()), "r_max": float(st["r"].max())}


@register_algorithm
class PrivateDiff(_PrimalDualBase):
    """PrivateDiff-style DP descent–ascent on (2) — a RECONSTRUCTION (SPEC §2.7).

    x-estimator: SPIDER with refresh every ``q`` steps (batch ``refresh_batch``, threshold
    ``clip_x``) and step-proportional clipped differences in between (batch ``batch_size``,
    threshold ``min(clip_x_diff, gamma_x·max(‖Δx‖, max_i|Δr_i|))``); dual: the DP-SGDA loss-vector
    release on the same batch each step. A difference with zero distance is skipped.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> inv = get_algorithm("private-diff", steps=64, q=16, refresh_batch=500, batch_size=50).inventory(n=1000)
        >>> [(s.mechanisms, s.count) for s in inv.steps]
        [((('x-refresh', 1.0), ('p-grad', 1.0)), 4), ((('x-diff', 1.0), ('p-grad', 1.0)), 60)]
    """

    name = "private-diff"
    summary = "PrivateDiff-style SPIDER descent-ascent on the primal-dual DRO form (reconstruction)"

    def __init__(
        self,
        *,
        divergence: str = "kl",
        divergence_params: dict | None = None,
        lam: float = 1e-3,
        q: int = 32,
        refresh_batch: int = 2048,
        batch_size: int = 128,
        lr: float = 0.1,
        dual_lr: float = 0.01,
        clip_x: float = 1.0,
        gamma_x: float | None = 10.0,
        clip_x_diff: float | None = None,
        loss_bound: float = 10.0,
        epochs: float = 20,
        steps: int | None = None,
        output: str = "last",
        chunk_size: int = 256,
        private: bool = True,
    ):
        super().__init__(
            divergence=divergence,
            divergence_params=divergence_params,
            lam=lam,
            lr=lr,
            dual_lr=dual_lr,
            clip_x=clip_x,
            loss_bound=loss_bound,
            epochs=epochs,
            steps=steps,
            output=output,
            chunk_size=chunk_size,
        )
        self.private = bool(private)  # False: same clipped updates without noise (reference runs)
        self.q = positive_int("q", q)
        self.refresh_batch = positive_int("refresh_batch", refresh_batch)
        self.batch_size = positive_int("batch_size", batch_size)
        self.gamma_x = optional_positive("gamma_x", gamma_x)
        self.clip_x_diff = optional_positive("clip_x_diff", clip_x_diff)
        if self.gamma_x is None and self.clip_x_diff is None:
            raise ConfigError("gamma_x is None (fixed threshold) but clip_x_diff is not set")

    def _planned_T(self, n: int) -> int:
        return spider_steps(epochs=self.epochs, n=n, q=self.q, refresh=self.refresh_batch, correction=self.batch_size)

    def inventory(self, *, n: int) -> Inventory | None:
        if not self.private:
            return None
        T = self._T_for(n)
        R = math.ceil(T / self.q)
        ref, dif = BatchPlan(self.refresh_batch, n), BatchPlan(self.batch_size, n)
        steps = (
            PlannedStep(ref.sampling, (("x-refresh", 1.0), ("p-grad", 1.0)), R),
            PlannedStep(dif.sampling, (("x-diff", 1.0), ("p-grad", 1.0)), T - R),
        )
        return Inventory(tuple(s for s in steps if s.count > 0))

    def setup(self, ctx) -> None:
        self._bind(ctx)
        self._make_samplers(
            {"refresh": BatchPlan(self.refresh_batch, ctx.n), "diff": BatchPlan(self.batch_size, ctx.n)}, pairs=()
        )
        self._init_state(ctx.n)

    def step(self, t: int) -> dict[str, float]:
        st = self._state
        r, x_t = st["r"], self._x()
        logs: dict[str, float] = {}
        if t % self.q == 0:
            plan = self._plans_["refresh"]
            idx, batch = self._batch(self._samplers["refresh"], ["x-refresh", "p-grad"])
            v = batch.gaussian(
                "x-refresh", self.x_grad_sum(idx, r=r, clip=self.clip_x), clip=self.clip_x, normalizer=plan.normalizer
            )
        else:
            plan = self._plans_["diff"]
            dist = max(float((x_t - st["x_prev"]).norm()), float((r - st["r_prev"]).abs().max()))
            names = ["x-diff", "p-grad"] if dist > 0 else ["p-grad"]
            idx, batch = self._batch(self._samplers["diff"], names)
            v = st["v"]
            if dist > 0:
                c = step_clip(dist, gamma=self.gamma_x, cap=self.clip_x_diff)
                stat = self.x_diff_sum(idx, r=r, r_prev=st["r_prev"], x_prev=st["x_prev"], clip=c)
                v = v + batch.gaussian("x-diff", stat, clip=c, normalizer=plan.normalizer)
                logs["clip_x_diff"] = c
        loss_hat = batch.gaussian(
            "p-grad", self.loss_vector_sum(idx), clip=self.loss_bound, normalizer=plan.normalizer / self._ctx.n
        )
        x_next = x_t - self.lr * v
        self._set_x(x_next)
        st.update(x_prev=x_t, r_prev=r, v=v, r=self._dual_step(r, loss_hat))
        self._maybe_save(t + 1, x_next)
        logs.update(v_norm=float(v.norm()), r_max=float(st["r"].max()))
        return logs


@register_algorithm
class DPSGDJoint(_BatchAlgorithm):
    """DP-SGD on the joint variable ``z = (x, η)`` of the dual objective (3) (SPEC §2.7, Remark 1).

    Per sample, ``(∇_x L, ∇_η L) = (a_i ∇ℓ_i, g_η(1 − a_i))`` with ``a_i = (ψ*)'((ℓ_i − g_η η)/λ)``
    is clipped as ONE (d+1)-vector to ``clip``; one Gaussian release per Poisson batch. x moves with
    a torch SGD step (``lr``, momentum, weight decay), η with ``eta_lr``.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> get_algorithm("dp-sgd-joint", epochs=2, batch_size=100).inventory(n=1000).steps[0].count
        20
    """

    name = "dp-sgd-joint"
    summary = "DP-SGD on (x, eta) for the psi-dual DRO objective"

    def __init__(
        self,
        *,
        divergence: str = "kl",
        divergence_params: dict | None = None,
        lam: float = 1e-3,
        g_eta: float = 1.0,
        epochs: float = 20,
        batch_size: int = 128,
        lr: float = 0.1,
        eta_lr: float = 0.1,
        eta_init: float | None = None,
        clip: float = 1.0,
        loss_bound: float = 10.0,
        exp_cap: float | None = 30.0,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        chunk_size: int = 256,
    ):
        super().__init__(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.divergence = divergence
        self.divergence_params = dict(divergence_params or {})
        self.lam, self.g_eta = positive("lam", lam), positive("g_eta", g_eta)
        self.eta_lr = positive("eta_lr", eta_lr)
        self.clip = positive("clip", clip)
        self.loss_bound = positive("loss_bound", loss_bound)
        if eta_init is not None and not (isinstance(eta_init, (int, float)) and math.isfinite(eta_init)):
            raise ConfigError(f"eta_init must be a finite number, got {eta_init!r}")
        self.eta_init = float(eta_init) if eta_init is not None else self.loss_bound / 2
        self.exp_cap = optional_positive("exp_cap", exp_cap)
        self.chunk_size = positive_int("chunk_size", chunk_size)
        self._objective = DualObjective(
            divergence=get_divergence(divergence, **self.divergence_params),
            lam=self.lam,
            g_eta=self.g_eta,
            a_max=self.exp_cap,
            loss_bound=self.loss_bound,
        )
        self._eta = self.eta_init

    def inventory(self, *, n: int) -> Inventory:
        return Inventory([PlannedStep(Poisson(self._rate(n)), (("grad", 1.0),), self.steps_for(n=n))])

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self._eta = self.eta_init

    @property
    def eta(self) -> float:
        return float(self._eta)

    def joint_grad_sum(self, idx: torch.Tensor, *, eta: float, clip: float) -> torch.Tensor:
        """``Σ_{i∈idx} Clip((∇_x L(x,η;ξ_i), ∇_η L(x,η;ξ_i)), C)`` as one float64 (d+1)-vector."""
        ctx = self._ctx
        total = torch.zeros(num_trainable(ctx.model) + 1, dtype=torch.float64)
        obj = self._objective
        for s in range(0, idx.numel(), self.chunk_size):
            sub = idx[s : s + self.chunk_size]
            xb, yb = ctx.x_train[sub], ctx.y_train[sub]
            # Pass 1 (no clipping): per-sample norms of the x-part a_i·∇ℓ_i and the losses. The
            # joint (d+1)-vector's norm adds the scalar η-part; pass 2 sums a_i·f_i·∇ℓ_i with the
            # joint clip factors f_i. Two engine passes beat materialising [B, d] gradients.
            first = ctx.engine.clipped_sum(
                ctx.model, ctx.loss_fn, xb, yb, clip=math.inf, weights=lambda losses: obj.x_weights(losses, eta)
            )
            a = obj.x_weights(first.losses, eta).to(torch.float64)
            b = obj.eta_grads(first.losses, eta).to(torch.float64)
            norms = torch.sqrt(first.norms.to(torch.float64).pow(2) + b.pow(2))
            f = torch.clamp(clip / norms.clamp_min(1e-300), max=1.0)
            second = ctx.engine.clipped_sum(
                ctx.model, ctx.loss_fn, xb, yb, clip=math.inf, weights=(a * f).to(first.losses.dtype)
            )
            total[:-1] += second.total.to(torch.float64)
            total[-1] += (b * f).sum()
        return total

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx
        idx = self._sampler.sample()
        z = ctx.noise.get("grad", 1.0) if ctx.ledger is not None else 1.0
        batch = PrivateBatch(ctx.ledger, self._sampler.sampling, {"grad": z}, rng=ctx.noise_rng)
        g = batch.gaussian(
            "grad", self.joint_grad_sum(idx, eta=self._eta, clip=self.clip), clip=self.clip, normalizer=self.batch_size
        )
        self._apply(g[:-1].to(torch.float32))
        self._eta = self._eta - self.eta_lr * float(g[-1])
        return {"eta": self._eta, "g_norm": float(g.norm())}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "eta": self._eta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._eta = float(state["eta"])


@register_algorithm
class ERM(SGD):
    """Non-private ERM reference: minibatch SGD on the mean loss (Poisson batches)."""

    name = "erm"
    private = False
    summary = "non-private ERM reference (minibatch SGD on the mean loss)"

    def __init__(
        self,
        *,
        epochs: float = 20,
        batch_size: int = 128,
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ):
        super().__init__(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay)
