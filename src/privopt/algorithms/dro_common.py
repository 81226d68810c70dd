"""Shared plumbing of the DRO algorithms of Paper A (see ``docs/algorithms/dro.md``).

Everything here is data-independent bookkeeping or a per-record transformation applied *before*
clipping, so none of it affects the privacy analysis:

* the common hyper-parameters (:class:`DROConfig`) and the number of iterations implied by an
  epochs budget for a SPIDER schedule (:func:`spider_steps`);
* :class:`DROAlgorithm`, the base class: it binds the algorithm's release plan to the run
  (:class:`~privopt.algorithms.releases.PlanRun`), keeps the model as a flat vector, computes
  clipped sums of per-sample (weighted, differenced) parameter gradients, and draws the uniformly
  random output iterate up front (data-independent).

The DRO x-gradients are privatised as *capped-weight* sums (``docs/algorithms/dro.md``,
"Privatising the weighted gradient"): each record's gradient is clipped to ``C`` first and then
multiplied by its DRO weight, which a public cap ``W`` bounds, so a record contributes at most
``W·C`` and the re-weighting survives clipping (clipping the weighted gradient ``a_i∇ℓ_i`` as one
vector flattened exactly the records DRO up-weights).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import torch

from privopt.algorithms.base import Algorithm, RunContext
from privopt.algorithms.batch_memo import BatchMemo
from privopt.algorithms.config import one_of, param, positive, positive_int
from privopt.algorithms.releases import Phase, PlanRun, Query, ReleasePlan
from privopt.algorithms.step_schedules import ScheduledStepConfig
from privopt.errors import ConfigError
from privopt.grads.engine import clip_factors
from privopt.grads.flat import flat_params, params_from_flat, trainable_parameters, zero_flat
from privopt.grads.sums import BoundedSum, batch_losses, chunked_clipped_sum
from privopt.objectives.divergences import get_divergence
from privopt.objectives.dual import DualObjective, argument_for_weight

__all__ = [
    "DROAlgorithm",
    "DROConfig",
    "check_difference_thresholds",
    "dual_objective",
    "initial_loss_scale",
    "spider_steps",
    "SpiderDROConfig",
    "weight_cap_value",
]

Weights = Union[None, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else positive_int(name, value)


def weight_cap_value(name: str, value: Any) -> float:
    """A public cap on the DRO weights: a finite number >= 1 (the weights average 1)."""
    v = positive(name, value)
    if v < 1.0:
        raise ConfigError(f"{name} must be >= 1 (DRO weights average 1), got {value!r}")
    return v


@dataclass(frozen=True)
class DROConfig(ScheduledStepConfig):
    """Hyper-parameters every DRO algorithm has (besides the x-step schedule ``lr_schedule``,
    ``lr_final`` of :class:`~privopt.algorithms.step_schedules.ScheduledStepConfig`).

    Attributes:
        epochs: budget in epoch-equivalents (see :func:`spider_steps`); ignored when ``steps``.
        steps: explicit number of iterations T.
        output: ``"last"`` (default: the final iterate) or ``"random"`` (the paper's analysis: a
            uniformly random iterate among x_1..x_T, index drawn up front from the sampler
            generator — data-independent; on a short run it is often an early, barely trained one).
        chunk_size: per-sample gradients are computed in chunks of this many records.
    """

    epochs: float = param(20, positive, role="epochs")
    steps: int | None = param(None, _optional_int)
    output: str = param("last", one_of("random", "last"), role="output")
    chunk_size: int = param(256, positive_int)


@dataclass(frozen=True)
class SpiderDROConfig(DROConfig):
    """Hyper-parameters of the two SPIDER DRO methods beyond :class:`DROConfig`.

    Attributes:
        weight_cap: the public cap A on a record's DRO weight (its weighted gradient is at most
            ``A·clip``; each method says how its weights are capped). Default 1.25: the x-query's
            noise grows with A (the paper-scale 4 quadrupled it).
        q: phase length (iterations between refreshes of the estimators). Default 1 (a refresh
            every step): under DP a correction's noise is set by its threshold, not by the true
            difference, and longer phases lost accuracy (``docs/algorithms/dro.md``, "Defaults";
            the paper's 32: :data:`~privopt.algorithms.dro_presets.PAPER_DEFAULTS`).
    """

    weight_cap: float = param(1.25, weight_cap_value, role="weight_cap")
    q: int = param(1, positive_int, role="phase")


def spider_steps(*, epochs: float, n: int, q: int, refresh: int, correction: int) -> int:
    """Iterations ``T`` (a multiple of q when possible) for an epochs budget.

    One *epoch-equivalent* is ``n`` per-sample parameter-gradient evaluations (as for DP-SGD):
    a phase of q iterations costs ``refresh + 2·(q−1)·correction`` of them (a difference query
    evaluates each sampled record at two points). Scalar-only queries (η, λ, s) need forward
    passes only and are not counted.
    """
    refresh, correction = min(refresh, n), min(correction, n)
    per_phase = refresh + 2 * (q - 1) * correction
    return max(1, int(round(epochs * n * q / per_phase)))


def check_difference_thresholds(config, blocks) -> None:
    """Each block's difference query needs a step-proportional factor ``gamma_<b>`` or a fixed
    threshold ``clip_<b>_diff``."""
    for b in blocks:
        if getattr(config, f"gamma_{b}") is None and getattr(config, f"clip_{b}_diff") is None:
            raise ConfigError(f"gamma_{b} is None (fixed threshold) but clip_{b}_diff is not set")


def dual_objective(config) -> DualObjective:
    """The ψ-dual objective of a config with ``divergence(_params)``, ``lam``, ``g_eta``,
    ``weight_cap`` and ``loss_bound``: the argument of the weights is capped where they reach
    ``weight_cap`` (so every weight is at most the cap)."""
    div = get_divergence(config.divergence, **config.divergence_params)
    a_max = argument_for_weight(div, config.weight_cap)
    return DualObjective(divergence=div, lam=config.lam, g_eta=config.g_eta, a_max=a_max, loss_bound=config.loss_bound)


@torch.no_grad()
def initial_loss_scale(ctx: RunContext) -> float:
    """``log K`` for a model with K outputs: the cross-entropy of a uniform prediction.

    A data-independent stand-in for "the loss scale at initialisation" (used for η_0 and for the
    shift of the KL inner function): K is read from the output shape of one all-zeros input, so
    no record is touched. Falls back to 1.0 for a single-output model.
    """
    probe = torch.zeros_like(ctx.x_train[:1])
    out = ctx.model(probe)
    k = int(out.shape[-1]) if out.dim() > 1 else 1
    return math.log(k) if k > 1 else 1.0


class DROAlgorithm(Algorithm):
    """Base of the DRO algorithms: release plan, flat-vector model access, output iterate.

    Subclasses define :meth:`release_plan` (their privacy schedule, declared once) and
    :meth:`_planned_T`; the inventory and the runtime releases both derive from the plan.
    """

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._ctx: RunContext | None = None
        self._T: int | None = None
        self._tau: int | None = None
        self._saved: dict[str, Any] | None = None
        self.releases: PlanRun | None = None
        self._memo = BatchMemo()

    # -- schedule and plan -------------------------------------------------------------------
    def _phase_sizes(self) -> tuple[int, int]:
        """(refresh, correction) batch sizes of a SPIDER phase (they convert epochs to iterations)."""
        raise NotImplementedError

    def _planned_T(self, n: int) -> int:
        refresh, correction = self._phase_sizes()
        return spider_steps(epochs=self.config.epochs, n=n, q=self.config.q, refresh=refresh, correction=correction)

    def _schedule(self, n: int) -> tuple[int, int]:
        """(iterations T, refreshes ceil(T/q)) of a SPIDER schedule on ``n`` records."""
        T = self._T_for(n)
        return T, math.ceil(T / self.config.q)

    def _spider_plan(
        self, n: int, *, refresh: tuple[Query, ...], diff: tuple[Query, ...], extra: tuple[Phase, ...] = ()
    ) -> ReleasePlan:
        """A SPIDER schedule's plan: ``refresh`` queries ceil(T/q) times, ``diff`` queries the other
        T − ceil(T/q) iterations, then any ``extra`` phases; batches shared when the config says so."""
        T, refreshes = self._schedule(n)
        phases = (Phase("refresh", refreshes, refresh), Phase("diff", T - refreshes, diff))
        return ReleasePlan(share=self.config.share_batches, phases=phases + extra)

    def steps_for(self, *, n: int) -> int:
        return self._T_for(n)

    def _T_for(self, n: int) -> int:
        steps = self.config.steps
        return steps if steps is not None else self._planned_T(n)

    def num_steps(self) -> int:
        return self._T

    def _lr_factor(self, t: int) -> float:
        """Factor of the x step (and of its largest move) at iteration ``t``: the config's schedule
        over the planned T (public: no privacy cost, no effect on any declared sensitivity)."""
        return self.config.lr_factor(t=t, total=self._T)

    def _bind(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._T = self._T_for(ctx.n)
        # Output index τ ~ U{1..T}, drawn before any data access (data-independent).
        random = self.config.output == "random"
        self._tau = 1 + int(ctx.sampler_rng.randint(self._T, (1,))) if random else self._T
        self._saved = None
        self._bind_releases(ctx)

    @property
    def last_batches(self) -> dict[str, torch.Tensor]:
        """Indices of the latest batch of each release (diagnostics; never released)."""
        return self.releases.last_indices if self.releases is not None else {}

    # -- model as a flat vector --------------------------------------------------------------
    def _x(self) -> torch.Tensor:
        return flat_params(self._ctx.model).clone()

    def _set_x(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            offset = 0
            for p in trainable_parameters(self._ctx.model):
                k = p.numel()
                p.copy_(flat[offset : offset + k].view_as(p).to(p.dtype))
                offset += k

    def _params(self, flat: torch.Tensor | None):
        return None if flat is None else params_from_flat(self._ctx.model, flat)

    def _data(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._memo.rows(idx, self._ctx.x_train, self._ctx.y_train)

    def _losses(self, idx: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """Per-sample losses of batch ``idx`` at ``x`` (reused if a query of this iteration has
        computed them at the same point)."""
        got = self._memo.losses(idx, self._ctx.model, x)
        if got is None:
            xb, yb = self._data(idx)
            chunk = self.config.chunk_size
            got = batch_losses(self._ctx.model, self._ctx.loss_fn, xb, yb, params=self._params(x), chunk=chunk)
            self._memo.store_losses(idx, self._ctx.model, x, got)
        return got

    def _grad_sum(
        self,
        idx: torch.Tensor,
        *,
        clip: float,
        x: torch.Tensor | None = None,
        weights: Weights = None,
        x_prev: torch.Tensor | None = None,
        weights_prev: Weights = None,
    ) -> BoundedSum:
        """``Σ_{i∈idx} Clip(w_i ∇ℓ_i(x) [− w'_i ∇ℓ_i(x_prev)], C)`` with bound C."""
        xb, yb = self._data(idx)
        ctx = self._ctx
        return chunked_clipped_sum(
            ctx.engine,
            ctx.model,
            ctx.loss_fn,
            xb,
            yb,
            clip=clip,
            chunk=self.config.chunk_size,
            params=self._params(x),
            weights=weights,
            params_prev=self._params(x_prev),
            weights_prev=weights_prev,
        )

    def _zeros(self) -> torch.Tensor:
        """A zero flat gradient on the data's device."""
        return zero_flat(self._ctx.model).to(self._ctx.x_train.device)

    def _capped_weights(self, weights: Callable, losses: torch.Tensor, cap: float) -> torch.Tensor:
        # The clamp guarantees the declared bound whatever the weight function returns.
        return weights(losses).to(torch.float64).clamp(0.0, cap)

    def _weight_scale(self, weights: Callable, cap: float, clip: float) -> Callable:
        """The engine ``scale`` of the term ``w_i·Clip(∇ℓ_i, C)``: the capped weight of the loss
        times the clip factor of the norm, both from the same pass."""

        def scale(losses: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
            return self._capped_weights(weights, losses, cap) * clip_factors(norms, clip).to(torch.float64)

        return scale

    def _weighted_grad_sum(
        self, idx: torch.Tensor, *, clip: float, weights: Callable, cap: float, x: torch.Tensor | None = None
    ) -> BoundedSum:
        """``Σ_{i∈idx} w_i·Clip(∇ℓ_i(x), C)`` with ``w_i = weights(ℓ_i)`` clamped to ``[0, cap]``:
        per-record bound ``cap·C``. One engine pass per chunk: the weight and the clip factor
        multiply each term after its norm is known (``GradEngine.scaled_sum``)."""
        ctx, total, params = self._ctx, self._zeros(), self._params(x)
        xb, yb = self._data(idx)
        scale = self._weight_scale(weights, cap, clip)
        losses = []
        for s in range(0, idx.numel(), self.config.chunk_size):
            sl = slice(s, s + self.config.chunk_size)
            res = ctx.engine.scaled_sum(ctx.model, ctx.loss_fn, xb[sl], yb[sl], scale=scale, params=params)
            total = total + res.total.to(total.dtype)
            losses.append(res.losses)
        if losses:
            self._memo.store_losses(idx, ctx.model, x, torch.cat(losses))
        return BoundedSum(total, bound=cap * clip)

    def _weighted_diff_sum(
        self,
        idx: torch.Tensor,
        *,
        clip: float,
        grad_clip: float,
        weights: Callable,
        weights_prev: Callable,
        cap: float,
        x: torch.Tensor | None,
        x_prev: torch.Tensor,
    ) -> BoundedSum:
        """``Σ Clip(f_i(x) − f'_i(x_prev), C_t)`` with ``f_i(x) = w_i·Clip(∇ℓ_i(x), C)`` (the per-record
        term of :meth:`_weighted_grad_sum`, so a SPIDER correction tracks the same quantity as its
        refresh): per-record bound ``C_t`` (``clip``). One engine pass per point and chunk
        (``GradEngine.scaled_diff_sum``)."""
        ctx, total = self._ctx, self._zeros()
        params, params_prev = self._params(x), self._params(x_prev)
        scale = self._weight_scale(weights, cap, grad_clip)
        scale_prev = self._weight_scale(weights_prev, cap, grad_clip)
        rows_x, rows_y = self._data(idx)
        seen: tuple[list, list] = ([], [])
        for s in range(0, idx.numel(), self.config.chunk_size):
            xb, yb = rows_x[s : s + self.config.chunk_size], rows_y[s : s + self.config.chunk_size]
            res = ctx.engine.scaled_diff_sum(
                ctx.model,
                ctx.loss_fn,
                xb,
                yb,
                clip=clip,
                scale=scale,
                scale_prev=scale_prev,
                params=params,
                params_prev=params_prev,
            )
            seen[0].append(res.losses)
            seen[1].append(res.losses_prev)
            total = total + res.total.to(total.dtype)
        if seen[0]:  # the scalar corrections on this batch need the losses at both points
            self._memo.store_losses(idx, ctx.model, x, torch.cat(seen[0]))
            self._memo.store_losses(idx, ctx.model, x_prev, torch.cat(seen[1]))
        return BoundedSum(total, bound=clip)

    # -- output iterate -----------------------------------------------------------------------
    def _maybe_save(self, index: int, x: torch.Tensor, **scalars: float) -> None:
        """Keep iterate number ``index`` (1-based) if it is the output index τ."""
        if index == self._tau:
            self._saved = {"x": x.detach().clone(), **{k: float(v) for k, v in scalars.items()}}

    def finalize(self) -> None:
        if self._saved is not None:
            self._set_x(self._saved["x"])
            self._load_output_scalars(self._saved)

    def _load_output_scalars(self, saved: dict[str, Any]) -> None:
        """Subclasses restore the dual variable of the output iterate (η or λ) here."""

    def output_iterate(self) -> dict[str, Any] | None:
        """The saved output iterate (``{"x": flat, ...scalars}``) once reached, else ``None``."""
        return self._saved

    # -- state ------------------------------------------------------------------------------
    # The subclass's state besides the model, τ and the output: plain values (attribute ``_<name>``
    # saved under ``<name>``) and estimators (attribute ``<name>`` with ``state_dict``).
    state_values: tuple[str, ...] = ()
    state_estimators: tuple[str, ...] = ()

    def _state(self) -> dict[str, Any]:
        values = {k: getattr(self, f"_{k}") for k in self.state_values}
        return {**values, **{k: getattr(self, k).state_dict() for k in self.state_estimators}}

    def _load_state(self, state: dict[str, Any]) -> None:
        for k in self.state_values:
            setattr(self, f"_{k}", state[k])
        for k in self.state_estimators:
            getattr(self, k).load_state_dict(state[k])

    def state_dict(self) -> dict[str, Any]:
        return {"state": self._state(), "tau": self._tau, "saved": self._saved, "releases": self.releases.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_state(state["state"])
        self._tau, self._saved = state["tau"], state["saved"]
        self.releases.load_state_dict(state["releases"])
