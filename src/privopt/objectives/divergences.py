"""ψ-divergences of penalised DRO: the generator ψ, its convex conjugate ψ* and (ψ*)'.

Paper A penalises the worst-case distribution by ``D_ψ(p, 1/n) = (1/n) Σ_i ψ(n p_i)`` and works
with the dual (``docs/algorithms/dro.md``), which needs only the conjugate ``ψ*(s) = sup_{t≥0} s·t − ψ(t)`` and its
derivative. Paper A's Table 1 prints several wrong conjugates (listed in ``docs/algorithms/dro.md``,
"ψ-divergences"); this module implements the corrected table and every entry is unit-tested
against a numerical supremum.

All functions take tensors (or numbers) and compute in float64: the scalar per-sample DRO
quantities are exponentials or powers of loss ratios, where float32 loses the information quickly.

Registered names (:func:`get_divergence`):

======================  =============================================  ===========================
name                    ψ(t), t ≥ 0                                    (ψ*)'(s)
======================  =============================================  ===========================
``chi2`` (variant 1)    ``(t−1)²``  (keeps the printed ψ*)             ``½(s+2)_+``
``chi2`` (variant 2),   ``½(t−1)²`` (keeps the printed ψ; = CR k=2)    ``(s+1)_+``
``chi2_half``
``kl``                  ``t log t − t + 1``                            ``e^s``
``kl_cvar`` (α)         ``t log t − t + 1`` on ``[0, 1/α]``            ``min(e^s, 1/α)``
``cvar`` (α)            ``0`` on ``[0, 1/α]``  (not in Paper A)        ``1{s>0}/α``
``cressie_read`` (k)    ``(t^k − kt + k − 1)/(k(k−1))``, 1 < k ≤ 2     ``((k−1)s+1)_+^{1/(k−1)}``
======================  =============================================  ===========================

``cvar`` is an addition beyond Paper A (which only has the KL-*regularised* CVaR): it is the
classical Rockafellar–Uryasev CVaR, whose conjugate is not smooth (Assumption A2 fails), so the
SPIDER algorithms' theory does not cover it; it is provided for baselines and tests.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar, Union

import torch

from privopt.errors import ConfigError
from privopt.objectives.divergence_check import check_divergence
from privopt.registry import Registry

__all__ = [
    "Divergence",
    "ChiSquare",
    "KL",
    "KLRegularizedCVaR",
    "CVaR",
    "CressieRead",
    "get_divergence",
    "available_divergences",
    "register_divergence",
    "DIVERGENCES",
    "as_float64",
    "check_divergence",
]

TensorLike = Union[torch.Tensor, float, int]


def as_float64(v: TensorLike) -> torch.Tensor:
    """``v`` as a float64 tensor, keeping autograd history when ``v`` is already a tensor."""
    if isinstance(v, torch.Tensor):
        return v.to(torch.float64)
    return torch.as_tensor(v, dtype=torch.float64)


def _pos(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(v, min=0.0)


class Divergence(abc.ABC):
    """A ψ-divergence generator with its conjugate.

    Subclasses implement ψ (``+inf`` outside the domain, in particular for ``t < 0``), ψ*, (ψ*)' and
    (ψ*)''. The conjugate is always ``sup_{t ≥ 0}`` because ψ = +∞ for negative t.

    Every ψ here has ``ψ(1) = 0`` and ``(ψ*)'(0) = 1`` (the uniform distribution is the
    unpenalised optimum); :class:`privopt.objectives.dual.DualObjective` relies on the second fact
    to bracket the optimal dual variable. :func:`get_divergence` checks these, the conjugacy of
    ψ* and ψ, the derivatives and the smoothness constant numerically before a divergence is used
    (:func:`~privopt.objectives.divergence_check.check_divergence`; the contract is in
    ``docs/api.md``, "Extending privopt").
    """

    name: ClassVar[str] = "abstract"

    @abc.abstractmethod
    def psi(self, t: TensorLike) -> torch.Tensor:
        """ψ(t), elementwise, float64; ``+inf`` outside the domain."""

    @abc.abstractmethod
    def psi_grad(self, t: TensorLike) -> torch.Tensor:
        """ψ'(t) on the domain (a subgradient at kinks/boundaries; ``+inf`` beyond the right end)."""

    @abc.abstractmethod
    def conj(self, s: TensorLike) -> torch.Tensor:
        """ψ*(s) = sup_{t≥0} s·t − ψ(t), elementwise, float64."""

    @abc.abstractmethod
    def conj_grad(self, s: TensorLike) -> torch.Tensor:
        """(ψ*)'(s) = argmax_t of the conjugate problem, elementwise, float64, ≥ 0."""

    @abc.abstractmethod
    def conj_hess(self, s: TensorLike) -> torch.Tensor:
        """(ψ*)''(s) (right derivative at kinks), elementwise, float64."""

    def smoothness(self, *, s_max: float = math.inf) -> float:
        """Smoothness constant ``M = sup_{s ≤ s_max} (ψ*)''(s)`` (Assumption A2 of Paper A).

        For every divergence here (ψ*)'' is non-decreasing, so ``M = (ψ*)''(s_max)``; it is
        ``inf`` when ψ* is not globally smooth (KL, Cressie–Read with k < 2) unless the argument
        range is bounded (Assumption A3), and for the non-smooth ``cvar``.
        """
        # (ψ*)'' is non-decreasing, so its value at s_max (+inf allowed: the limit) is the sup.
        return float(self.conj_hess(torch.tensor(float(s_max), dtype=torch.float64)))

    def divergence_from_uniform(self, p: TensorLike) -> torch.Tensor:
        """``D_ψ(p, 1/n) = (1/n) Σ_i ψ(n·p_i)`` for a probability vector ``p`` of length n (last dim)."""
        p = as_float64(p)
        n = p.shape[-1]
        return self.psi(n * p).mean(dim=-1)

    @property
    def params(self) -> dict[str, Any]:
        """Constructor parameters (for logging/config round trips)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


def _kl_psi(t: torch.Tensor) -> torch.Tensor:
    # xlogy gives 0·log 0 = 0, so ψ(0) = 1 exactly.
    out = torch.special.xlogy(t, t) - t + 1.0
    return torch.where(t < 0, torch.full_like(t, math.inf), out)


DIVERGENCES: Registry[type[Divergence]] = Registry("divergence")


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def register_divergence(cls: type[Divergence]) -> type[Divergence]:
    """Class decorator: make a :class:`Divergence` subclass available to :func:`get_divergence` by its ``name``.

    Example:
        >>> class Half(KL):
        ...     name = "half_kl_doc_example"
        >>> register_divergence(Half) is Half, "half_kl_doc_example" in available_divergences()
        (True, True)
    """
    if not (isinstance(cls, type) and issubclass(cls, Divergence)):
        raise ConfigError(f"register_divergence needs a Divergence subclass, got {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"register_divergence: {cls.__name__} needs its own class attribute `name` (a string)")
    # Looked up case-insensitively with '-' = '_' (get_divergence): register under that key.
    return DIVERGENCES.add(_key(name), cls)


@register_divergence
class ChiSquare(Divergence):
    """χ² divergence, both variants (Paper A's χ² row is inconsistent; see the module table).

    Args:
        variant: ``1`` (default) — ``ψ(t) = (t−1)²``, matching the ψ* printed in Paper A
            (``ψ*(s) = −1 + ¼(s+2)_+²``, M = ½); ``2`` — ``ψ(t) = ½(t−1)²``, matching the printed
            ψ (``ψ*(s) = −½ + ½(s+1)_+²``, M = 1; equal to Cressie–Read with k = 2).

    Example:
        >>> d = ChiSquare()
        >>> float(d.conj(0.0)), float(d.conj_grad(0.0))
        (0.0, 1.0)
    """

    name = "chi2"

    def __init__(self, *, variant: int = 1):
        if variant not in (1, 2):
            raise ConfigError(f"chi2 variant must be 1 ((t-1)^2) or 2 ((t-1)^2/2), got {variant!r}")
        self.variant = int(variant)
        # ψ(t) = c (t−1)² with c = 1 or ½; ψ*(s) = −1/(4c)·... written through c below.
        self._c = 1.0 if variant == 1 else 0.5

    @property
    def params(self) -> dict[str, Any]:
        return {"variant": self.variant}

    def psi(self, t):
        t = as_float64(t)
        out = self._c * (t - 1.0) ** 2
        return torch.where(t < 0, torch.full_like(t, math.inf), out)

    def psi_grad(self, t):
        return 2.0 * self._c * (as_float64(t) - 1.0)

    # With ψ = c(t−1)²: the maximiser is t* = (1 + s/(2c))_+, so
    # ψ*(s) = c·(t*)² − c for the unconstrained branch and −c when t* is clipped at 0.
    def conj(self, s):
        s = as_float64(s)
        return self._c * _pos(1.0 + s / (2.0 * self._c)) ** 2 - self._c

    def conj_grad(self, s):
        return _pos(1.0 + as_float64(s) / (2.0 * self._c))

    def conj_hess(self, s):
        s = as_float64(s)
        return torch.where(s >= -2.0 * self._c, torch.full_like(s, 1.0 / (2.0 * self._c)), torch.zeros_like(s))


@register_divergence
class KL(Divergence):
    """Kullback–Leibler: ``ψ(t) = t log t − t + 1``, ``ψ*(s) = e^s − 1``, ``(ψ*)' = e^s``.

    The divergence used in all of Paper A's experiments. ψ* is only smooth on bounded domains
    (``M = e^{S0}``).

    Example:
        >>> float(KL().conj(0.0))
        0.0
    """

    name = "kl"

    def psi(self, t):
        return _kl_psi(as_float64(t))

    def psi_grad(self, t):
        return torch.log(as_float64(t))

    def conj(self, s):
        return torch.expm1(as_float64(s))

    def conj_grad(self, s):
        return torch.exp(as_float64(s))

    def conj_hess(self, s):
        return torch.exp(as_float64(s))


def _check_alpha(alpha: float, name: str) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: alpha must be a number in (0, 1), got {alpha!r}") from None
    if not 0.0 < a < 1.0:
        raise ConfigError(f"{name}: alpha must be in (0, 1), got {alpha!r}")
    return a


@register_divergence
class KLRegularizedCVaR(Divergence):
    """KL-regularised CVaR at level α (Paper A's Table 1 row, corrected).

    ``ψ(t) = t log t − t + 1`` on ``0 ≤ t ≤ 1/α`` (+∞ beyond); the conjugate is ``e^s − 1`` up to
    ``s = log(1/α)`` and continues linearly with slope ``1/α`` (the printed ``min(·)`` form always
    picks the tangent line and is wrong). ``(ψ*)' = min(e^s, 1/α)``, ``M = 1/α``.

    Args:
        alpha: level in (0, 1); the likelihood ratio ``n p_i`` is capped at ``1/α``.
    """

    name = "kl_cvar"

    def __init__(self, *, alpha: float):
        self.alpha = _check_alpha(alpha, self.name)
        self._s_star = -math.log(self.alpha)  # = log(1/α), where e^s reaches 1/α

    @property
    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def psi(self, t):
        t = as_float64(t)
        return torch.where(t > 1.0 / self.alpha, torch.full_like(t, math.inf), _kl_psi(t))

    def psi_grad(self, t):
        t = as_float64(t)
        return torch.where(t > 1.0 / self.alpha, torch.full_like(t, math.inf), torch.log(t))

    def conj(self, s):
        s = as_float64(s)
        # Evaluate the exponential branch only where it applies, so large s never overflows.
        expo = torch.expm1(torch.clamp(s, max=self._s_star))
        linear = (1.0 + s + math.log(self.alpha)) / self.alpha - 1.0
        return torch.where(s <= self._s_star, expo, linear)

    def conj_grad(self, s):
        return torch.clamp(torch.exp(torch.clamp(as_float64(s), max=self._s_star)), max=1.0 / self.alpha)

    def conj_hess(self, s):
        s = as_float64(s)
        return torch.where(s < self._s_star, torch.exp(torch.clamp(s, max=self._s_star)), torch.zeros_like(s))

    def smoothness(self, *, s_max: float = math.inf) -> float:
        # (ψ*)'' = e^s jumps to 0 at log(1/α); its supremum is the left limit 1/α.
        return float(min(math.exp(min(s_max, self._s_star)), 1.0 / self.alpha))


@register_divergence
class CVaR(Divergence):
    """Plain CVaR at level α — an addition beyond Paper A, documented here.

    ``ψ(t) = 0`` on ``[0, 1/α]`` (+∞ beyond), so ``D_ψ(p, 1/n)`` is the indicator of
    ``p_i ≤ 1/(αn)`` and the penalised DRO value is the CVaR (mean of the top α-fraction of losses)
    for every λ > 0. ``ψ*(s) = s_+/α``; (ψ*)' is the step ``1{s > 0}/α`` (right-continuous choice
    ``(ψ*)'(0) = 0``; any value in ``[0, 1/α]`` is a subgradient there). ψ* is not smooth
    (``M = inf``), so this divergence falls outside Paper A's assumptions.

    Args:
        alpha: level in (0, 1).
    """

    name = "cvar"

    def __init__(self, *, alpha: float):
        self.alpha = _check_alpha(alpha, self.name)

    @property
    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def psi(self, t):
        t = as_float64(t)
        bad = (t < 0) | (t > 1.0 / self.alpha)
        return torch.where(bad, torch.full_like(t, math.inf), torch.zeros_like(t))

    def psi_grad(self, t):
        t = as_float64(t)
        return torch.where(t > 1.0 / self.alpha, torch.full_like(t, math.inf), torch.zeros_like(t))

    def conj(self, s):
        return _pos(as_float64(s)) / self.alpha

    def conj_grad(self, s):
        s = as_float64(s)
        return torch.where(s > 0, torch.full_like(s, 1.0 / self.alpha), torch.zeros_like(s))

    def conj_hess(self, s):
        return torch.zeros_like(as_float64(s))

    def smoothness(self, *, s_max: float = math.inf) -> float:
        return math.inf if s_max >= 0 else 0.0


@register_divergence
class CressieRead(Divergence):
    """Cressie–Read family with ``1 < k ≤ 2`` (Paper A prints "k ∈ R", which is wrong: ψ* needs k > 1).

    ``ψ(t) = (t^k − k t + k − 1)/(k(k−1))``, ``ψ*(s) = (1/k)(((k−1)s + 1)_+^{k/(k−1)} − 1)``,
    ``(ψ*)'(s) = ((k−1)s + 1)_+^{1/(k−1)}``. k = 2 is χ² variant 2.

    Args:
        k: exponent in (1, 2]. (ψ*)'' is bounded globally only for k = 2.
    """

    name = "cressie_read"

    def __init__(self, *, k: float = 2.0):
        try:
            kk = float(k)
        except (TypeError, ValueError):
            raise ConfigError(f"cressie_read: k must be a number in (1, 2], got {k!r}") from None
        if not 1.0 < kk <= 2.0:
            raise ConfigError(f"cressie_read: k must be in (1, 2] (smooth conjugate), got {k!r}")
        self.k = kk

    @property
    def params(self) -> dict[str, Any]:
        return {"k": self.k}

    def psi(self, t):
        t = as_float64(t)
        k = self.k
        out = (torch.pow(_pos(t), k) - k * t + k - 1.0) / (k * (k - 1.0))
        return torch.where(t < 0, torch.full_like(t, math.inf), out)

    def psi_grad(self, t):
        t = as_float64(t)
        return (torch.pow(_pos(t), self.k - 1.0) - 1.0) / (self.k - 1.0)

    def _base(self, s: torch.Tensor) -> torch.Tensor:
        return _pos((self.k - 1.0) * as_float64(s) + 1.0)

    def conj(self, s):
        k = self.k
        return (torch.pow(self._base(s), k / (k - 1.0)) - 1.0) / k

    def conj_grad(self, s):
        return torch.pow(self._base(s), 1.0 / (self.k - 1.0))

    def conj_hess(self, s):
        s = as_float64(s)
        k = self.k
        base = self._base(s)
        # d/ds base^{1/(k−1)} = base^{(2−k)/(k−1)}; zero where base is clipped.
        return torch.where(base > 0, torch.pow(base, (2.0 - k) / (k - 1.0)), torch.zeros_like(s))


# Aliases map to (registry name, fixed parameters).
_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chi2_half": ("chi2", {"variant": 2}),
    "chi_square": ("chi2", {}),
    "chisquare": ("chi2", {}),
    "kl_regularized_cvar": ("kl_cvar", {}),
    "cr": ("cressie_read", {}),
}


def available_divergences() -> list[str]:
    """Registered divergence names (aliases included)."""
    return sorted(DIVERGENCES.names() + tuple(_ALIASES))


def get_divergence(name: str, **params: Any) -> Divergence:
    """Build a divergence by name.

    Args:
        name: one of :func:`available_divergences` (case-insensitive, ``-`` = ``_``).
        **params: constructor parameters (``variant`` for chi2, ``alpha`` for kl_cvar/cvar,
            ``k`` for cressie_read).

    The divergence (a registered one, or an instance given as ``name``) is checked against the
    ψ-divergence contract once per class and parameters (:func:`check_divergence`).

    Raises:
        ConfigError: unknown name, unknown parameter, a parameter out of range, or a divergence that
            fails :func:`check_divergence` (the message names the property and a witness point).

    Example:
        >>> get_divergence("kl_cvar", alpha=0.1)
        KLRegularizedCVaR(alpha=0.1)
        >>> float(get_divergence("chi2_half").conj_grad(0.5))
        1.5
    """
    if isinstance(name, Divergence):
        if params:
            raise ConfigError(f"parameters {sorted(params)} given together with a Divergence instance")
        return _checked(name)
    key = _key(str(name))
    fixed: dict[str, Any] = {}
    if key in _ALIASES:
        key, fixed = _ALIASES[key]
    if key not in DIVERGENCES:
        raise ConfigError(f"unknown divergence {name!r}; available: {', '.join(available_divergences())}")
    clash = set(fixed) & set(params)
    if clash:
        raise ConfigError(f"divergence {name!r} fixes {sorted(clash)}; do not pass them")
    try:
        div = DIVERGENCES.lookup(key)(**fixed, **params)
    except TypeError as exc:
        raise ConfigError(f"bad parameters for divergence {name!r}: {sorted(params)} ({exc})") from None
    return _checked(div)


# (class, parameters, attributes) of the divergences that passed check_divergence, once per process.
_CHECKED: set[tuple[type, str, str]] = set()


def _checked(div: Divergence) -> Divergence:
    """``div`` after :func:`check_divergence`, run once per class and parameters."""
    # The attributes too: a user's class may keep constructor arguments without listing them in params.
    attributes = getattr(div, "__dict__", {})
    key = (type(div), *(repr(sorted((str(k), repr(v)) for k, v in d.items())) for d in (div.params, attributes)))
    if key not in _CHECKED:
        check_divergence(div)
        _CHECKED.add(key)
    return div
