"""Full-training-set gradient norms of the DRO objectives (evaluation only, NOT private).

Paper A reports "gradient norm" curves. For a method-independent comparison we use
``‖∇_x Ψ_KL(x)‖`` with ``Ψ_KL(x) = min_{λ ≥ λ0} Ψ(x, λ)`` (eq. 5) for every method: by the
envelope theorem ``∇_x Ψ_KL(x) = ∇_x Ψ(x, λ*) = Σ_i π_i ∇ℓ_i`` with ``π = softmax(ℓ/λ*)``, so two
chunked passes suffice — one for the losses (→ λ*, π), one backward pass of ``Σ π_i ℓ_i``.
:func:`dual_grad_norm` gives DP Double-SPIDER's own metric ``‖∇_{x,η} L(x, η)‖``.

These functions read the private training set without noise: use them for evaluation curves
only, never feed their output back into training.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from privopt.errors import ConfigError, DataError
from privopt.objectives.compositional import KLCompositional
from privopt.objectives.dual import DualObjective

__all__ = ["KLDROStats", "full_losses", "weighted_grad", "kl_dro_stats", "kl_dro_grad_norm", "dual_grad_norm"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _eval_mode:
    """Put the model in eval mode (dropout off) for the measurement, then restore its state."""

    def __init__(self, model: nn.Module):
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.was_training)


def _check(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
    if x.shape[0] != y.shape[0]:
        raise DataError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    if x.shape[0] == 0:
        raise DataError("empty dataset")
    if not (isinstance(batch_size, int) and batch_size > 0):
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def full_losses(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024
) -> torch.Tensor:
    """Per-sample losses on the whole set, ``[n]`` float64 on CPU, computed in chunks without grad."""
    _check(x, y, batch_size)
    dev = _device(model)
    out = []
    with torch.no_grad(), _eval_mode(model):
        for i in range(0, x.shape[0], batch_size):
            xb, yb = x[i : i + batch_size].to(dev), y[i : i + batch_size].to(dev)
            out.append(loss_fn(model(xb), yb).detach().to("cpu", torch.float64).reshape(-1))
    losses = torch.cat(out)
    if losses.shape[0] != x.shape[0]:
        raise ConfigError("loss_fn must return per-sample losses (reduction='none')")
    if not torch.isfinite(losses).all():
        raise DataError("non-finite per-sample loss on the evaluation set")
    return losses


def weighted_grad(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    weights: torch.Tensor,
    batch_size: int = 1024,
) -> torch.Tensor:
    """``Σ_i weights_i ∇_x ℓ_i`` over the whole set, flat over trainable parameters (float64).

    Chunked backward passes of the weighted loss sum; the model's ``.grad`` fields are untouched.
    """
    _check(x, y, batch_size)
    if weights.shape != (x.shape[0],):
        raise ConfigError(f"weights must have shape [{x.shape[0]}], got {tuple(weights.shape)}")
    dev = _device(model)
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in params]
    with _eval_mode(model):
        for i in range(0, x.shape[0], batch_size):
            xb, yb = x[i : i + batch_size].to(dev), y[i : i + batch_size].to(dev)
            losses = loss_fn(model(xb), yb).reshape(-1)
            w = weights[i : i + batch_size].to(device=dev, dtype=losses.dtype)
            grads = torch.autograd.grad((w * losses).sum(), params, allow_unused=True)
            for acc, g in zip(total, grads):
                if g is not None:
                    acc += g.to(torch.float64)
    return torch.cat([t.reshape(-1) for t in total]).cpu()


@dataclass(frozen=True)
class KLDROStats:
    """Evaluation of ``Ψ_KL`` at the current model.

    Attributes:
        grad_norm: ``‖∇_x Ψ_KL(x)‖``.
        lam_star: the minimising ``λ* ≥ λ0``.
        psi: ``Ψ_KL(x) = Ψ(x, λ*)``.
        mean_loss: plain average training loss (for reference).
    """

    grad_norm: float
    lam_star: float
    psi: float
    mean_loss: float


def kl_dro_stats(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lam0: float,
    rho: float,
    batch_size: int = 1024,
    loss_bound: float | None = None,
) -> KLDROStats:
    """``Ψ_KL``, its minimising λ and ``‖∇_x Ψ_KL‖`` on ``(x, y)`` (see :func:`kl_dro_grad_norm`)."""
    obj = KLCompositional(rho=rho, lam0=lam0, loss_bound=loss_bound)
    losses = full_losses(model, loss_fn, x, y, batch_size=batch_size)
    lam_star = obj.optimal_lam(losses)
    # ∇_x Ψ = Σ π_i ∇ℓ_i: x_weights are n·π_i (mean convention), so divide by n.
    pi = obj.x_weights(losses, lam_star) / losses.numel()
    g = weighted_grad(model, loss_fn, x, y, weights=pi, batch_size=batch_size)
    return KLDROStats(
        grad_norm=float(g.norm()),
        lam_star=float(lam_star),
        psi=float(obj.value(losses, lam_star)),
        mean_loss=float(losses.mean()),
    )


def kl_dro_grad_norm(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lam0: float,
    rho: float,
    batch_size: int = 1024,
    loss_bound: float | None = None,
) -> float:
    """``‖∇_x Ψ_KL(x)‖`` on the full training set, ``Ψ_KL(x) = min_{λ≥λ0} λ log mean e^{ℓ/λ} + λρ``.

    The cross-method "gradient norm" metric (non-private; evaluation only, see "Diagnostics" in
    ``docs/privacy.md``). λ* is
    found by Brent's method on ``∂_λ Ψ`` (see :meth:`KLCompositional.optimal_lam`); memory is
    bounded by ``batch_size`` samples per forward/backward pass.

    Args:
        model: the model (evaluated in eval mode; its training flag is restored).
        loss_fn: per-sample loss ``(outputs, targets) -> [B]``.
        x, y: the training set (tensors; moved chunk-wise to the model's device).
        lam0: lower bound λ0 on λ (Paper A: 1e−3).
        rho: KL radius ρ (Paper A: 0.5).
        batch_size: chunk size.
        loss_bound: optional public clamp B of the losses (as in training).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> torch.manual_seed(0) and None
        >>> model = nn.Linear(4, 3)
        >>> ce = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
        >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
        >>> kl_dro_grad_norm(model, ce, x, y, lam0=1e-3, rho=0.5, batch_size=16) > 0
        True
    """
    return kl_dro_stats(
        model, loss_fn, x, y, lam0=lam0, rho=rho, batch_size=batch_size, loss_bound=loss_bound
    ).grad_norm


def dual_grad_norm(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    objective: DualObjective,
    eta: float,
    batch_size: int = 1024,
) -> float:
    """``‖(∇_x L(x, η), ∇_η L(x, η))‖`` on the full training set (DP Double-SPIDER's metric)."""
    losses = full_losses(model, loss_fn, x, y, batch_size=batch_size)
    n = losses.numel()
    a = objective.x_weights(losses, eta)
    gx = weighted_grad(model, loss_fn, x, y, weights=a / n, batch_size=batch_size)
    g_eta = objective.eta_grad(losses, eta)
    return math.sqrt(float(gx.pow(2).sum()) + g_eta**2)
