"""Dual objective L(x, η) and KL compositional Ψ(x, λ): closed-form gradients against autograd,
strong duality against a convex solver on the primal simplex problem, numerics
(docs/algorithms/dro.md)."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, minimize_scalar
from torch import nn

from privopt.errors import ConfigError
from privopt.grads import get_engine
from privopt.objectives import DualObjective, KLCompositional, get_divergence

SMOOTH = [
    ("kl", {}),
    ("chi2", {}),
    ("chi2", {"variant": 2}),
    ("kl_cvar", {"alpha": 0.3}),
    ("cressie_read", {"k": 1.5}),
]
SMOOTH_IDS = [f"{n}{p}" for n, p in SMOOTH]


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def small_problem(seed=0, n=12):
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    return model, x, y


def flat_autograd(scalar, model):
    grads = torch.autograd.grad(scalar, list(model.parameters()), retain_graph=True)
    return torch.cat([g.reshape(-1) for g in grads])


# ------------------------------------------------------------------ dual objective: gradients
@pytest.mark.parametrize("name,params", SMOOTH, ids=SMOOTH_IDS)
@pytest.mark.parametrize("g_eta", [1.0, 2.5])
def test_dual_gradients_match_autograd(name, params, g_eta):
    model, x, y = small_problem(seed=1)
    obj = DualObjective(divergence=get_divergence(name, **params), lam=0.7, g_eta=g_eta, a_max=None)
    losses = ce(model(x), y)
    # η placed inside the loss range so both sides of every kink of (ψ*)' are exercised.
    eta = torch.tensor(float(losses.detach().median()) / g_eta, dtype=torch.float64, requires_grad=True)
    value = obj.value(losses, eta)
    grad_x = flat_autograd(value, model)
    (grad_eta,) = torch.autograd.grad(value, eta)

    engine = get_engine("vmap")
    ps_losses, per_sample = engine.per_sample_grads(model, ce, x, y)
    a = obj.x_weights(ps_losses, eta.detach())
    torch.testing.assert_close((a[:, None] * per_sample).mean(0), grad_x, rtol=1e-9, atol=1e-11)
    assert obj.eta_grad(ps_losses, eta.detach()) == pytest.approx(float(grad_eta), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(obj.eta_grads(ps_losses, eta.detach()).mean(), grad_eta.detach())

    # Through the engine's clipped-sum query (clip large enough to be inactive).
    res = engine.clipped_sum(model, ce, x, y, clip=1e9, weights=obj.weight_fn(eta.detach()))
    torch.testing.assert_close(res.total / x.shape[0], grad_x, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name,params", SMOOTH, ids=SMOOTH_IDS)
def test_capped_objective_is_consistent_with_its_weights(name, params):
    """With a small a_max the tangent continuation keeps value, weights and η-gradients consistent."""
    obj = DualObjective(divergence=get_divergence(name, **params), lam=0.2, a_max=1.0)
    losses = torch.tensor([0.1, 0.4, 1.0, 2.0, 3.5], dtype=torch.float64, requires_grad=True)
    eta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert float(obj.arguments(losses, eta).detach().max()) > 1.0  # the cap is active
    v = obj.value(losses, eta)
    g_l, g_eta = torch.autograd.grad(v, (losses, eta))
    torch.testing.assert_close(g_l * losses.numel(), obj.x_weights(losses, eta))
    assert float(g_eta) == pytest.approx(obj.eta_grad(losses, eta))
    cap = float(get_divergence(name, **params).conj_grad(1.0))
    assert float(obj.x_weights(losses, eta).max()) == pytest.approx(cap)


def test_loss_bound_clamps_value_but_keeps_weights():
    obj = DualObjective(divergence="kl", lam=1.0, loss_bound=2.0, a_max=None)
    losses = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)
    clamped = torch.tensor([0.5, 2.0, 2.0], dtype=torch.float64)
    assert float(obj.value(losses, 0.3)) == pytest.approx(float(obj.value(clamped, 0.3)))
    w = obj.x_weights(losses, 0.3)
    assert float(w[2]) == pytest.approx(math.exp(2.0 - 0.3))  # weight of a clamped sample is not zeroed
    assert float(w[2]) == pytest.approx(float(w[1]))


# ------------------------------------------------------------------ dual objective: duality / η*
def primal_value(div, losses: np.ndarray, lam: float, upper: float = 1.0) -> tuple[float, np.ndarray]:
    """max_{p ∈ Δn, p ≤ upper} Σ p_i ℓ_i − λ (1/n) Σ ψ(n p_i), solved with SLSQP."""
    n = len(losses)

    def neg(p):
        psi = div.psi(torch.from_numpy(n * np.clip(p, 0, None))).numpy()
        return -(p @ losses - lam * psi.mean())

    res = minimize(
        neg,
        np.full(n, 1.0 / n),
        method="SLSQP",
        bounds=[(1e-12, upper)] * n,
        constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0}],
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success, res.message
    return -res.fun, res.x


@pytest.mark.parametrize("name,params", SMOOTH, ids=SMOOTH_IDS)
@pytest.mark.parametrize("lam", [0.3, 1.5])
def test_strong_duality_against_primal_simplex_problem(name, params, lam):
    rng = np.random.default_rng(7)
    losses = rng.uniform(0.0, 3.0, size=8)
    div = get_divergence(name, **params)
    upper = min(1.0, 1.0 / (params["alpha"] * len(losses))) if "alpha" in params else 1.0
    primal, p_star = primal_value(div, losses, lam, upper=upper)
    obj = DualObjective(divergence=div, lam=lam, a_max=None)
    dual = obj.psi_value(torch.from_numpy(losses))
    assert dual == pytest.approx(primal, abs=1e-6)
    # The optimal η turns the weights into the primal maximiser: p* = a(η*)/n.
    eta = obj.optimal_eta(torch.from_numpy(losses))
    np.testing.assert_allclose(obj.x_weights(torch.from_numpy(losses), eta).numpy() / len(losses), p_star, atol=2e-4)
    assert abs(obj.eta_grad(torch.from_numpy(losses), eta)) < 1e-8


def test_kl_dual_closed_form_and_bisection_agree():
    rng = np.random.default_rng(3)
    losses = torch.from_numpy(rng.uniform(0, 4, size=50))
    lam = 0.5
    closed = lam * (torch.logsumexp(losses / lam, 0) - math.log(50))
    obj = DualObjective(divergence="kl", lam=lam, a_max=None)
    assert obj.optimal_eta(losses) == pytest.approx(float(closed), rel=1e-12)
    assert obj.psi_value(losses) == pytest.approx(float(closed), rel=1e-12)  # Ψ = η* for KL
    # A cap that binds forces the generic bisection path; its η* must still zero the η-gradient.
    capped = DualObjective(divergence="kl", lam=lam, a_max=0.5)
    eta_c = capped.optimal_eta(losses)
    assert abs(capped.eta_grad(losses, eta_c)) < 1e-9
    grid = np.linspace(eta_c - 1, eta_c + 1, 201)
    vals = [float(capped.value(losses, e)) for e in grid]
    assert float(capped.value(losses, eta_c)) <= min(vals) + 1e-12


def test_g_eta_rescales_the_optimal_dual_variable():
    losses = torch.tensor([0.2, 0.9, 1.4, 2.2], dtype=torch.float64)
    a = DualObjective(divergence="chi2", lam=0.8, a_max=None)
    b = DualObjective(divergence="chi2", lam=0.8, g_eta=4.0, a_max=None)
    assert b.optimal_eta(losses) == pytest.approx(a.optimal_eta(losses) / 4.0, rel=1e-10)
    assert b.psi_value(losses) == pytest.approx(a.psi_value(losses), rel=1e-10)


def test_cvar_dual_is_the_mean_of_the_top_losses():
    """CVaR (an extension beyond the SPEC): min_η η + mean (ℓ−η)_+/α = mean of the top α-fraction."""
    rng = np.random.default_rng(11)
    losses = torch.from_numpy(rng.uniform(0, 5, size=20))
    obj = DualObjective(divergence=get_divergence("cvar", alpha=0.25), lam=1.0, a_max=None)
    top = torch.sort(losses, descending=True).values[:5].mean()
    assert obj.psi_value(losses) == pytest.approx(float(top), rel=1e-9)


def test_dual_is_numerically_stable_at_tiny_lambda():
    """λ = 1e−3 with cross-entropy-scale losses: no overflow, exact Ψ."""
    rng = np.random.default_rng(0)
    losses = torch.from_numpy(rng.uniform(0.1, 5.0, size=128))
    obj = DualObjective(divergence="kl", lam=1e-3)  # default a_max = 50
    eta = obj.optimal_eta(losses)
    assert eta == pytest.approx(float(1e-3 * (torch.logsumexp(losses / 1e-3, 0) - math.log(128))), rel=1e-12)
    w = obj.x_weights(losses, eta)
    assert bool(torch.isfinite(w).all()) and float(w.mean()) == pytest.approx(1.0)
    # A badly initialised η (η0 = 0) saturates the cap instead of overflowing.
    w0 = obj.x_weights(losses, 0.0)
    assert bool(torch.isfinite(w0).all()) and float(w0.max()) == pytest.approx(math.exp(50.0))
    assert math.isfinite(float(obj.value(losses, 0.0)))


def test_dual_objective_rejects_bad_configuration():
    with pytest.raises(ConfigError, match="lam"):
        DualObjective(divergence="kl", lam=0.0)
    with pytest.raises(ConfigError, match="g_eta"):
        DualObjective(divergence="kl", lam=1.0, g_eta=-1.0)
    with pytest.raises(ConfigError, match="a_max"):
        DualObjective(divergence="kl", lam=1.0, a_max=0.0)
    with pytest.raises(ConfigError, match="unknown divergence"):
        DualObjective(divergence="tv", lam=1.0)
    with pytest.raises(ConfigError, match="1-D"):
        DualObjective(divergence="kl", lam=1.0).x_weights(torch.zeros(2, 3), 0.0)


# ------------------------------------------------------------------ KL compositional
def test_compositional_value_and_gradients_match_autograd():
    model, x, y = small_problem(seed=2, n=10)
    obj = KLCompositional(rho=0.5, lam0=1e-3)
    lam = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    losses = ce(model(x), y)
    psi = obj.value(losses, lam)
    brute = lam * torch.log(torch.exp(losses / lam).mean()) + lam * 0.5
    assert float(psi.detach()) == pytest.approx(float(brute.detach()), rel=1e-12)
    grad_x = flat_autograd(psi, model)
    (grad_lam,) = torch.autograd.grad(psi, lam)

    engine = get_engine("vmap")
    ps_losses, per_sample = engine.per_sample_grads(model, ce, x, y)
    w = obj.x_weights(ps_losses, 0.6)
    torch.testing.assert_close((w[:, None] * per_sample).mean(0), grad_x, rtol=1e-9, atol=1e-11)
    assert obj.lam_grad(ps_losses, 0.6) == pytest.approx(float(grad_lam), rel=1e-9)


@pytest.mark.parametrize("shift", [0.0, 3.0])
def test_shifted_inner_quantities_recover_the_exact_gradient(shift):
    """Exact batch means of h, ∇_x h, ∇_λ h pushed through outer_grads give ∇Ψ (what DP-RS
    estimates with noise), for any data-independent shift."""
    model, x, y = small_problem(seed=3, n=9)
    obj = KLCompositional(rho=0.3, lam0=1e-3, shift=shift)
    lam_v = 0.8
    lam = torch.tensor(lam_v, dtype=torch.float64, requires_grad=True)
    losses = ce(model(x), y)
    psi = obj.value(losses, lam)
    grad_x = flat_autograd(psi, model)
    (grad_lam,) = torch.autograd.grad(psi, lam, retain_graph=True)

    # ∇_λ h against autograd of h itself.
    h = obj.h(losses.detach(), lam)
    (dh_dlam,) = torch.autograd.grad(h.sum(), lam)
    torch.testing.assert_close(obj.h_lam_grads(losses, lam_v).sum(), dh_dlam)

    engine = get_engine("vmap")
    res = engine.clipped_sum(model, ce, x, y, clip=1e12, weights=obj.h_weight_fn(lam_v))
    n = x.shape[0]
    s = float(obj.h(res.losses, lam_v).mean())
    v = res.total / n
    u = float(obj.h_lam_grads(res.losses, lam_v).mean())
    z_x, z_lam = KLCompositional.outer_grads(s=s, v=v, u=u, lam=lam_v, rho=0.3)
    torch.testing.assert_close(z_x, grad_x, rtol=1e-9, atol=1e-11)
    assert z_lam == pytest.approx(float(grad_lam), rel=1e-9, abs=1e-12)


def test_optimal_lambda_matches_bounded_brent_minimisation():
    rng = np.random.default_rng(5)
    losses = torch.from_numpy(rng.uniform(0, 3, size=40))
    obj = KLCompositional(rho=0.1, lam0=1e-3)
    lam_star = obj.optimal_lam(losses)
    ref = minimize_scalar(
        lambda lam: float(obj.value(losses, lam)), bounds=(1e-3, 50.0), method="bounded", options={"xatol": 1e-10}
    )
    assert lam_star == pytest.approx(ref.x, rel=1e-4)
    assert obj.psi_kl(losses) == pytest.approx(ref.fun, rel=1e-10)
    assert abs(obj.lam_grad(losses, lam_star)) < 1e-9


def test_optimal_lambda_hits_the_lower_bound_for_large_radius():
    losses = torch.tensor([0.1, 0.2, 3.0, 0.4], dtype=torch.float64)
    obj = KLCompositional(rho=2.0, lam0=0.05)  # ρ > log 4: the KL ball contains every point mass
    assert obj.optimal_lam(losses) == 0.05
    # Ψ then tends to (max loss) + λ0 ρ as λ0 → 0.
    tight = KLCompositional(rho=2.0, lam0=1e-4)
    assert tight.psi_kl(losses) == pytest.approx(3.0 + 2e-4 - 1e-4 * math.log(4), abs=1e-6)
    constant = torch.full((5,), 1.3, dtype=torch.float64)  # no spread: λ* = λ0, Ψ = ℓ + λ0 ρ
    assert obj.optimal_lam(constant) == 0.05
    assert obj.psi_kl(constant) == pytest.approx(1.3 + 0.05 * 2.0)


def test_kl_constrained_duality():
    """min_{λ≥λ0} Ψ(λ) with tiny λ0 equals max {Σ p_i ℓ_i : KL(p‖uniform) ≤ ρ} (SLSQP)."""
    rng = np.random.default_rng(9)
    losses = rng.uniform(0, 2, size=7)
    rho = 0.2
    n = len(losses)
    cons = [
        {"type": "eq", "fun": lambda p: p.sum() - 1.0},
        {"type": "ineq", "fun": lambda p: rho - float(np.sum(p * np.log(n * p)))},
    ]
    res = minimize(
        lambda p: -(p @ losses),
        np.full(n, 1 / n),
        method="SLSQP",
        bounds=[(1e-12, 1)] * n,
        constraints=cons,
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    obj = KLCompositional(rho=rho, lam0=1e-8)
    assert obj.psi_kl(torch.from_numpy(losses)) == pytest.approx(-res.fun, abs=1e-6)


def test_compositional_stable_at_lambda0_with_shift():
    rng = np.random.default_rng(1)
    losses = torch.from_numpy(rng.uniform(0.05, 5.0, size=256))
    obj = KLCompositional(rho=0.5, lam0=1e-3, loss_bound=10.0)  # shift c = 10
    h = obj.h(losses, 1e-3)
    assert bool(torch.isfinite(h).all()) and float(h.max()) <= 1.0
    u = obj.h_lam_grads(losses, 1e-3)
    assert bool(torch.isfinite(u).all()) and float(u.max()) <= 1 / (math.e * 1e-3) + 1e-9
    assert float(u.min()) >= 0.0
    val = float(obj.value(losses, 1e-3))
    assert val == pytest.approx(float(losses.max()) + 1e-3 * 0.5 - 1e-3 * math.log(256), abs=2e-3)
    w = obj.x_weights(losses, 1e-3)
    assert bool(torch.isfinite(w).all()) and float(w.sum()) == pytest.approx(256.0)
    # Losses above the bound are clamped (public B), so h stays ≤ 1.
    assert float(obj.h(torch.tensor([50.0]), 0.01)) == 1.0


def test_compositional_rejects_bad_configuration():
    with pytest.raises(ConfigError, match="rho"):
        KLCompositional(rho=0.0, lam0=1e-3)
    with pytest.raises(ConfigError, match="lam0"):
        KLCompositional(rho=0.5, lam0=-1.0)
    obj = KLCompositional(rho=0.5, lam0=1e-3)
    with pytest.raises(ConfigError, match="lam must be > 0"):
        obj.value(torch.ones(3), 0.0)
    with pytest.raises(ConfigError, match="must be > 0"):
        KLCompositional.outer_grads(s=0.0, v=torch.zeros(2), u=0.0, lam=1.0, rho=0.5)
    assert obj.project_lam(1e-5) == 1e-3 and obj.project_lam(0.7) == 0.7


def test_kl_compositional_exponent_cap_is_consistent():
    """a_max caps (ℓ − c)/λ inside h, the x-weights h/λ and ∂_λ h alike; None leaves h exact."""
    from privopt.objectives.compositional import KLCompositional

    losses = torch.tensor([0.1, 1.0, 5.0, 9.0], dtype=torch.float64)
    lam, c = 0.05, 0.5
    exact = KLCompositional(rho=0.5, lam0=1e-3, loss_bound=10.0, shift=c)
    capped = KLCompositional(rho=0.5, lam0=1e-3, loss_bound=10.0, shift=c, a_max=20.0)
    a = (losses - c) / lam
    torch.testing.assert_close(exact.h(losses, lam), torch.exp(a))
    h = capped.h(losses, lam)
    torch.testing.assert_close(h, torch.exp(a.clamp(max=20.0)))
    assert float(h.max()) == pytest.approx(math.exp(20.0))
    torch.testing.assert_close(capped.h_x_weights(losses, lam), h / lam)
    torch.testing.assert_close(capped.h_lam_grads(losses, lam), -h * (losses - c) / lam**2)
    # Uncapped records are untouched; the exact objective quantities ignore the cap.
    assert float(h[0]) == pytest.approx(float(exact.h(losses, lam)[0]))
    torch.testing.assert_close(capped.x_weights(losses, lam), exact.x_weights(losses, lam))
    # The float32 weight the engine receives overflows without the cap, not with it.
    assert not bool(torch.isfinite(exact.h_weight_fn(lam, shift=c)(losses.float())).all())
    assert bool(torch.isfinite(capped.h_weight_fn(lam, shift=c)(losses.float())).all())
    with pytest.raises(ConfigError, match="a_max"):
        KLCompositional(rho=0.5, lam0=1e-3, a_max=-1.0)
