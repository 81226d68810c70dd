"""SGD (non-private reference), DP-SGD (Poisson batches) and DP-GD (full batch).

All three share one step: a (clipped, noisy) gradient estimate written into ``.grad`` and a
torch SGD update. DP-SGD releases ``(sum_i clip_C(grad l_i) + N(0, (zC)^2 I)) / b`` on a Poisson
batch of expected size ``b`` (one ``PoissonSampled(Gaussian(z))`` event per step); DP-GD the same
on the full dataset (``FullBatch``, normaliser n, one ``Gaussian(z)`` event per step). See
``docs/algorithms/dpsgd.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.base import Algorithm, RunContext, register_algorithm
from privopt.algorithms.config import momentum_value, non_negative, optional_int, param, positive, positive_int
from privopt.algorithms.releases import BatchPlan, Fixed, Phase, PoissonBatch, Query, ReleasePlan
from privopt.algorithms.step_schedules import ScheduledStepConfig
from privopt.grads.flat import set_flat_grad, zero_flat
from privopt.grads.sums import BoundedSum, chunked_clipped_sum

__all__ = ["SGD", "DPSGD", "DPGD", "SGDConfig", "DPSGDConfig", "DPGDConfig"]


@dataclass(frozen=True)
class StepConfig(ScheduledStepConfig):
    """The torch SGD step: learning rate (decayed by ``lr_schedule`` / ``lr_final``), momentum and
    weight decay."""

    lr: float = param(0.1, positive, role="lr")
    momentum: float = param(0.0, momentum_value)
    weight_decay: float = param(0.0, non_negative)


@dataclass(frozen=True)
class SGDConfig(StepConfig):
    """Minibatch SGD: ``epochs`` passes of Poisson batches of expected size ``batch_size``."""

    epochs: float = param(10, positive, role="epochs")
    batch_size: int = param(64, positive_int, role="batch")


@dataclass(frozen=True)
class DPSGDConfig(SGDConfig):
    """DP-SGD: SGD plus the per-sample clip threshold ``clip``; ``chunk_size`` (``None``: the whole
    batch at once) bounds how many records' per-sample gradients are computed together, to bound
    memory: the same batch, one noise draw, one charge."""

    clip: float = param(1.0, positive, role="clip")
    chunk_size: int | None = param(None, optional_int)


@dataclass(frozen=True)
class DPGDConfig(StepConfig):
    """DP-GD: ``epochs`` full-batch steps; per-sample gradients in chunks of ``chunk_size``."""

    lr: float = param(0.5, positive, role="lr")
    epochs: float = param(50, positive, role="epochs")
    clip: float = param(1.0, positive, role="clip")
    chunk_size: int = param(1024, positive_int)


class _GradientStepAlgorithm(Algorithm):
    """Shared machinery: an SGD optimizer over the model, fed a flat gradient estimate per step."""

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self._ctx: RunContext | None = None
        self._opt: torch.optim.Optimizer | None = None

    def setup(self, ctx: RunContext) -> None:
        c = self.config
        self._ctx = ctx
        self._opt = torch.optim.SGD(
            [p for p in ctx.model.parameters() if p.requires_grad],
            lr=c.lr,
            momentum=c.momentum,
            weight_decay=c.weight_decay,
        )
        self._bind_releases(ctx)

    def _schedule_lr(self, t: int) -> None:
        """Set the optimizer's step for iteration ``t`` from the config's (public) schedule."""
        lr = self.config.lr * self.config.lr_factor(t=t, total=self.num_steps())
        for group in self._opt.param_groups:
            group["lr"] = lr

    def _apply(self, flat_grad: torch.Tensor, t: int) -> None:
        self._schedule_lr(t)
        self._opt.zero_grad(set_to_none=True)
        set_flat_grad(self._ctx.model, flat_grad)
        self._opt.step()

    def state_dict(self) -> dict[str, Any]:
        releases = self.releases.state_dict() if self.releases is not None else {}
        return {"optimizer": self._opt.state_dict(), "releases": releases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._opt.load_state_dict(state["optimizer"])
        if self.releases is not None:
            self.releases.load_state_dict(state.get("releases", {}))


class _BatchAlgorithm(_GradientStepAlgorithm):
    """Poisson minibatches of expected size ``batch_size``, ``ceil(epochs·n/batch_size)`` steps."""

    def steps_for(self, *, n: int) -> int:
        return max(1, math.ceil(self.config.epochs * n / self.config.batch_size))

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self._n = ctx.n

    def num_steps(self) -> int:
        return self.steps_for(n=self._n)

    def _grad_plan(self, n: int, clip: float) -> ReleasePlan:
        """One ``grad`` release per step on a Poisson batch (DP-SGD's whole privacy schedule)."""
        batch = PoissonBatch(self.config.batch_size, n)
        return ReleasePlan(phases=(Phase("step", self.steps_for(n=n), (Query("grad", Fixed(clip), batch=batch),)),))


@register_algorithm
class SGD(_BatchAlgorithm):
    """Non-private minibatch SGD with Poisson batches (the reference DP-SGD is compared against)."""

    name = "sgd"
    private = False
    summary = "non-private minibatch SGD (reference)"
    Config = SGDConfig

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self._sampler = PoissonBatch(self.config.batch_size, ctx.n).sampler(ctx.sampler_rng)

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx
        idx = self._sampler.sample()
        if idx.numel() == 0:
            return {}
        out = ctx.model(ctx.x_train[idx])
        losses = ctx.loss_fn(out, ctx.y_train[idx])
        self._schedule_lr(t)
        self._opt.zero_grad(set_to_none=True)
        losses.mean().backward()
        self._opt.step()
        return {"batch_loss": float(losses.detach().mean())}


@register_algorithm
class DPSGD(_BatchAlgorithm):
    """DP-SGD (Abadi et al. 2016) with Poisson sampling and whole-model per-sample clipping.

    Each step samples every record independently with rate ``q = batch_size / n`` and releases
    ``(sum_i clip_C(grad l_i) + N(0, (z C)^2 I)) / batch_size``; the noise multiplier ``z`` is
    calibrated so the whole run meets the target (epsilon, delta).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-sgd", epochs=2, batch_size=50, lr=0.5, clip=1.0)
        >>> inv = algo.inventory(n=1000)
        >>> inv.steps[0].count
        40
    """

    name = "dp-sgd"
    summary = "DP-SGD: Poisson batches, per-sample clipping, Gaussian noise"
    Config = DPSGDConfig

    def release_plan(self, n: int) -> ReleasePlan:
        return self._grad_plan(n, self.config.clip)

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx

        def grad_sum(idx: torch.Tensor, clip: float):
            if idx.numel() == 0:  # an empty Poisson batch still releases noise
                return BoundedSum(zero_flat(ctx.model), bound=clip)
            x, y, chunk = ctx.x_train[idx], ctx.y_train[idx], self.config.chunk_size
            if chunk is not None:
                return chunked_clipped_sum(ctx.engine, ctx.model, ctx.loss_fn, x, y, clip=clip, chunk=chunk)
            return ctx.engine.clipped_sum(ctx.model, ctx.loss_fn, x, y, clip=clip)

        self._apply(self.releases.phase("step").release("grad", grad_sum), t)
        return {}


@register_algorithm
class DPGD(_GradientStepAlgorithm):
    """DP-GD: full-batch gradient descent with per-sample clipping and Gaussian noise.

    Each of the ``epochs`` steps releases ``(sum_{i<=n} clip_C(grad l_i) + N(0,(zC)^2 I)) / n``.
    """

    name = "dp-gd"
    summary = "DP-GD: full-batch clipped gradients with Gaussian noise"
    Config = DPGDConfig

    def release_plan(self, n: int) -> ReleasePlan:
        query = Query("grad", Fixed(self.config.clip), batch=BatchPlan(n, n))
        return ReleasePlan(phases=(Phase("step", self.num_steps(), (query,)),))

    def num_steps(self) -> int:
        return self.steps_for(n=0)

    def steps_for(self, *, n: int) -> int:
        return max(1, int(round(self.config.epochs)))

    def step(self, t: int) -> dict[str, float]:
        ctx, chunk = self._ctx, self.config.chunk_size

        def grad_sum(idx: torch.Tensor, clip: float) -> BoundedSum:
            return chunked_clipped_sum(
                ctx.engine, ctx.model, ctx.loss_fn, ctx.x_train, ctx.y_train, clip=clip, chunk=chunk
            )

        self._apply(self.releases.phase("step").release("grad", grad_sum), t)
        return {}
