"""Numerical self-check of a ψ-divergence: the contract the DRO objective relies on.

:func:`~privopt.objectives.divergences.get_divergence` runs :func:`check_divergence` once per
divergence class and parameters (cached), so every path that builds a DRO objective (configs,
``privopt.fit``, the algorithms, the CLI) refuses a divergence that breaks the contract before any
data is read, with a :class:`~privopt.errors.ConfigError` that names the divergence, the property
and a witness point. The points are the public constants below, never data.

Checked, in this order (``docs/api.md``, "Extending privopt", explains why each matters):

1. ``ψ(1) = 0``; ``ψ(t) ≥ 0`` for ``t ≥ 0``; ``ψ(t) = +∞`` for ``t < 0``.
2. ψ*, (ψ*)' finite and (ψ*)'' not NaN on the s grid; ``ψ*(0) = 0``; ``(ψ*)'(0) = 1`` (at a kink
   at 0: ``(ψ*)'(0) ≤ 1 ≤ (ψ*)'(0+)``, how :class:`~privopt.objectives.dual.DualObjective`
   brackets the optimal dual variable).
3. ``(ψ*)' ≥ 0`` (the weights) and non-decreasing (ψ* convex).
4. Fenchel–Young: ``ψ*(s) ≥ s·t − ψ(t)`` on the (s, t) grid.
5. (ψ*)' is a derivative of ψ* (one-sided finite differences, below).
6. Fenchel–Young equality at ``t = (ψ*)'(s)``: with 4, ψ* is the conjugate ``sup_{t≥0} s·t − ψ(t)``.
7. ``(ψ*)'' ≥ 0``, and non-decreasing when the class keeps :meth:`Divergence.smoothness`
   (its formula ``M = (ψ*)''(s_max)`` assumes it; ``kl_cvar`` and ``cvar`` override it).
8. (ψ*)'' is a derivative of (ψ*)' (one-sided finite differences).
9. ``smoothness(s_max=b)`` bounds every secant slope of (ψ*)' on ``[a, b]`` (a jump of (ψ*)' needs
   ``inf``, as ``cvar`` returns past 0).
10. ψ' is a derivative of ψ where ψ is finite (the primal–dual algorithms use ψ').

Tolerances. Values are compared with ``VALUE_RTOL = 1e-9`` times the magnitude of the terms
involved (at least 1): a correct float64 formula of a few operations is within some ulps (~1e-15),
so this leaves a factor 10⁶ for rounding and cancellation, and any error that changes the objective
(a wrong constant, a wrong conjugate) is many orders larger. Derivatives use one-sided differences
with step ``h = FD_STEP·max(1, |x|)``: for a convex f (ψ, ψ*) a subgradient g at x satisfies
``(f(x) − f(x−h))/h ≤ g ≤ (f(x+h) − f(x))/h`` exactly, so kinks (``cvar``, ``kl_cvar``, the clipped
χ²) need no special case; for (ψ*)' (monotone, not convex) the same bracket holds up to ``O(h²)``.
The slack is ``FD_RTOL·max(1, |g|)`` plus the rounding of the differenced values,
``ROUND_ULPS·eps·max(1, |f|)/h`` (1000 ulps covers formulas whose terms cancel to 1/100 of their
size). A bracket with a non-finite end (the edge of ψ's domain) is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from privopt.errors import ConfigError

if TYPE_CHECKING:
    from privopt.objectives.divergences import Divergence

__all__ = ["check_divergence", "S_GRID", "T_GRID", "T_NEGATIVE", "VALUE_RTOL", "FD_STEP", "FD_RTOL"]

_F64 = torch.float64
EPS = torch.finfo(_F64).eps
VALUE_RTOL = 1e-9
FD_STEP = 1e-6
FD_RTOL = 1e-6
ROUND_ULPS = 1e3
RIGHT_OF_ZERO = 1e-12  # where (ψ*)'(0+) is read at a kink at 0

# Arguments s of ψ* (the DRO weights' (ℓ − g_η η)/λ; the weight cap's argument is within ±30 for
# caps up to e^30) and ratios t = n·p_i of ψ, including 0, 1 and both sides of 0.
S_GRID = torch.cat(
    [torch.linspace(-30.0, 30.0, 241, dtype=_F64), torch.tensor([-1e-3, 1e-3, -0.1, 0.1, 0.3, 0.7], dtype=_F64)]
).unique()
T_GRID = torch.cat(
    [torch.zeros(1, dtype=_F64), torch.logspace(-6, 4, 81, dtype=_F64), torch.linspace(0.0, 5.0, 51, dtype=_F64)]
).unique()
T_NEGATIVE = torch.tensor([-1e3, -10.0, -1.0, -0.5, -1e-3, -1e-9], dtype=_F64)


def _num(x: float) -> str:
    return repr(float(f"{float(x):.10g}"))


def _label(div: Divergence) -> str:
    name = getattr(type(div), "name", "abstract")
    name = type(div).__name__ if name == "abstract" else name
    params = div.params
    args = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return f"{name!r} ({args})" if args else repr(name)


@dataclass
class _Probe:
    """The divergence and its values on the grids (computed once)."""

    div: Divergence
    label: str

    def call(self, method: str, x: torch.Tensor) -> torch.Tensor:
        """``div.<method>(x)`` as a float64 tensor of x's shape, or a ConfigError saying why not."""
        try:
            raw = getattr(self.div, method)(x)
            out = torch.as_tensor(raw, dtype=_F64)
        except Exception as exc:  # a user's method failing on the grid is a broken divergence
            raise ConfigError(
                f"divergence {self.label}: {method} failed on a float64 tensor: {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(raw, torch.Tensor) and raw.dtype != _F64:
            raise ConfigError(
                f"divergence {self.label}: {method} returned {raw.dtype} for float64 input, must compute in "
                "float64 (the DRO weights are exponentials or powers of loss ratios)"
            )
        if out.shape != x.shape:
            raise ConfigError(
                f"divergence {self.label}: {method} must work elementwise: shape {tuple(x.shape)} "
                f"in, shape {tuple(out.shape)} out"
            )
        return out.detach()


def _first(bad: torch.Tensor) -> int | None:
    idx = torch.nonzero(bad).flatten()
    return int(idx[0]) if idx.numel() else None


def _psi_domain(p: _Probe) -> str | None:
    one = float(p.call("psi", torch.ones(1, dtype=_F64))[0])
    if not abs(one) <= VALUE_RTOL:
        return f"psi(1) = {_num(one)}, must be 0 (the uniform distribution is the unpenalised optimum)"
    psi = p.call("psi", T_GRID)
    i = _first(~(psi >= -VALUE_RTOL * torch.clamp(T_GRID, min=1.0)))
    if i is not None:
        return (
            f"psi({_num(T_GRID[i])}) = {_num(psi[i])}, must be >= 0 for t >= 0 "
            "(psi(1) = 0 is its minimum: D_psi(p, 1/n) >= 0 with equality at uniform weights)"
        )
    neg = p.call("psi", T_NEGATIVE)
    i = _first(~(neg == math.inf))
    if i is not None:
        return (
            f"psi({_num(T_NEGATIVE[i])}) = {_num(neg[i])}, must be +inf for t < 0 "
            "(weights are non-negative; the conjugate is the sup over t >= 0)"
        )
    return None


def _conj_values(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    for key, what in (("conj", "psi*"), ("grad", "(psi*)'")):
        i = _first(~torch.isfinite(v[key]))
        if i is not None:
            return (
                f"{what}({_num(S_GRID[i])}) = {_num(v[key][i])}, must be finite for every s "
                "(psi must grow faster than linearly in t, or have a bounded domain)"
            )
    i = _first(torch.isnan(v["hess"]))
    if i is not None:
        return f"(psi*)''({_num(S_GRID[i])}) is nan, must be a number (+inf allowed)"
    at = torch.tensor([0.0, RIGHT_OF_ZERO], dtype=_F64)
    c0 = float(p.call("conj", at)[0])
    if not abs(c0) <= VALUE_RTOL:
        return f"psi*(0) = {_num(c0)}, must be 0 (= -min psi: psi(1) = 0 is the minimum)"
    g0, g_right = (float(x) for x in p.call("conj_grad", at))
    why = (
        "(the uniform distribution is the unpenalised optimum; "
        "DualObjective brackets the optimal dual variable with it)"
    )
    if not g0 <= 1.0 + VALUE_RTOL:
        return f"(psi*)'(0) = {_num(g0)}, must be 1 {why}"
    if not max(g0, g_right) >= 1.0 - VALUE_RTOL:
        return (
            f"(psi*)'(0) = {_num(g0)} and (psi*)'({RIGHT_OF_ZERO}) = {_num(g_right)}, must be 1 "
            f"(at a kink at 0: at most 1 at 0 and at least 1 right of it) {why}"
        )
    return None


def _non_decreasing(values: torch.Tensor, what: str, why: str) -> str | None:
    drop = values[:-1] - values[1:]
    i = _first(drop > VALUE_RTOL * torch.clamp(values[:-1].abs(), min=1.0))
    if i is None:
        return None
    return (
        f"{what}({_num(S_GRID[i])}) = {_num(values[i])} > {what}({_num(S_GRID[i + 1])}) = "
        f"{_num(values[i + 1])}, must be non-decreasing ({why})"
    )


def _conj_grad_shape(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    g = v["grad"]
    i = _first(g < -VALUE_RTOL)
    if i is not None:
        return f"(psi*)'({_num(S_GRID[i])}) = {_num(g[i])}, must be >= 0 (it is the weight n*p_i of a sample)"
    return _non_decreasing(g, "(psi*)'", "psi* is convex; the weights grow with the loss")


def _fenchel_young_inequality(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    s, t = S_GRID[:, None], T_GRID[None, :]
    psi = p.call("psi", T_GRID)[None, :]
    conj = v["conj"][:, None]
    rhs = s * t - psi  # -inf outside the domain of psi
    psi_size = torch.where(torch.isfinite(psi), psi.abs(), torch.ones_like(psi))
    scale = torch.maximum(torch.maximum((s * t).abs(), psi_size), torch.clamp(conj.abs(), min=1.0))
    bad = conj < rhs - VALUE_RTOL * scale
    if not bool(bad.any()):
        return None
    i, j = (int(x) for x in torch.nonzero(bad)[0])
    return (
        f"psi*({_num(S_GRID[i])}) = {_num(conj[i, 0])} < s*t - psi(t) = {_num(rhs[i, j])} at t = "
        f"{_num(T_GRID[j])}, must be the convex conjugate sup_(t>=0) s*t - psi(t) (Fenchel-Young)"
    )


def _fenchel_young_equality(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    t_star = v["grad"]
    psi = p.call("psi", t_star)
    gap = psi + v["conj"] - S_GRID * t_star
    scale = torch.stack([(S_GRID * t_star).abs(), psi.abs(), v["conj"].abs(), torch.ones_like(gap)]).amax(dim=0)
    i = _first(~(gap.abs() <= VALUE_RTOL * scale))
    if i is None:
        return None
    return (
        f"at s = {_num(S_GRID[i])}, t = (psi*)'(s) = {_num(t_star[i])}: psi(t) + psi*(s) - s*t = "
        f"{_num(gap[i])}, must be 0 ((psi*)'(s) must attain the sup defining psi*(s); Fenchel-Young equality)"
    )


def _bracket(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor, h: torch.Tensor):
    """Indices where ``g`` lies outside the one-sided difference quotients of ``f`` at ``x`` (plus
    slack), skipping brackets with a non-finite end; also returns the quotients."""
    lo_x, hi_x = x - h, x + h
    f_lo, f_0, f_hi = f(lo_x), f(x), f(hi_x)
    back, fwd = (f_0 - f_lo) / (x - lo_x), (f_hi - f_0) / (hi_x - x)
    low, high = torch.minimum(back, fwd), torch.maximum(back, fwd)
    size = torch.stack([f_lo.abs(), f_0.abs(), f_hi.abs(), torch.ones_like(x)]).amax(dim=0)
    slack = FD_RTOL * torch.clamp(g.abs(), min=1.0) + ROUND_ULPS * EPS * size / h
    finite = torch.isfinite(back) & torch.isfinite(fwd) & torch.isfinite(g)
    bad = finite & ((g < low - slack) | (g > high + slack))
    return _first(bad), back, fwd


def _fd_message(what: str, of: str, x: float, g: float, back: float, fwd: float) -> str:
    lo, hi = sorted((back, fwd))
    return (
        f"{what}({_num(x)}) = {_num(g)}, but the one-sided difference quotients of {of} there are "
        f"{_num(lo)} and {_num(hi)}: {what} must be the derivative of {of} (at a kink, between them)"
    )


def _derivative_on_s_grid(p: _Probe, of: str, value: torch.Tensor, names: tuple[str, str]) -> str | None:
    """Whether ``value`` (on ``S_GRID``) lies between the one-sided difference quotients of method ``of``."""
    h = FD_STEP * torch.clamp(S_GRID.abs(), min=1.0)
    i, back, fwd = _bracket(lambda x: p.call(of, x), S_GRID, value, h)
    if i is None:
        return None
    return _fd_message(names[0], names[1], S_GRID[i], value[i], back[i], fwd[i])


def _conj_grad_fd(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    return _derivative_on_s_grid(p, "conj", v["grad"], ("(psi*)'", "psi*"))


def _keeps_base_smoothness(div: Divergence) -> bool:
    from privopt.objectives.divergences import Divergence  # imports this module

    return type(div).smoothness is Divergence.smoothness


def _conj_hess_shape(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    hess = v["hess"]
    i = _first(hess < -VALUE_RTOL)
    if i is not None:
        return f"(psi*)''({_num(S_GRID[i])}) = {_num(hess[i])}, must be >= 0 (psi* is convex)"
    if not _keeps_base_smoothness(p.div):
        return None  # the class computes its own smoothness constant (checked by _smoothness_bound)
    return _non_decreasing(
        hess, "(psi*)''", "Divergence.smoothness returns (psi*)''(s_max) as the sup; override smoothness otherwise"
    )


def _conj_hess_fd(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    return _derivative_on_s_grid(p, "conj_grad", v["hess"], ("(psi*)''", "(psi*)'"))


def _smoothness_bound(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    g, s = v["grad"], S_GRID
    slope = (g[1:] - g[:-1]) / (s[1:] - s[:-1])
    if _keeps_base_smoothness(p.div):
        bound = v["hess"][1:]  # what Divergence.smoothness(s_max=b) returns, without 240 calls
    else:
        try:
            bound = torch.tensor([float(p.div.smoothness(s_max=float(b))) for b in s[1:]], dtype=_F64)
        except Exception as exc:  # a user's override with another signature, or a failure
            return f"smoothness(s_max=...) failed: {type(exc).__name__}: {exc}"
    slack = FD_RTOL * torch.clamp(bound.abs(), min=1.0) + ROUND_ULPS * EPS * torch.clamp(g[1:].abs(), min=1.0) / (
        s[1:] - s[:-1]
    )
    i = _first(~(slope <= bound + slack))
    if i is None:
        return None
    return (
        f"(psi*)' rises from {_num(g[i])} at s = {_num(s[i])} to {_num(g[i + 1])} at s = {_num(s[i + 1])} "
        f"(slope {_num(slope[i])}), more than smoothness(s_max={_num(s[i + 1])}) = {_num(bound[i])} allows "
        "(a jump of (psi*)' needs smoothness() = inf past it, as cvar's)"
    )


def _psi_grad_fd(p: _Probe, v: dict[str, torch.Tensor]) -> str | None:
    t = T_GRID[T_GRID > 0]
    h = torch.minimum(FD_STEP * torch.clamp(t, min=1.0), 0.5 * t)
    g = p.call("psi_grad", t)
    i, back, fwd = _bracket(lambda x: p.call("psi", x), t, g, h)
    if i is None:
        return None
    return _fd_message("psi'", "psi", t[i], g[i], back[i], fwd[i])


_CHECKS = (
    _conj_values,
    _conj_grad_shape,
    _fenchel_young_inequality,
    _conj_grad_fd,
    _fenchel_young_equality,
    _conj_hess_shape,
    _conj_hess_fd,
    _smoothness_bound,
    _psi_grad_fd,
)


def check_divergence(div: Divergence) -> None:
    """Check ``div`` against the ψ-divergence contract on fixed public grids (module docstring).

    Raises:
        ConfigError: naming the divergence, the property violated and a witness point.

    Example:
        >>> from privopt.objectives.divergences import KL
        >>> class Shifted(KL):
        ...     name = "shifted_kl_doc_example"
        ...     def psi(self, t):
        ...         return super().psi(t) + 1.0
        >>> check_divergence(KL())
        >>> try:
        ...     check_divergence(Shifted())
        ... except ConfigError as err:
        ...     print(str(err).split(" (the")[0])
        divergence 'shifted_kl_doc_example': psi(1) = 1.0, must be 0
    """
    p = _Probe(div, _label(div))
    with torch.no_grad():
        problem = _psi_domain(p)
        if problem is None:
            v = {
                "conj": p.call("conj", S_GRID),
                "grad": p.call("conj_grad", S_GRID),
                "hess": p.call("conj_hess", S_GRID),
            }
            problem = next((m for m in (check(p, v) for check in _CHECKS) if m is not None), None)
    if problem is not None:
        raise ConfigError(f"divergence {p.label}: {problem}")
