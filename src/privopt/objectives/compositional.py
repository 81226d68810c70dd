"""KL-constrained DRO in compositional form (Paper A eq. 5; ``docs/algorithms/dro.md``).

    Ψ(x, λ) = λ·log( (1/n) Σ_i exp(ℓ_i/λ) ) + λ·ρ,      λ ≥ λ0,
    Ψ_KL(x) = min_{λ ≥ λ0} Ψ(x, λ).

DP Recursive-SPIDER privatises three batch means of per-sample inner quantities and applies the
data-independent outer function ``f(g) = g1 log g2 + g1 ρ`` to the noisy estimates. With losses of
order 1 and λ near λ0 = 1e−3, ``exp(ℓ/λ)`` overflows, so everything is expressed through the
*shifted* inner function (see "Numerics" in ``docs/algorithms/dro.md``), with a public constant ``c`` (default: the loss
bound B):

    h(w; ξ)      = exp((ℓ − c)/λ)                 ∈ (0, 1] when ℓ ≤ c
    ∇_x h(w; ξ)  = (h/λ)·∇_x ℓ                    → engine weights ``h_x_weights``
    ∇_λ h(w; ξ)  = −h·(ℓ − c)/λ²                  → ``h_lam_grads``
    Ψ            = λ·log h2 + c + λρ,  h2 = mean_i h
    ∇_x Ψ        = (λ/h2)·∇_x h2 = mean_i (h_i/h2)·∇ℓ_i
    ∇_λ Ψ        = log h2 + ρ + (λ/h2)·∂_λ h2 = ρ − KL(π ‖ uniform),  π = softmax(ℓ/λ)

Exact values (``value``, ``x_weights``, ``lam_grad``, ``optimal_lam``) are computed with
log-sum-exp and do not depend on c. Loss clamping to ``[0, B]`` is a straight-through surrogate as
in :mod:`privopt.objectives.dual`.

Optional exponent cap ``a_max`` (the private estimators use it): the exponent
``a = (ℓ − c)/λ`` of ``h`` is capped at ``a_max`` (``h = exp(min(a, a_max))``, used consistently
in ``h``, ``h_x_weights`` and ``h_lam_grads``). Why: with λ small and a stale shift, ``a`` can reach
~80 and the weight ``h/λ ≈ 1e34`` times a float32 per-sample gradient overflows; the engine then
gets ``inf`` norms and ``inf·0 = nan`` terms, which poisoned DP Recursive-SPIDER runs. A record at
``a_max`` is already ``e^{a_max}`` times heavier than the tracked mean, so the cap only changes
records whose (clipped) contribution is saturated anyway; it is a per-record transformation before
clipping with a public constant, so privacy is unaffected. The exact quantities below ignore it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Union

import torch
from scipy.optimize import brentq

from privopt.errors import ConfigError
from privopt.objectives.divergences import as_float64

__all__ = ["KLCompositional"]

TensorLike = Union[torch.Tensor, float]


class KLCompositional:
    """Scalar side of the KL compositional objective ``Ψ(x, λ)`` on a batch of per-sample losses.

    Args:
        rho: KL radius ρ > 0 (Paper A experiments: 0.5).
        lam0: lower bound λ0 > 0 on λ (Paper A: 1e−3).
        loss_bound: public clamp B on the losses (``None``: no clamping).
        shift: the data-independent shift c of the inner function; defaults to ``loss_bound``
            (so ``h ∈ (0, 1]``) or 0 when no bound is set.
        a_max: cap on the exponent ``(ℓ − c)/λ`` of ``h`` (see the module docstring); ``None``
            (default) leaves ``h`` exact.

    Example:
        >>> import torch
        >>> obj = KLCompositional(rho=0.5, lam0=1e-3, loss_bound=10.0)
        >>> losses = torch.tensor([0.1, 0.5, 2.0, 4.0])
        >>> lam = obj.optimal_lam(losses)
        >>> abs(obj.lam_grad(losses, lam)) < 1e-8        # interior optimum: ∂_λ Ψ = 0
        True
        >>> round(float(obj.x_weights(losses, lam).mean()), 9)     # n·π_i average to 1
        1.0
    """

    def __init__(
        self,
        *,
        rho: float,
        lam0: float,
        loss_bound: float | None = None,
        shift: float | None = None,
        a_max: float | None = None,
    ):
        self.rho = self._pos("rho", rho)
        self.lam0 = self._pos("lam0", lam0)
        self.loss_bound = None if loss_bound is None else self._pos("loss_bound", loss_bound)
        if shift is None:
            shift = self.loss_bound if self.loss_bound is not None else 0.0
        try:
            self.shift = float(shift)
        except (TypeError, ValueError):
            raise ConfigError(f"shift must be a number, got {shift!r}") from None
        if not math.isfinite(self.shift):
            raise ConfigError(f"shift must be finite, got {shift!r}")
        self.a_max = None if a_max is None else self._pos("a_max", a_max)

    @staticmethod
    def _pos(name: str, v: float) -> float:
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a positive number, got {v!r}") from None
        if not (f > 0 and math.isfinite(f)):
            raise ConfigError(f"{name} must be a finite positive number, got {v!r}")
        return f

    def __repr__(self) -> str:
        return (
            f"KLCompositional(rho={self.rho}, lam0={self.lam0}, loss_bound={self.loss_bound}, "
            f"shift={self.shift}, a_max={self.a_max})"
        )

    # ----------------------------------------------------------------- helpers
    def _losses(self, losses: TensorLike) -> torch.Tensor:
        ell = as_float64(losses)
        if ell.dim() != 1 or ell.numel() == 0:
            raise ConfigError(f"losses must be a non-empty 1-D tensor, got shape {tuple(ell.shape)}")
        if self.loss_bound is not None:
            clamped = ell.clamp(0.0, self.loss_bound)
            ell = ell + (clamped - ell).detach()
        return ell

    def _lam(self, lam: TensorLike) -> torch.Tensor:
        lam_t = as_float64(lam)
        if float(lam_t.detach().min()) <= 0:
            raise ConfigError(f"lam must be > 0, got {float(lam_t.detach().min())}")
        return lam_t

    def project_lam(self, lam: float) -> float:
        """Projection onto the feasible set ``λ ≥ λ0`` (post-processing; the printed algorithm omits it)."""
        return max(float(lam), self.lam0)

    # ----------------------------------------------------------------- per-sample inner quantities
    def _c(self, shift: float | None) -> float:
        return self.shift if shift is None else float(shift)

    def h(self, losses: TensorLike, lam: TensorLike, *, shift: float | None = None) -> torch.Tensor:
        """Shifted inner function ``h(w; ξ_i) = exp((ℓ_i − c)/λ)``, shape ``[B]``, float64.

        ``shift`` overrides the object's c for this call (a public value, e.g. re-centred from
        released estimates). Bounded by 1 when ``ℓ ≤ c`` (e.g. ``c = B`` with clamped losses);
        at most ``e^{a_max}`` when the exponent cap is set.
        """
        a = (self._losses(losses) - self._c(shift)) / self._lam(lam)
        if self.a_max is not None:
            a = a.clamp(max=self.a_max)
        return torch.exp(a)

    def h_x_weights(self, losses: TensorLike, lam: TensorLike, *, shift: float | None = None) -> torch.Tensor:
        """Weights ``h_i/λ`` with ``∇_x h(w; ξ_i) = (h_i/λ)·∇_x ℓ_i`` (engine ``weights=``), detached."""
        with torch.no_grad():
            return (self.h(losses, lam, shift=shift) / self._lam(lam)).detach()

    def h_lam_grads(self, losses: TensorLike, lam: TensorLike, *, shift: float | None = None) -> torch.Tensor:
        """Per-sample ``∇_λ h(w; ξ_i) = −h_i·(ℓ_i − c)/λ²``, shape ``[B]``, float64, detached.

        With ``ℓ ∈ [0, c]`` this lies in ``[0, 1/(e·λ)]`` (max of ``a e^{−a/λ}/λ²`` over a ≥ 0).
        """
        with torch.no_grad():
            ell = self._losses(losses)
            lam_t = self._lam(lam)
            return (-self.h(ell, lam_t, shift=shift) * (ell - self._c(shift)) / lam_t**2).detach()

    def capped_weights(self, losses: TensorLike, lam: TensorLike, *, shift: float) -> torch.Tensor:
        """``w_i = min(exp((ℓ_i − c)/λ), 1)``: the inner function capped at 1 (records whose loss
        exceeds the shift c share the largest weight). Float64, detached, in ``(0, 1]``."""
        with torch.no_grad():
            a = (self._losses(losses) - float(shift)) / self._lam(lam)
            return torch.exp(a.clamp(max=0.0)).detach()

    def capped_lam_terms(self, losses: TensorLike, lam: TensorLike, *, shift: float) -> torch.Tensor:
        """``λ·∂_λ w_i = −w_i·min(a_i, 0)`` with ``a_i = (ℓ_i − c)/λ`` (0 where the cap binds):
        in ``[0, 1/e]``. Float64, detached."""
        with torch.no_grad():
            a = ((self._losses(losses) - float(shift)) / self._lam(lam)).clamp(max=0.0)
            return (-torch.exp(a) * a).detach()

    def h_weight_fn(self, lam: float, *, shift: float | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
        """Callable ``losses -> h_i/λ`` for the engine's ``weights=`` at a fixed λ (and shift)."""
        lam_f = float(lam)

        def weights(losses: torch.Tensor) -> torch.Tensor:
            return self.h_x_weights(losses, lam_f, shift=shift).to(losses.dtype)

        return weights

    @staticmethod
    def outer_grads(*, s: float, v: torch.Tensor, u: float, lam: float, rho: float) -> tuple[torch.Tensor, float]:
        """Chain rule through ``f(g) = g1 log g2 + g1 ρ`` with estimates of the inner means.

        Args:
            s: estimate of ``h2 = mean h`` (must be > 0; floor it first — post-processing).
            v: estimate of ``∇_x h2`` (vector).
            u: estimate of ``∂_λ h2``.
            lam: current λ.
            rho: KL radius.

        Returns:
            ``(z_x, z_λ) = ((λ/s)·v, (λ/s)·u + log s + ρ)``, the DP Recursive-SPIDER direction.
        """
        if not s > 0:
            raise ConfigError(f"s (estimate of the inner mean) must be > 0, got {s}")
        factor = float(lam) / float(s)
        return v * factor, factor * float(u) + math.log(float(s)) + float(rho)

    # ----------------------------------------------------------------- exact batch quantities
    def _log_mean_exp(self, ell: torch.Tensor, lam_t: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(ell / lam_t, dim=0) - math.log(ell.numel())

    def value(self, losses: TensorLike, lam: TensorLike) -> torch.Tensor:
        """``Ψ(x, λ) = λ log mean exp(ℓ/λ) + λρ`` (0-dim float64; differentiable in losses and λ)."""
        ell = self._losses(losses)
        lam_t = self._lam(lam)
        return lam_t * self._log_mean_exp(ell, lam_t) + lam_t * self.rho

    def x_weights(self, losses: TensorLike, lam: TensorLike) -> torch.Tensor:
        """Weights ``n·π_i`` (π = softmax(ℓ/λ)) with ``∇_x Ψ = mean_i (n π_i)·∇_x ℓ_i``; detached."""
        with torch.no_grad():
            ell = self._losses(losses)
            return (ell.numel() * torch.softmax(ell / self._lam(lam), dim=0)).detach()

    def weight_fn(self, lam: float) -> Callable[[torch.Tensor], torch.Tensor]:
        """Callable ``losses -> n·π_i`` for the engine's ``weights=`` (full-batch ∇_x Ψ)."""
        lam_f = float(lam)

        def weights(losses: torch.Tensor) -> torch.Tensor:
            return self.x_weights(losses, lam_f).to(losses.dtype)

        return weights

    def lam_grad(self, losses: TensorLike, lam: TensorLike) -> float:
        """``∂_λ Ψ(x, λ) = ρ − KL(π ‖ uniform)`` with ``π = softmax(ℓ/λ)`` (a float)."""
        with torch.no_grad():
            ell = self._losses(losses)
            lam_t = self._lam(lam)
            logp = torch.log_softmax(ell / lam_t, dim=0)
            kl = float((logp.exp() * (logp + math.log(ell.numel()))).sum())
            return self.rho - max(kl, 0.0)

    def optimal_lam(self, losses: TensorLike, *, xtol: float = 1e-12) -> float:
        """``argmin_{λ ≥ λ0} Ψ(x, λ)`` (a float).

        Ψ is convex in λ (perspective of log-mean-exp) and ``∂_λ Ψ = ρ − KL(π_λ ‖ uniform)`` is
        increasing, so the minimiser is λ0 when ``∂_λ Ψ(λ0) ≥ 0`` and otherwise the root of the
        derivative, found with Brent's method on log λ. The bracket's upper end uses
        ``KL(π_λ ‖ u) ≤ R²/(8λ²)`` (Hoeffding; R = loss range), so ``λ_hi = R/√(8ρ)`` suffices.
        """
        ell = self._losses(losses).detach()
        if self.lam_grad(ell, self.lam0) >= 0:
            return self.lam0
        spread = float(ell.max() - ell.min())
        lam_hi = max(self.lam0, spread / math.sqrt(8.0 * self.rho)) * 1.01
        f = lambda log_lam: self.lam_grad(ell, math.exp(log_lam))
        if f(math.log(lam_hi)) <= 0:  # only at the Hoeffding limit; widen defensively
            lam_hi *= 4.0
        root = brentq(f, math.log(self.lam0), math.log(lam_hi), xtol=xtol, maxiter=500)
        return self.project_lam(math.exp(root))

    def psi_kl(self, losses: TensorLike) -> float:
        """``Ψ_KL = min_{λ ≥ λ0} Ψ(x, λ)`` for the batch (a float)."""
        ell = self._losses(losses).detach()
        return float(self.value(ell, self.optimal_lam(ell)))
