"""Shared plumbing of the DRO algorithms of Paper A (SPEC §2.4–2.7).

Everything here is data-independent bookkeeping or a per-record transformation applied *before*
clipping, so none of it affects the privacy analysis:

* batch plans (a nominal batch size capped at n becomes a full batch, else Poisson sampling with
  the expected size as the normaliser, SPEC §8.2);
* clipped sums of per-sample scalars (``sum_i sign(a_i)·min(|a_i|, C)``, float64) and chunked
  clipped sums of per-sample (weighted, differenced) parameter gradients;
* the step-proportional clip rule of SPEC §8.4 (``C_t = min(cap, γ·Δ_t)``);
* the number of iterations implied by an epochs budget for a SPIDER schedule;
* :class:`DROAlgorithm`, the base class holding the model-as-flat-vector helpers, the noise
  lookup (non-private runs use placeholders: their ``PrivateBatch`` adds no noise) and the
  uniformly random output iterate drawn up front (data-independent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch

from privopt.algorithms.base import Algorithm, RunContext
from privopt.errors import ConfigError
from privopt.grads.flat import flat_params, params_from_flat, trainable_parameters
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import batch_losses, chunked_clipped_sum, clipped_scalar_sum
from privopt.privacy import FullBatch, Poisson
from privopt.sampling import PoissonSampler
from privopt.validation import positive, positive_int

__all__ = [
    "BatchPlan",
    "DROAlgorithm",
    "FullSampler",
    "batch_losses",
    "chunked_clipped_sum",
    "clipped_scalar_sum",
    "initial_loss_scale",
    "step_clip",
    "spider_steps",
]

Weights = Union[None, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


# ----------------------------------------------------------------------------- validation


# ----------------------------------------------------------------------------- batches


class FullSampler:
    """Every record, every time (the refresh batch of a SPIDER capped at n)."""

    def __init__(self, *, n: int):
        self.n = n
        self.sampling = FullBatch()
        self.expected_batch_size = float(n)

    def sample(self) -> torch.Tensor:
        return torch.arange(self.n)


@dataclass(frozen=True)
class BatchPlan:
    """A nominal batch size resolved against the dataset size.

    ``size >= n`` means the full dataset (``FullBatch``, no amplification, normaliser n);
    otherwise Poisson sampling with rate ``size/n`` and normaliser ``size`` (the expected size).
    """

    size: int
    n: int

    @property
    def full(self) -> bool:
        return self.size >= self.n

    @property
    def sampling(self):
        return FullBatch() if self.full else Poisson(self.size / self.n)

    @property
    def normalizer(self) -> float:
        return float(min(self.size, self.n))

    def sampler(self, rng):
        if self.full:
            return FullSampler(n=self.n)
        return PoissonSampler(n=self.n, rate=self.size / self.n, rng=rng)


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


# ----------------------------------------------------------------------------- per-sample queries


def step_clip(distance: float, *, gamma: float | None, cap: float | None) -> float:
    """Clip threshold of a difference query (SPEC §8.4, E-A.10).

    ``gamma`` set: ``C_t = γ·distance`` (capped at ``cap`` when given) — step-proportional, a
    function of released iterates only. ``gamma`` None: the fixed threshold ``cap``.
    """
    if gamma is None:
        return float(cap)
    c = gamma * float(distance)
    return min(c, cap) if cap is not None else c


@torch.no_grad()
def initial_loss_scale(ctx: RunContext) -> float:
    """``log K`` for a model with K outputs: the cross-entropy of a uniform prediction.

    A data-independent stand-in for "the loss scale at initialisation" (SPEC §8.7, used for η_0 and
    for the shift of the KL inner function): K is read from the output shape of one all-zeros
    input, so no record is touched. Falls back to 1.0 for a single-output model.
    """
    probe = torch.zeros_like(ctx.x_train[:1])
    out = ctx.model(probe)
    k = int(out.shape[-1]) if out.dim() > 1 else 1
    return math.log(k) if k > 1 else 1.0


# ----------------------------------------------------------------------------- base class


class DROAlgorithm(Algorithm):
    """Base of the DRO algorithms: flat-vector model access, noise lookup, output iterate.

    Args (common keyword hyper-parameters of subclasses):
        epochs: budget in epoch-equivalents (see :func:`spider_steps`); ignored when ``steps``.
        steps: explicit number of iterations T.
        output: ``"random"`` (the paper: a uniformly random iterate among x_1..x_T, index drawn
            up front from the sampler generator — data-independent) or ``"last"``.
        chunk_size: per-sample gradients are computed in chunks of this many records.
    """

    share_batches: bool = False  # releases whose batches have equal sizes may share one sampled batch

    def __init__(self, *, epochs: float, steps: int | None, output: str, chunk_size: int):
        self.epochs = positive("epochs", epochs)
        self.steps = None if steps is None else positive_int("steps", steps)
        if output not in ("random", "last"):
            raise ConfigError(f"output must be 'random' or 'last', got {output!r}")
        self.output = output
        self.chunk_size = positive_int("chunk_size", chunk_size)
        self._ctx: RunContext | None = None
        self._T: int | None = None
        self._tau: int | None = None
        self._saved: dict[str, Any] | None = None

    # -- schedule --------------------------------------------------------------------------
    def _planned_T(self, n: int) -> int:
        raise NotImplementedError

    def hyperparameters(self) -> dict[str, Any]:
        hp = super().hyperparameters()
        hp.pop("objective", None)  # a derived object, rebuilt from the divergence settings
        return hp

    def _shared(self, a: str, b: str, plans: dict[str, BatchPlan]) -> bool:
        """Whether releases ``a`` and ``b`` are made from one sampled batch (one accounting step)."""
        return self.share_batches and plans[a].normalizer == plans[b].normalizer

    def _make_samplers(self, plans: dict[str, BatchPlan], *, pairs) -> None:
        """One sampler per release family; the second of each pair reuses the first's batches when
        :meth:`_shared` (the inventory then declares the two releases as one step)."""
        self._plans_ = plans
        self._samplers = {k: p.sampler(self._ctx.sampler_rng) for k, p in plans.items()}
        for a, b in pairs:
            if self._shared(a, b, plans):
                self._samplers[b] = self._samplers[a]

    def steps_for(self, *, n: int) -> int:
        return self._T_for(n)

    def _T_for(self, n: int) -> int:
        return self.steps if self.steps is not None else self._planned_T(n)

    def num_steps(self) -> int:
        return self._T

    def _bind(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._T = self._T_for(ctx.n)
        # Output index τ ~ U{1..T}, drawn before any data access (data-independent).
        self._tau = 1 + int(ctx.sampler_rng.randint(self._T, (1,))) if self.output == "random" else self._T
        self._saved = None

    # -- noise ------------------------------------------------------------------------------
    def _batch(self, sampler, names: Sequence[str]) -> tuple[torch.Tensor, PrivateBatch]:
        """Draw one batch and open its :class:`PrivateBatch` for ``names`` (recorded before noise)."""
        ctx = self._ctx
        idx = sampler.sample()
        # Non-private algorithms (and runs without a ledger) release without noise or records.
        ledger = ctx.ledger if self.private else None
        noise = {nm: (ctx.noise[nm] if ledger is not None else 1.0) for nm in names}
        return idx, PrivateBatch(ledger, sampler.sampling, noise, rng=ctx.noise_rng)

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
        return self._ctx.x_train[idx], self._ctx.y_train[idx]

    def _losses(self, idx: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        xb, yb = self._data(idx)
        return batch_losses(self._ctx.model, self._ctx.loss_fn, xb, yb, params=self._params(x), chunk=self.chunk_size)

    def _grad_sum(
        self,
        idx: torch.Tensor,
        *,
        clip: float,
        x: torch.Tensor | None = None,
        weights: Weights = None,
        x_prev: torch.Tensor | None = None,
        weights_prev: Weights = None,
    ) -> torch.Tensor:
        xb, yb = self._data(idx)
        ctx = self._ctx
        return chunked_clipped_sum(
            ctx.engine,
            ctx.model,
            ctx.loss_fn,
            xb,
            yb,
            clip=clip,
            chunk=self.chunk_size,
            params=self._params(x),
            weights=weights,
            params_prev=self._params(x_prev),
            weights_prev=weights_prev,
        )

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

    def _base_state(self) -> dict[str, Any]:
        return {"tau": self._tau, "saved": self._saved}

    def _load_base_state(self, state: dict[str, Any]) -> None:
        self._tau = state["tau"]
        self._saved = state["saved"]
