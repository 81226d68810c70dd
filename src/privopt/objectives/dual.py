"""The dual objective ``L(x, η)`` of ψ-penalised DRO (Paper A eq. 3; ``docs/algorithms/dro.md``).

For per-sample losses ``ℓ_i = ℓ(x; ξ_i)`` and the scalar dual variable η,

    L(x, η; ξ)  = λ·ψ*((ℓ − g_η·η)/λ) + g_η·η
    ∇_x L(x,η;ξ) = a(ξ)·∇_x ℓ(x; ξ),       a(ξ) = (ψ*)'((ℓ − g_η·η)/λ)
    ∇_η L(x,η;ξ) = g_η·(1 − a(ξ))

and ``min_η mean_i L(x, η; ξ_i)`` equals the primal penalised DRO value
``max_{p∈Δ_n} Σ p_i ℓ_i − λ·D_ψ(p, 1/n)`` (strong duality; tested). This module only handles the
*scalar* side: the per-sample weights ``a_i`` are handed to a gradient engine as ``weights=``
(``get_engine(...).clipped_sum(model, loss_fn, x, y, clip=C, weights=obj.weight_fn(eta))``), which
forms and clips ``a_i ∇ℓ_i`` per sample.

Numerical safeguards (deviations from the paper, both per-sample data-independent transformations
applied *before* clipping, so DP is unaffected):

* ``loss_bound=B``: losses are clamped to ``[0, B]`` before entering ψ*. The weights use the
  clamped loss but are not multiplied by the clamp's zero derivative (a straight-through
  surrogate), so samples with ``ℓ > B`` keep the largest weight instead of vanishing. Exact when
  every loss lies in ``[0, B]``.
* ``a_max``: the argument ``s = (ℓ − g_η η)/λ`` of the weights is capped at ``a_max``, and ψ* is
  replaced beyond ``a_max`` by its tangent line. The capped objective is still convex, C¹ and
  exactly consistent with the weights and η-gradients returned here; it is the dual of the same
  problem with the extra constraint ``n·p_i ≤ (ψ*)'(a_max)`` (e.g. ``e^{50}`` for KL), so the cap
  is invisible unless some sample is that extreme. ``a_max=None`` disables it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Union

import torch

from privopt.errors import ConfigError
from privopt.objectives.divergences import KL, Divergence, as_float64, get_divergence
from privopt.validation import positive

__all__ = ["DualObjective", "argument_for_weight"]

TensorLike = Union[torch.Tensor, float]


def argument_for_weight(divergence: str | Divergence, weight: float) -> float | None:
    """The argument ``s`` at which ``(ψ*)'(s)`` reaches ``weight`` (≥ 1), or ``None`` when the
    weights of ψ never exceed it (e.g. ``kl_cvar`` with ``1/α ≤ weight``).

    Capping the argument of the dual weights there caps every weight at ``weight`` (``(ψ*)'`` is
    non-decreasing): the public weight cap of the private x-gradient.

    Example:
        >>> round(argument_for_weight("kl", 4.0), 6) == round(math.log(4.0), 6)
        True
        >>> round(argument_for_weight("chi2", 3.0), 9)   # (s + 2)_+ / 2 = 3
        4.0
    """
    div = get_divergence(divergence)
    w = positive("weight", weight)
    if w < 1.0:
        raise ConfigError(f"a weight cap must be >= 1 (the weights average 1), got {weight!r}")

    def at(s: float) -> float:
        return float(div.conj_grad(torch.tensor(s, dtype=torch.float64)))

    lo, hi = 0.0, 1.0  # (ψ*)'(0) = 1 ≤ w
    while at(hi) < w:
        hi *= 2.0
        if hi > 1e6:
            return None
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if at(mid) < w else (lo, mid)
    return hi


class DualObjective:
    """Per-sample dual objective ``L(x, η; ξ)`` and its gradients for a fixed penalty λ.

    Args:
        divergence: a :class:`Divergence` or a registered name (e.g. ``"kl"``, ``"chi2"``).
        lam: the penalty λ > 0 of the DRO problem (an explicit hyper-parameter; see the docs).
        g_eta: the rescaling ``g_η > 0`` of the dual variable (default 1 = no rescaling).
        a_max: cap on the argument of ψ* (see module docstring); ``None`` disables it.
        loss_bound: public upper clamp B on the losses (``None``: no clamping).

    Example:
        >>> import torch
        >>> obj = DualObjective(divergence="kl", lam=1.0, a_max=None)
        >>> losses = torch.tensor([0.2, 1.0, 3.0])
        >>> eta = obj.optimal_eta(losses)
        >>> round(eta, 6) == round(float(torch.logsumexp(losses, 0) - torch.log(torch.tensor(3.0))), 6)
        True
        >>> round(float(obj.x_weights(losses, eta).mean()), 6)   # weights of the optimal p, times n
        1.0
    """

    def __init__(
        self,
        *,
        divergence: str | Divergence,
        lam: float,
        g_eta: float = 1.0,
        a_max: float | None = 50.0,
        loss_bound: float | None = None,
    ):
        self.divergence = get_divergence(divergence)
        self.lam = positive("lam", lam)
        self.g_eta = positive("g_eta", g_eta)
        self.a_max = None if a_max is None else positive("a_max", a_max)
        self.loss_bound = None if loss_bound is None else positive("loss_bound", loss_bound)

    def __repr__(self) -> str:
        return (
            f"DualObjective(divergence={self.divergence!r}, lam={self.lam}, g_eta={self.g_eta}, "
            f"a_max={self.a_max}, loss_bound={self.loss_bound})"
        )

    # ----------------------------------------------------------------- scalar building blocks
    def _losses(self, losses: TensorLike) -> torch.Tensor:
        ell = as_float64(losses)
        if ell.dim() != 1:
            raise ConfigError(f"losses must be a 1-D tensor of per-sample losses, got shape {tuple(ell.shape)}")
        if self.loss_bound is not None:
            # Straight-through clamp: forward value clamped, gradient passed unchanged, so
            # autograd agrees with x_weights (see module docstring).
            clamped = ell.clamp(0.0, self.loss_bound)
            ell = ell + (clamped - ell).detach()
        return ell

    def arguments(self, losses: TensorLike, eta: TensorLike) -> torch.Tensor:
        """Uncapped arguments ``s_i = (ℓ_i − g_η η)/λ`` (float64, shape ``[B]``)."""
        return (self._losses(losses) - self.g_eta * as_float64(eta)) / self.lam

    def _capped_conj(self, s: torch.Tensor) -> torch.Tensor:
        d = self.divergence
        if self.a_max is None:
            return d.conj(s)
        a = torch.tensor(self.a_max, dtype=torch.float64)
        inside = torch.clamp(s, max=self.a_max)
        # Tangent-line continuation beyond a_max: ψ*(a) + (ψ*)'(a)(s − a).
        return d.conj(inside) + d.conj_grad(a) * torch.clamp(s - self.a_max, min=0.0)

    def _capped_conj_grad(self, s: torch.Tensor) -> torch.Tensor:
        if self.a_max is not None:
            s = torch.clamp(s, max=self.a_max)
        return self.divergence.conj_grad(s)

    # ----------------------------------------------------------------- public API
    def per_sample_values(self, losses: TensorLike, eta: TensorLike) -> torch.Tensor:
        """``L(x, η; ξ_i)`` for each sample, shape ``[B]``, float64 (differentiable in losses/eta)."""
        s = self.arguments(losses, eta)
        return self.lam * self._capped_conj(s) + self.g_eta * as_float64(eta)

    def value(self, losses: TensorLike, eta: TensorLike) -> torch.Tensor:
        """Batch objective ``L(x, η; B) = mean_i L(x, η; ξ_i)`` (0-dim float64 tensor)."""
        return self.per_sample_values(losses, eta).mean()

    def x_weights(self, losses: TensorLike, eta: TensorLike) -> torch.Tensor:
        """Per-sample weights ``a_i = (ψ*)'((ℓ_i − g_η η)/λ)`` ≥ 0, shape ``[B]``, float64, detached.

        ``∇_x L(x, η; B) = mean_i a_i ∇_x ℓ_i``: pass them to the engine as ``weights=``.
        """
        with torch.no_grad():
            return self._capped_conj_grad(self.arguments(losses, eta)).detach()

    def weight_fn(self, eta: TensorLike) -> Callable[[torch.Tensor], torch.Tensor]:
        """A callable ``losses -> weights`` for the engine's ``weights=`` argument at a fixed η."""
        eta_f = float(as_float64(eta).detach())

        def weights(losses: torch.Tensor) -> torch.Tensor:
            return self.x_weights(losses, eta_f).to(losses.dtype)

        return weights

    def eta_grads(self, losses: TensorLike, eta: TensorLike) -> torch.Tensor:
        """Per-sample ``∇_η L(x, η; ξ_i) = g_η(1 − a_i)``, shape ``[B]``, float64, detached.

        Their magnitude is at most ``g_η·max(1, (ψ*)'(a_max) − 1)``: a public bound when a_max is
        set (useful for choosing the η clip threshold).
        """
        return self.g_eta * (1.0 - self.x_weights(losses, eta))

    def eta_grad(self, losses: TensorLike, eta: TensorLike) -> float:
        """Batch ``∇_η L(x, η; B)`` as a float."""
        return float(self.eta_grads(losses, eta).mean())

    def optimal_eta(self, losses: TensorLike, *, tol: float = 1e-12) -> float:
        """``argmin_η L(x, η; B)`` for the given losses (a float).

        Closed form for KL when no argument hits the cap (``η* = λ log mean exp(ℓ/λ) / g_η``);
        otherwise bisection on the monotone optimality condition ``mean_i a_i(η) = 1``, which also
        handles the step-shaped (ψ*)' of ``cvar`` (returns a minimiser; for CVaR any η in the
        flat region is optimal).
        """
        ell = self._losses(losses).detach()
        n = ell.numel()
        if n == 0:
            raise ConfigError("optimal_eta needs at least one loss")
        if isinstance(self.divergence, KL):
            u = self.lam * (torch.logsumexp(ell / self.lam, dim=0) - math.log(n))
            if self.a_max is None or float(((ell - u) / self.lam).max()) <= self.a_max:
                return float(u) / self.g_eta
        # u = g_η η. mean a_i(u) is non-increasing in u; ≥ 1 at u_lo (every s_i ≥ 1 > 0 — capped at
        # a_max > 0 — and (ψ*)' is non-decreasing with (ψ*)'(0+) ≥ 1) and ≤ 1 at u_hi (every
        # s_i ≤ 0, where (ψ*)' ≤ (ψ*)'(0) ≤ 1).
        lo = float(ell.min()) - self.lam
        hi = float(ell.max())

        def excess(u: float) -> float:
            return float(self._capped_conj_grad((ell - u) / self.lam).mean()) - 1.0

        scale = max(1.0, abs(lo), abs(hi))
        for _ in range(200):
            if hi - lo <= tol * scale:
                break
            mid = 0.5 * (lo + hi)
            if excess(mid) > 0:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi) / self.g_eta

    def psi_value(self, losses: TensorLike) -> float:
        """``Ψ(x) = min_η L(x, η; B)``: the penalised DRO value of the batch (a float)."""
        ell = self._losses(losses).detach()
        return float(self.value(ell, self.optimal_eta(ell)))
