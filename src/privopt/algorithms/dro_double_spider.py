"""DP Double-SPIDER (Paper A, Algorithm 2; SPEC §2.4) on the ψ-dual objective ``L(x, η)``.

Two SPIDER estimators, one per block, with alternating updates (η first, then x at the fresh
η_{t+1}):

* every ``q`` iterations a *refresh*: ``g_t`` = noisy mean of per-sample clipped
  ``∇_η L(x_t, η_t; ξ)`` (scalar, threshold C1) and ``v_t`` = noisy mean of per-sample clipped
  ``∇_x L(x_t, η_{t+1}; ξ)`` (d-dim, C3), on batches of expected size N1 / N3;
* otherwise a *correction*: ``g_t = g_{t−1} +`` noisy mean of per-sample clipped differences
  ``∇_η L(x_t, η_t; ξ) − ∇_η L(x_{t−1}, η_{t−1}; ξ)`` (C2_t) and ``v_t = v_{t−1} +`` noisy mean of
  ``∇_x L(x_t, η_{t+1}; ξ) − ∇_x L(x_{t−1}, η_t; ξ)`` (C4_t), on batches of expected size N2 / N4;
* ``η_{t+1} = η_t − α·g_t``, ``x_{t+1} = x_t − β_t·v_t``; the output is a uniformly random iterate.

Deviations from the printed algorithm (all documented in SPEC §7.A):

* per-sample clipping (E-A.6) instead of clipping the batch mean; Poisson batches normalised by
  the expected size (or the full dataset when a batch size reaches n);
* step-proportional difference thresholds (E-A.10, §8.4): ``C2_t = γ_η·max(|η_t−η_{t−1}|,
  ‖x_t−x_{t−1}‖)``, ``C4_t = γ_x·max(|η_{t+1}−η_t|, ‖x_t−x_{t−1}‖)``, optionally capped (or fixed
  thresholds when γ is None). A correction whose distance is exactly 0 is skipped (its increment
  is 0; no data access and no privacy event), so the planned counts are upper bounds;
* noise multipliers come from the accountant (§8.1, uniform allocation) using the true counts
  ``ceil(T/q)`` refreshes and ``T − ceil(T/q)`` corrections (E-A.11);
* the penalty λ is an explicit hyper-parameter ``lam`` (E-A.5; literal reading λ = λ0 = 1e−3);
  losses are clamped to ``[0, loss_bound]`` and the ψ* argument capped at ``exp_cap`` (§8.7,
  straight-through; see :class:`privopt.objectives.DualObjective`);
* ``share_batches`` (default): when N1 = N3 (resp. N2 = N4) the η- and x-queries of an iteration
  use ONE batch, accounted as one sampled step releasing two Gaussians (the paper draws separate
  batches; sharing halves the data accesses and the subsampling events);
* x step: ``β_t = min(lr, lr_norm/‖v_t‖)`` (E-A.8, SPEC §2.4's normalised step), by default with
  ``lr_norm = lr·clip_x``: the nominal norm of v (a mean of C3-clipped terms) is ≤ clip_x, so the
  cap only binds when noise or SPIDER drift inflates ‖v‖ — it stops the feedback loop
  "large v → large step → large difference threshold → larger v" seen without it;
* η safeguards (post-processing of released values, DP unaffected): η_0 defaults to ``log K``
  (K = number of model outputs: the cross-entropy of a uniform prediction, i.e. the loss scale
  at initialisation, SPEC §8.7 — data-independent), each η step is capped at ``eta_lr·clip_eta``
  (the nominal bound of the clipped mean g) and η is projected onto ``[−B, B]/g_η`` (the optimal
  η lies in the loss range for KL/χ²; B = loss_bound).
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
from privopt.objectives.dual import DualObjective
from privopt.privacy import Inventory, PlannedStep
from privopt.validation import auto_or_positive, optional_positive, positive, positive_int

__all__ = ["DPDoubleSPIDER"]


@register_algorithm
class DPDoubleSPIDER(DROAlgorithm):
    """DP Double-SPIDER for ψ-penalised DRO (any ψ of :mod:`privopt.objectives.divergences`).

    Privacy inventory (uniform noise multiplier z for every family, calibrated by the loop):
    ``eta-refresh`` and ``x-refresh`` (ceil(T/q) times each, rate N1/n and N3/n), ``eta-diff`` and
    ``x-diff`` (T − ceil(T/q) times each, rate N2/n and N4/n); families sharing a batch form one
    planned step.

    Args:
        divergence, divergence_params: ψ (e.g. ``"kl"``, ``"chi2"``, ``"kl_cvar"`` with
            ``{"alpha": 0.1}``).
        lam: the DRO penalty λ (λ_DS, SPEC E-A.5). g_eta: rescaling of η (default 1).
        q: phase length. N1, N2, N3, N4: refresh/correction batch sizes of the η/x estimators
            (a size ≥ n means the full dataset).
        lr: x step β (its maximum). lr_norm: normalised-step constant (the largest x move per
            step); ``"auto"`` (default) = ``lr·clip_x``; ``None`` = constant step ``lr``.
        eta_lr: η step α. eta_init: η_0 (default ``None``: ``log K`` with K the number of model
            outputs, the loss scale at initialisation; data-independent).
        eta_step_cap: cap on ``|η_{t+1} − η_t|``; ``"auto"`` (default) = ``eta_lr·clip_eta``;
            ``None`` disables it.
        clip_eta, clip_x: refresh thresholds C1, C3.
        gamma_eta, gamma_x: step-proportional factors of C2_t, C4_t (None: fixed thresholds).
        clip_eta_diff, clip_x_diff: caps of C2_t, C4_t (the fixed thresholds when γ is None).
        loss_bound: public clamp B of the losses. exp_cap: cap on the ψ* argument (None: off).
            Default 30, not SPEC's 50: the x-query weights (ψ*)'(·) (e^30 ≈ 1e13 for KL) multiply
            float32 per-sample gradients, and with e^50 their squared norms overflow float32, which
            makes the engine's clip factor 0 and silently drops the most-weighted records.
        share_batches: one batch for the η- and x-queries of an iteration when sizes agree.
        epochs, steps, output, chunk_size: see :class:`DROAlgorithm`.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-double-spider", steps=64, q=16, N1=500, N2=50, N3=500, N4=50)
        >>> [(s.mechanisms, s.count) for s in algo.inventory(n=1000).steps]
        [((('eta-refresh', 1.0), ('x-refresh', 1.0)), 4), ((('eta-diff', 1.0), ('x-diff', 1.0)), 60)]
    """

    name = "dp-double-spider"
    summary = "DP Double-SPIDER (Paper A Alg. 2) on the psi-dual L(x, eta)"

    def __init__(
        self,
        *,
        divergence: str = "kl",
        divergence_params: dict | None = None,
        lam: float = 1e-3,
        g_eta: float = 1.0,
        q: int = 32,
        N1: int = 2048,
        N2: int = 128,
        N3: int = 2048,
        N4: int = 128,
        lr: float = 0.1,
        lr_norm: str | float | None = "auto",
        eta_lr: float = 0.1,
        eta_init: float | None = None,
        eta_step_cap: str | float | None = "auto",
        clip_eta: float = 1.0,
        clip_x: float = 1.0,
        gamma_eta: float | None = 10.0,
        gamma_x: float | None = 10.0,
        clip_eta_diff: float | None = None,
        clip_x_diff: float | None = None,
        loss_bound: float = 10.0,
        exp_cap: float | None = 30.0,
        share_batches: bool = True,
        epochs: float = 20,
        steps: int | None = None,
        output: str = "random",
        chunk_size: int = 256,
        private: bool = True,
    ):
        super().__init__(epochs=epochs, steps=steps, output=output, chunk_size=chunk_size)
        self.private = bool(private)  # False: same clipped updates without noise (reference runs)
        self.divergence = divergence
        self.divergence_params = dict(divergence_params or {})
        self.lam = positive("lam", lam)
        self.g_eta = positive("g_eta", g_eta)
        self.q = positive_int("q", q)
        self.N1, self.N2 = positive_int("N1", N1), positive_int("N2", N2)
        self.N3, self.N4 = positive_int("N3", N3), positive_int("N4", N4)
        self.lr = positive("lr", lr)
        self.lr_norm = auto_or_positive("lr_norm", lr_norm)
        self.eta_step_cap = auto_or_positive("eta_step_cap", eta_step_cap)
        self.eta_lr = positive("eta_lr", eta_lr)
        self.loss_bound = positive("loss_bound", loss_bound)
        if eta_init is not None and not (isinstance(eta_init, (int, float)) and math.isfinite(eta_init)):
            raise ConfigError(f"eta_init must be a finite number, got {eta_init!r}")
        self.eta_init = None if eta_init is None else float(eta_init)
        self.clip_eta, self.clip_x = positive("clip_eta", clip_eta), positive("clip_x", clip_x)
        self.gamma_eta = optional_positive("gamma_eta", gamma_eta)
        self.gamma_x = optional_positive("gamma_x", gamma_x)
        self.clip_eta_diff = optional_positive("clip_eta_diff", clip_eta_diff)
        self.clip_x_diff = optional_positive("clip_x_diff", clip_x_diff)
        for g, c, nm in ((self.gamma_eta, self.clip_eta_diff, "eta"), (self.gamma_x, self.clip_x_diff, "x")):
            if g is None and c is None:
                raise ConfigError(f"gamma_{nm} is None (fixed threshold) but clip_{nm}_diff is not set")
        self.exp_cap = optional_positive("exp_cap", exp_cap)
        self.share_batches = bool(share_batches)
        # Built now so a bad divergence fails at construction, not mid-run.
        self.objective = DualObjective(
            divergence=self._divergence(),
            lam=self.lam,
            g_eta=self.g_eta,
            a_max=self.exp_cap,
            loss_bound=self.loss_bound,
        )
        self._state: dict[str, Any] = {}

    def _divergence(self):
        from privopt.objectives.divergences import get_divergence

        return get_divergence(self.divergence, **self.divergence_params)

    # ------------------------------------------------------------------ schedule & inventory
    def _planned_T(self, n: int) -> int:
        return spider_steps(epochs=self.epochs, n=n, q=self.q, refresh=self.N3, correction=self.N4)

    def _plans(self, n: int) -> dict[str, BatchPlan]:
        return {
            "eta-refresh": BatchPlan(self.N1, n),
            "x-refresh": BatchPlan(self.N3, n),
            "eta-diff": BatchPlan(self.N2, n),
            "x-diff": BatchPlan(self.N4, n),
        }

    def inventory(self, *, n: int) -> Inventory | None:
        if not self.private:
            return None
        T = self._T_for(n)
        refreshes = math.ceil(T / self.q)
        plans = self._plans(n)
        steps = []
        for (a, b), count in ((("eta-refresh", "x-refresh"), refreshes), (("eta-diff", "x-diff"), T - refreshes)):
            if self._shared(a, b, plans):
                steps.append(PlannedStep(plans[a].sampling, ((a, 1.0), (b, 1.0)), count))
            else:
                steps += [
                    PlannedStep(plans[a].sampling, ((a, 1.0),), count),
                    PlannedStep(plans[b].sampling, ((b, 1.0),), count),
                ]
        return Inventory(tuple(steps))

    # ------------------------------------------------------------------ setup & state
    def setup(self, ctx) -> None:
        self._bind(ctx)
        self._make_samplers(self._plans(ctx.n), pairs=(("eta-refresh", "x-refresh"), ("eta-diff", "x-diff")))
        eta0 = self.eta_init if self.eta_init is not None else initial_loss_scale(ctx) / self.g_eta
        self._state = {"eta": self._project_eta(eta0), "eta_prev": None, "x_prev": None, "g": None, "v": None}
        self._last_batches: dict[str, torch.Tensor] = {}  # diagnostics for tests; not checkpointed

    def state_dict(self) -> dict[str, Any]:
        return {"state": dict(self._state), **self._base_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = dict(state["state"])
        self._load_base_state(state)

    @property
    def last_batches(self) -> dict[str, torch.Tensor]:
        """Indices of the latest η- and x-query batches (diagnostics; never released)."""
        return self._last_batches

    @property
    def eta(self) -> float:
        """The current dual variable η_t (released: a function of noisy estimates)."""
        return float(self._state["eta"])

    @property
    def estimates(self) -> dict[str, Any]:
        """The current estimators ``g`` (of ∇_η L) and ``v`` (of ∇_x L)."""
        return {"g": self._state["g"], "v": self._state["v"]}

    def _load_output_scalars(self, saved: dict[str, Any]) -> None:
        self._state["eta"] = saved["eta"]

    # ------------------------------------------------------------------ pre-noise statistics
    # Each returns the SUM over the batch of per-record clipped terms: its add/remove-one
    # sensitivity is the clip threshold (tested in tests/test_dro_sensitivity.py).
    def eta_grad_sum(self, idx: torch.Tensor, *, x: torch.Tensor | None, eta: float, clip: float) -> torch.Tensor:
        """``Σ_{i∈idx} Clip(∇_η L(x, η; ξ_i), C)`` (1-element float64)."""
        losses = self._losses(idx, x)
        return clipped_scalar_sum(self.objective.eta_grads(losses, eta), clip)

    def eta_diff_sum(
        self,
        idx: torch.Tensor,
        *,
        x: torch.Tensor | None,
        eta: float,
        x_prev: torch.Tensor,
        eta_prev: float,
        clip: float,
    ) -> torch.Tensor:
        """``Σ Clip(∇_η L(x, η; ξ_i) − ∇_η L(x_prev, η_prev; ξ_i), C)`` (1-element float64)."""
        now = self.objective.eta_grads(self._losses(idx, x), eta)
        before = self.objective.eta_grads(self._losses(idx, x_prev), eta_prev)
        return clipped_scalar_sum(now - before, clip)

    def x_grad_sum(self, idx: torch.Tensor, *, x: torch.Tensor | None, eta: float, clip: float) -> torch.Tensor:
        """``Σ Clip(∇_x L(x, η; ξ_i), C)`` with ``∇_x L = (ψ*)'((ℓ−g_η η)/λ)·∇ℓ`` ([d])."""
        return self._grad_sum(idx, clip=clip, x=x, weights=self.objective.weight_fn(eta))

    def x_diff_sum(
        self,
        idx: torch.Tensor,
        *,
        x: torch.Tensor | None,
        eta: float,
        x_prev: torch.Tensor,
        eta_prev: float,
        clip: float,
    ) -> torch.Tensor:
        """``Σ Clip(∇_x L(x, η; ξ_i) − ∇_x L(x_prev, η_prev; ξ_i), C)`` ([d])."""
        return self._grad_sum(
            idx,
            clip=clip,
            x=x,
            weights=self.objective.weight_fn(eta),
            x_prev=x_prev,
            weights_prev=self.objective.weight_fn(eta_prev),
        )

    # ------------------------------------------------------------------ safeguards (post-processing)
    def _project_eta(self, eta: float) -> float:
        bound = self.loss_bound / self.g_eta
        return min(max(float(eta), -bound), bound)

    def _eta_step(self, eta: float, g: float) -> float:
        move = self.eta_lr * g
        cap = self.eta_lr * self.clip_eta if self.eta_step_cap == "auto" else self.eta_step_cap
        if cap is not None:
            move = min(max(move, -cap), cap)
        return self._project_eta(eta - move)

    def _beta(self, v_norm: float) -> float:
        lr_norm = self.lr * self.clip_x if self.lr_norm == "auto" else self.lr_norm
        if lr_norm is None:
            return self.lr
        return min(self.lr, lr_norm / max(v_norm, 1e-12))

    # ------------------------------------------------------------------ one iteration
    def _release(self, key: str, batch, stat: torch.Tensor, clip: float) -> torch.Tensor:
        return batch.gaussian(key, stat, clip=clip, normalizer=self._plans_[key].normalizer)

    def step(self, t: int) -> dict[str, float]:
        st = self._state
        x_t, eta_t = self._x(), float(st["eta"])
        shared = {
            "refresh": self._samplers["x-refresh"] is self._samplers["eta-refresh"],
            "diff": self._samplers["x-diff"] is self._samplers["eta-diff"],
        }
        logs: dict[str, float] = {}
        if t % self.q == 0:
            idx, batch = self._batch(
                self._samplers["eta-refresh"], ["eta-refresh", "x-refresh"] if shared["refresh"] else ["eta-refresh"]
            )
            self._last_batches["eta"] = idx
            g = float(
                self._release(
                    "eta-refresh", batch, self.eta_grad_sum(idx, x=None, eta=eta_t, clip=self.clip_eta), self.clip_eta
                )
            )
            eta_next = self._eta_step(eta_t, g)
            if not shared["refresh"]:
                idx, batch = self._batch(self._samplers["x-refresh"], ["x-refresh"])
            self._last_batches["x"] = idx
            v = self._release(
                "x-refresh", batch, self.x_grad_sum(idx, x=None, eta=eta_next, clip=self.clip_x), self.clip_x
            )
        else:
            x_prev, eta_prev = st["x_prev"], float(st["eta_prev"])
            dx = float((x_t - x_prev).norm())
            d_eta = max(abs(eta_t - eta_prev), dx)
            g, v = float(st["g"]), st["v"]
            batch = idx = None
            if d_eta > 0:
                names = ["eta-diff", "x-diff"] if shared["diff"] else ["eta-diff"]
                idx, batch = self._batch(self._samplers["eta-diff"], names)
                self._last_batches["eta"] = idx
                c2 = step_clip(d_eta, gamma=self.gamma_eta, cap=self.clip_eta_diff)
                stat = self.eta_diff_sum(idx, x=None, eta=eta_t, x_prev=x_prev, eta_prev=eta_prev, clip=c2)
                g = g + float(self._release("eta-diff", batch, stat, c2))
                logs["clip_eta_diff"] = c2
            eta_next = self._eta_step(eta_t, g)
            d_x = max(abs(eta_next - eta_t), dx)
            if d_x > 0:
                if batch is None or not shared["diff"]:
                    idx, batch = self._batch(self._samplers["x-diff"], ["x-diff"])
                self._last_batches["x"] = idx
                c4 = step_clip(d_x, gamma=self.gamma_x, cap=self.clip_x_diff)
                stat = self.x_diff_sum(idx, x=None, eta=eta_next, x_prev=x_prev, eta_prev=eta_t, clip=c4)
                v = v + self._release("x-diff", batch, stat, c4)
                logs["clip_x_diff"] = c4
        v_norm = float(v.norm())
        beta = self._beta(v_norm)
        x_next = x_t - beta * v
        self._set_x(x_next)
        st.update(x_prev=x_t, eta_prev=eta_t, eta=eta_next, g=g, v=v)
        self._maybe_save(t + 1, x_next, eta=eta_next)
        # All logged values are functions of released (noisy) estimates: safe to log.
        logs.update(eta=eta_next, g=g, v_norm=v_norm, step_size=beta)
        return logs
