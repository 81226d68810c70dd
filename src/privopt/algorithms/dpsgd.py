"""SGD (non-private reference), DP-SGD (Poisson batches) and DP-GD (full batch).

All three share one step: a (clipped, noisy) gradient estimate written into ``.grad`` and a
torch SGD update. DP-SGD releases ``(sum_i clip_C(grad l_i) + N(0, (zC)^2 I)) / b`` on a Poisson
batch of expected size ``b`` (one ``PoissonSampled(Gaussian(z))`` event per step); DP-GD the same
on the full dataset (``FullBatch``, normaliser n, one ``Gaussian(z)`` event per step).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from privopt.algorithms.base import Algorithm, RunContext, register_algorithm
from privopt.errors import ConfigError
from privopt.grads.flat import num_trainable, set_flat_grad
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import chunked_clipped_sum
from privopt.privacy import FullBatch, Inventory, PlannedStep, Poisson
from privopt.sampling import PoissonSampler
from privopt.validation import positive

__all__ = ["SGD", "DPSGD", "DPGD"]


class _GradientStepAlgorithm(Algorithm):
    """Shared machinery: an SGD optimizer over the model, fed a flat gradient estimate per step."""

    def __init__(self, *, epochs: float, lr: float, momentum: float, weight_decay: float):
        self.epochs = positive("epochs", epochs)
        self.lr = positive("lr", lr)
        if not 0 <= momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._ctx: RunContext | None = None
        self._opt: torch.optim.Optimizer | None = None

    def setup(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._opt = torch.optim.SGD(
            [p for p in ctx.model.parameters() if p.requires_grad],
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )

    def _apply(self, flat_grad: torch.Tensor) -> None:
        self._opt.zero_grad(set_to_none=True)
        set_flat_grad(self._ctx.model, flat_grad)
        self._opt.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self._opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._opt.load_state_dict(state["optimizer"])


class _BatchAlgorithm(_GradientStepAlgorithm):
    def __init__(self, *, epochs: float, batch_size: int, lr: float, momentum: float, weight_decay: float):
        super().__init__(epochs=epochs, lr=lr, momentum=momentum, weight_decay=weight_decay)
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self._n: int | None = None
        self._sampler: PoissonSampler | None = None

    def _rate(self, n: int) -> float:
        if self.batch_size > n:
            raise ConfigError(f"batch_size {self.batch_size} exceeds the training set size {n}")
        return self.batch_size / n

    def steps_for(self, *, n: int) -> int:
        return max(1, math.ceil(self.epochs * n / self.batch_size))

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self._n = ctx.n
        self._sampler = PoissonSampler(n=ctx.n, rate=self._rate(ctx.n), rng=ctx.sampler_rng)

    def num_steps(self) -> int:
        return self.steps_for(n=self._n)


@register_algorithm
class SGD(_BatchAlgorithm):
    """Non-private minibatch SGD with Poisson batches (the reference DP-SGD is compared against)."""

    name = "sgd"
    private = False
    summary = "non-private minibatch SGD (reference)"

    def __init__(
        self,
        *,
        epochs: float = 10,
        batch_size: int = 64,
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ):
        super().__init__(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def inventory(self, *, n: int) -> None:
        return None

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx
        idx = self._sampler.sample()
        if idx.numel() == 0:
            return {}
        out = ctx.model(ctx.x_train[idx])
        losses = ctx.loss_fn(out, ctx.y_train[idx])
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

    def __init__(
        self,
        *,
        epochs: float = 10,
        batch_size: int = 64,
        lr: float = 0.1,
        clip: float = 1.0,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ):
        super().__init__(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.clip = positive("clip", clip)

    def inventory(self, *, n: int) -> Inventory:
        return Inventory([PlannedStep(Poisson(self._rate(n)), (("grad", 1.0),), self.steps_for(n=n))])

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx
        idx = self._sampler.sample()
        batch = PrivateBatch(ctx.ledger, self._sampler.sampling, {"grad": ctx.noise["grad"]}, rng=ctx.noise_rng)
        if idx.numel() == 0:  # an empty Poisson batch still releases noise
            total = torch.zeros(num_trainable(ctx.model))
        else:
            total = ctx.engine.clipped_sum(
                ctx.model, ctx.loss_fn, ctx.x_train[idx], ctx.y_train[idx], clip=self.clip
            ).total
        self._apply(batch.gaussian("grad", total, clip=self.clip, normalizer=self.batch_size))
        return {}


@register_algorithm
class DPGD(_GradientStepAlgorithm):
    """DP-GD: full-batch gradient descent with per-sample clipping and Gaussian noise.

    Each of the ``epochs`` steps releases ``(sum_{i<=n} clip_C(grad l_i) + N(0,(zC)^2 I)) / n``.
    """

    name = "dp-gd"
    summary = "DP-GD: full-batch clipped gradients with Gaussian noise"

    def __init__(
        self,
        *,
        epochs: float = 50,
        lr: float = 0.5,
        clip: float = 1.0,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        chunk_size: int = 1024,
    ):
        super().__init__(epochs=epochs, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.clip = positive("clip", clip)
        self.chunk_size = int(chunk_size)

    def inventory(self, *, n: int) -> Inventory:
        return Inventory([PlannedStep(FullBatch(), (("grad", 1.0),), self.num_steps())])

    def num_steps(self) -> int:
        return self.steps_for(n=0)

    def steps_for(self, *, n: int) -> int:
        return max(1, int(round(self.epochs)))

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx
        batch = PrivateBatch(ctx.ledger, FullBatch(), {"grad": ctx.noise["grad"]}, rng=ctx.noise_rng)
        total = chunked_clipped_sum(
            ctx.engine, ctx.model, ctx.loss_fn, ctx.x_train, ctx.y_train, clip=self.clip, chunk=self.chunk_size
        )
        self._apply(batch.gaussian("grad", total, clip=self.clip, normalizer=ctx.n))
        return {}
