"""ψ-divergences: conjugates against a numerical supremum, derivatives against autograd / finite
differences, and the registry (docs/algorithms/dro.md)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from privopt.errors import ConfigError
from privopt.objectives import (
    KL,
    ChiSquare,
    CressieRead,
    CVaR,
    KLRegularizedCVaR,
    available_divergences,
    get_divergence,
)

DIVERGENCES = [
    ("chi2", {}),
    ("chi2", {"variant": 2}),
    ("kl", {}),
    ("kl_cvar", {"alpha": 0.1}),
    ("kl_cvar", {"alpha": 0.5}),
    ("cvar", {"alpha": 0.2}),
    ("cressie_read", {"k": 1.5}),
    ("cressie_read", {"k": 1.2}),
    ("cressie_read", {"k": 2.0}),
]
IDS = [f"{n}{p}" for n, p in DIVERGENCES]
S_GRID = np.linspace(-4.0, 3.5, 31)
T_MAX = 200.0  # every maximiser for s ≤ 3.5 lies below this (KL: e^3.5 ≈ 33; CR k=1.2: ≈ 37)


def numerical_conjugate(div, s: float) -> tuple[float, float]:
    """sup_{t≥0} s·t − ψ(t) by a dense grid then a bounded scalar refinement; returns (value, argmax)."""
    ts = np.concatenate([np.linspace(0.0, 5.0, 5001), np.linspace(5.0, T_MAX, 20001)])
    vals = s * ts - div.psi(torch.from_numpy(ts)).numpy()
    i = int(np.nanargmax(vals))
    lo, hi = ts[max(i - 1, 0)], ts[min(i + 1, len(ts) - 1)]
    best_v, best_t = vals[i], ts[i]
    if hi > lo:

        def neg_obj(t: float) -> float:
            psi = float(div.psi(t))
            return 1e300 if math.isinf(psi) else -(s * t - psi)  # outside the domain of ψ

        res = minimize_scalar(neg_obj, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12})
        if -res.fun > best_v:
            best_v, best_t = -res.fun, res.x
    return float(best_v), float(best_t)


@pytest.mark.parametrize("name,params", DIVERGENCES, ids=IDS)
def test_conjugate_matches_numerical_sup(name, params):
    div = get_divergence(name, **params)
    ours = div.conj(torch.from_numpy(S_GRID)).numpy()
    for s, c in zip(S_GRID, ours):
        num, _ = numerical_conjugate(div, float(s))
        assert c == pytest.approx(num, abs=1e-6, rel=1e-7), (name, params, s)


@pytest.mark.parametrize("name,params", DIVERGENCES, ids=IDS)
def test_conj_grad_is_the_maximiser(name, params):
    """Danskin: (ψ*)'(s) is the t attaining the supremum (unique for strictly convex ψ)."""
    div = get_divergence(name, **params)
    if name == "cvar":
        pytest.skip("ψ is flat on its domain: the maximiser is not unique")
    for s in S_GRID:
        _, t_star = numerical_conjugate(div, float(s))
        assert float(div.conj_grad(float(s))) == pytest.approx(t_star, abs=2e-4, rel=1e-4), (name, s)


@pytest.mark.parametrize("name,params", DIVERGENCES, ids=IDS)
def test_conj_derivatives_match_autograd_and_finite_differences(name, params):
    div = get_divergence(name, **params)
    # Stay away from the kinks (−2, −1, log 1/α, (k−1)s = −1, 0) where derivatives jump.
    kinks = {-2.0, -1.0, 0.0, math.log(10.0), math.log(2.0), -2.0, -5.0}
    s_vals = [s for s in np.linspace(-3.7, 3.3, 23) if min(abs(s - k) for k in kinks) > 1e-2]
    s = torch.tensor(s_vals, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(div.conj(s).sum(), s)
    torch.testing.assert_close(div.conj_grad(s.detach()), g, rtol=1e-10, atol=1e-12)
    h = 1e-6
    fd = (div.conj(s.detach() + h) - div.conj(s.detach() - h)) / (2 * h)
    torch.testing.assert_close(div.conj_grad(s.detach()), fd, rtol=1e-6, atol=1e-7)
    fd2 = (div.conj_grad(s.detach() + h) - div.conj_grad(s.detach() - h)) / (2 * h)
    torch.testing.assert_close(div.conj_hess(s.detach()), fd2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,params", DIVERGENCES, ids=IDS)
def test_generator_properties(name, params):
    """ψ(1) = 0, ψ ≥ 0, ψ = +inf for t < 0, (ψ*)'(0) = 1 (on the right for cvar), ψ*(0) = 0."""
    div = get_divergence(name, **params)
    assert float(div.psi(1.0)) == 0.0
    ts = torch.linspace(0, 3, 301, dtype=torch.float64)
    assert bool((div.psi(ts) >= 0).all())
    assert math.isinf(float(div.psi(-0.1)))
    assert float(div.conj(0.0)) == pytest.approx(0.0, abs=1e-15)
    s0 = 1e-12 if name == "cvar" else 0.0
    expected = 1.0 / params["alpha"] if name == "cvar" else 1.0
    assert float(div.conj_grad(s0)) == pytest.approx(expected)


@pytest.mark.parametrize("name,params", DIVERGENCES, ids=IDS)
def test_psi_grad_matches_autograd(name, params):
    div = get_divergence(name, **params)
    if name == "cvar":  # ψ is constant (0) on its domain
        assert bool((div.psi_grad(torch.tensor([0.1, 1.0, 4.9])) == 0).all())
        assert math.isinf(float(div.psi_grad(5.1)))
        return
    t = torch.tensor([0.3, 0.8, 1.0, 1.7, 2.5], dtype=torch.float64, requires_grad=True)
    if name in ("kl_cvar", "cvar"):
        t = torch.tensor([0.3, 0.8, 1.0, 1.7], dtype=torch.float64, requires_grad=True)  # inside [0, 1/α]
    (g,) = torch.autograd.grad(div.psi(t).sum(), t)
    torch.testing.assert_close(div.psi_grad(t.detach()), g, rtol=1e-10, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    idx=st.integers(min_value=0, max_value=len(DIVERGENCES) - 1),
    s=st.floats(min_value=-20, max_value=20),
    t=st.floats(min_value=0, max_value=50),
)
def test_fenchel_young_inequality(idx, s, t):
    """ψ(t) + ψ*(s) ≥ s·t for all t ≥ 0, with equality at t = (ψ*)'(s)."""
    name, params = DIVERGENCES[idx]
    div = get_divergence(name, **params)
    lhs = float(div.psi(t) + div.conj(s))
    assert lhs >= s * t - 1e-9 * max(1.0, abs(s * t))
    t_star = float(div.conj_grad(s))
    gap = float(div.psi(t_star) + div.conj(s)) - s * t_star
    assert abs(gap) <= 1e-9 * max(1.0, abs(s * t_star))


def test_kl_cvar_fixes_the_printed_min_form():
    """The printed min(e^s, (1+s+log α)/α) − 1 always picks the tangent line."""
    div = KLRegularizedCVaR(alpha=0.2)
    s = torch.linspace(-3, 1, 41, dtype=torch.float64)  # all below log(1/0.2) ≈ 1.609
    printed = torch.minimum(torch.exp(s), (1 + s + math.log(0.2)) / 0.2) - 1
    torch.testing.assert_close(div.conj(s), torch.expm1(s))
    assert bool((printed < div.conj(s) - 1e-9).all())
    # Large arguments stay finite (no overflow of the unused exponential branch).
    assert math.isfinite(float(div.conj(1e4)))
    assert float(div.conj_grad(1e4)) == pytest.approx(5.0)


def test_chi2_variants_and_cressie_read_k2_agree():
    s = torch.linspace(-3, 3, 61, dtype=torch.float64)
    v2 = get_divergence("chi2_half")
    cr = CressieRead(k=2.0)
    torch.testing.assert_close(v2.conj(s), cr.conj(s))
    torch.testing.assert_close(v2.conj_grad(s), cr.conj_grad(s))
    v1 = ChiSquare()
    # Variant 1 is the printed ψ*: −1 + (s+2)^2/4 where s ≥ −2.
    s_ok = s[s >= -2]
    torch.testing.assert_close(v1.conj(s_ok), -1 + 0.25 * (s_ok + 2) ** 2)


def test_smoothness_constants():
    assert ChiSquare().smoothness() == 0.5
    assert ChiSquare(variant=2).smoothness() == 1.0
    assert KLRegularizedCVaR(alpha=0.1).smoothness() == pytest.approx(10.0)
    assert math.isinf(KL().smoothness())
    assert KL().smoothness(s_max=2.0) == pytest.approx(math.exp(2.0))
    assert CressieRead(k=2.0).smoothness() == 1.0
    assert math.isinf(CressieRead(k=1.5).smoothness())
    assert math.isinf(CVaR(alpha=0.1).smoothness())


def test_divergence_from_uniform():
    div = KL()
    n = 4
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    expected = float((p * torch.log(p * n)).sum())  # KL(p || uniform)
    assert float(div.divergence_from_uniform(p)) == pytest.approx(expected)
    assert float(div.divergence_from_uniform(torch.full((n,), 1 / n))) == pytest.approx(0.0, abs=1e-15)


def test_registry_and_errors():
    names = available_divergences()
    for required in ("chi2", "chi2_half", "kl", "kl_cvar", "cvar", "cressie_read"):
        assert required in names
    assert isinstance(get_divergence("KL"), KL)
    assert isinstance(get_divergence("kl-cvar", alpha=0.3), KLRegularizedCVaR)
    assert get_divergence("chi2").variant == 1
    d = KL()
    assert get_divergence(d) is d
    with pytest.raises(ConfigError, match="unknown divergence 'hellinger'"):
        get_divergence("hellinger")
    with pytest.raises(ConfigError, match="alpha must be in"):
        get_divergence("kl_cvar", alpha=1.5)
    with pytest.raises(ConfigError, match="k must be in"):
        get_divergence("cressie_read", k=3.0)
    with pytest.raises(ConfigError, match="variant"):
        get_divergence("chi2", variant=3)
    with pytest.raises(ConfigError, match="bad parameters"):
        get_divergence("kl", alpha=0.1)
    with pytest.raises(ConfigError, match="fixes"):
        get_divergence("chi2_half", variant=1)
    with pytest.raises(ConfigError):
        get_divergence("kl_cvar")  # alpha is required


def test_register_divergence_extends_get_divergence_and_refuses_clashes():
    from privopt.objectives import register_divergence

    class RenamedKL(KL):  # a valid divergence: get_divergence checks it (tests/test_divergence_check.py)
        name = "renamed_kl_test"

    assert register_divergence(RenamedKL) is RenamedKL
    assert register_divergence(RenamedKL) is RenamedKL  # the same class again is a no-op
    assert "renamed_kl_test" in available_divergences()
    assert isinstance(get_divergence("Renamed-KL-Test"), RenamedKL)

    class Impostor(KL):
        name = "kl"

    with pytest.raises(ConfigError, match="divergence name 'kl' registered twice"):
        register_divergence(Impostor)
    assert type(get_divergence("kl")) is KL
    with pytest.raises(ConfigError, match="needs a Divergence subclass"):
        register_divergence(dict)
