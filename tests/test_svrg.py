"""DP-SVRG / DP-SVRG++: exact recursions without noise, sensitivity of each release, noise wiring,
accounting (the reference values of docs/algorithms/erm.md, "Privacy inventory")."""

import json
import math

import numpy as np
import pytest
import torch

from erm_helpers import linear_ctx
from privopt.algorithms.svrg import DPSVRG, DPSVRGPlusPlus
from privopt.errors import ConfigError
from privopt.objectives.erm import LogisticERM, logistic_loss, normalize_rows


def _data(n=40, p=5, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = normalize_rows(rng.normal(size=(n, p))) * scale
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    return x, y


def _grad(x, y, w, i, clip):
    """Clipped per-sample gradient of record i by autograd (independent of the closed form)."""
    wt = torch.tensor(w, requires_grad=True)
    logistic_loss((torch.from_numpy(x[i : i + 1]) @ wt)[:, None], torch.from_numpy(y[i : i + 1])).sum().backward()
    g = wt.grad.numpy()
    return g * min(1.0, clip / max(np.linalg.norm(g), 1e-300))


def _reference_svrg(x, y, *, epochs, inner, eta, lam, clip, doubling, seed):
    """Textbook (prox-)SVRG / SVRG++ recursion (docs/algorithms/erm.md) with autograd gradients.

    Indices follow the algorithm's documented sampling: each epoch draws torch.randint(n, (m_s,))
    from the sampler generator (m_s <= 8192 here, one block).
    """
    n, p = x.shape
    gen = torch.Generator().manual_seed(seed + 1)
    snap = np.zeros(p)
    start = np.zeros(p)
    for s in range(1, epochs + 1):
        m = inner * (2**s if doubling else 1)
        mu = np.mean([_grad(x, y, snap, j, clip) for j in range(n)], axis=0)
        xt = start.copy()
        iterates = []
        for i in torch.randint(n, (m,), generator=gen).tolist():
            v = _grad(x, y, xt, i, clip) - _grad(x, y, snap, i, clip) + mu
            xt = (xt - eta * v) / (1 + eta * lam)
            iterates.append(xt)
        snap = np.mean(iterates, axis=0)
        start = xt if doubling else snap
    return snap


def _run(algo, ctx):
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    algo.finalize()
    return algo.output()


@pytest.mark.parametrize("clip", [10.0, 0.3])  # 0.3: clipping binds on rows of norm 2
def test_dp_svrg_without_noise_equals_exact_recursion(clip):
    x, y = _data(n=30, p=4, seed=1, scale=2.0)
    out = _run(DPSVRG(epochs=3, inner=25, step_size=0.4, l2=0.1, clip=clip), linear_ctx(x, y, seed=5))
    ref = _reference_svrg(x, y, epochs=3, inner=25, eta=0.4, lam=0.1, clip=clip, doubling=False, seed=5)
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)


def test_dp_svrg_pp_without_noise_equals_exact_recursion():
    x, y = _data(n=25, p=3, seed=2)
    algo = DPSVRGPlusPlus(epochs=3, inner=4, step_size=0.5, l2=0.0)
    ctx = linear_ctx(x, y, seed=7)
    out = _run(algo, ctx)
    ref = _reference_svrg(x, y, epochs=3, inner=4, eta=0.5, lam=0.0, clip=1.0, doubling=True, seed=7)
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ctx.model.weight.detach().numpy().ravel(), ref, rtol=1e-9, atol=1e-12)
    # gradient evaluations: n per snapshot + one per inner step (snapshot gradients are cached)
    assert algo.grad_evals == 3 * 25 + 4 * (2 + 4 + 8)


def test_svrg_without_noise_converges_to_the_optimum():
    x, y = _data(n=200, p=4, seed=3)
    prob = LogisticERM(features=x, labels=y, l2=0.05)
    _, f_star = prob.solve()
    out = _run(DPSVRG(epochs=12, inner=400, step_size=0.5, l2=0.05), linear_ctx(x, y))
    assert prob.objective(out) - f_star < 1e-8


def test_release_sensitivities_on_neighbouring_datasets():
    """One-record difference: norm <= 2C for any record; snapshot clipped sum: moves <= C when one
    (adversarial) record is added (the per-record bounds the inventory declares)."""
    x, y = _data(n=50, p=6, seed=4, scale=3.0)
    rng = np.random.default_rng(0)
    clip = 0.7
    for _ in range(30):
        w, w_snap = rng.normal(size=6) * 4, rng.normal(size=6) * 4
        extra = rng.normal(size=(1, 6)) * 50
        xa, ya = np.vstack([x, extra]), np.append(y, rng.choice([-1.0, 1.0]))
        prob, proba = LogisticERM(features=x, labels=y), LogisticERM(features=xa, labels=ya)
        diffs = proba.per_sample_grads(w, clip=clip) - proba.per_sample_grads(w_snap, clip=clip)
        assert np.linalg.norm(diffs, axis=1).max() <= 2 * clip + 1e-12
        moved = proba.grad_coefficients(w_snap, clip=clip) @ xa - prob.grad_coefficients(w_snap, clip=clip) @ x
        assert np.linalg.norm(moved) <= clip + 1e-12


def test_inventory_counts_and_ratio():
    svrg = DPSVRG(epochs=15, inner=5000)
    inv = svrg.inventory(n=200_000)
    assert [s.count for s in inv.steps] == [75_000, 75_000]
    assert inv.ratios["snapshot"] / inv.ratios["diff"] == pytest.approx(2 * 200_000)
    pp = DPSVRGPlusPlus(epochs=15, inner=10)
    assert pp.total_inner_steps() == 655_340  # sum_{s=1}^{15} 10 * 2^s (Fig. 2's schedule)


@pytest.mark.parametrize("eps, ref", [(0.2, 1.184), (0.5, 0.854), (1.0, 0.675)])
def test_accounting_reference_values(eps, ref):
    """docs/algorithms/erm.md reference: n = 200,000, Tm = 75,000, delta = 1e-3, RDP, equal noise split:
    total sigma / (2G) = 1.184, 0.854, 0.675."""
    from privopt.privacy import calibrate

    cal = calibrate(
        DPSVRG(epochs=15, inner=5000).inventory(n=200_000),
        epsilon=eps,
        delta=1e-3,
        neighbouring="add_remove",
        accountant="rdp",
    )
    sigma1 = cal.noise["diff"] * 2.0  # std of the one-record part, G = C = 1
    sigma2 = cal.noise["snapshot"] / 200_000  # std of the snapshot mean
    assert sigma2 == pytest.approx(sigma1, rel=1e-9)
    assert math.hypot(sigma1, sigma2) / 2.0 == pytest.approx(ref, abs=0.003)


def test_private_epoch_noise_has_declared_std(monkeypatch):
    """The noise added to each inner step has std sqrt((2 C z_diff)^2 + (C z_snap / n)^2)."""
    import privopt.algorithms.svrg as svrg_mod
    from privopt.privacy import PrivacyLedger

    captured = {}
    real = svrg_mod.svrg_inner_loop

    def spy(problem, **kw):
        captured["drift"] = np.array(kw["drift"])
        captured["snap"] = kw["snap_coef"] @ problem.x / problem.n
        return real(problem, **kw)

    monkeypatch.setattr(svrg_mod, "svrg_inner_loop", spy)
    x, y = _data(n=100, p=8, seed=6)
    ledger = PrivacyLedger(delta=1e-5)
    noise = {"diff": 0.3, "snapshot": 50.0}
    algo = DPSVRG(epochs=1, inner=4000, step_size=0.01, clip=0.5)
    algo.setup(linear_ctx(x, y, ledger=ledger, noise=noise))
    algo.step(0)
    resid = captured["drift"] - captured["snap"]
    expect = math.hypot(2 * 0.5 * 0.3, 0.5 * 50.0 / 100)
    assert resid.std() == pytest.approx(expect, rel=0.03)
    assert abs(resid.mean()) < 0.05 * expect
    assert ledger.num_steps == 2 * 4000


def test_private_run_spends_at_most_target():
    from privopt.privacy import PrivacyLedger, calibrate

    x, y = _data(n=400, p=5, seed=8)
    algo = DPSVRG(epochs=2, inner=300, step_size=0.05)
    cal = calibrate(algo.inventory(n=400), epsilon=1.0, delta=1e-4, accountant="rdp")
    ledger = PrivacyLedger(
        delta=1e-4, accountant=cal.accountant, target_epsilon=1.0, planned=algo.inventory(n=400).steps_for(cal.noise)
    )
    _run(algo, linear_ctx(x, y, ledger=ledger, noise=cal.noise))
    assert ledger.num_steps == 2 * 600
    assert 0.95 <= ledger.epsilon() <= 1.0 + 1e-9


@pytest.mark.parametrize("bad", [dict(epochs=0), dict(inner=1.5), dict(step_size=0), dict(snapshot_noise_ratio=-1)])
def test_bad_hyperparameters(bad):
    with pytest.raises(ConfigError):
        DPSVRG(**bad)


def test_state_dict_roundtrip_resumes_identically():
    x, y = _data(n=30, p=3, seed=9)
    a = DPSVRGPlusPlus(epochs=4, inner=3, step_size=0.3)
    ctx_a = linear_ctx(x, y, seed=3)
    full = _run(a, ctx_a)
    b = DPSVRGPlusPlus(epochs=4, inner=3, step_size=0.3)
    ctx_b = linear_ctx(x, y, seed=3)
    b.setup(ctx_b)
    b.step(0)
    b.step(1)
    state, rng_state = json.loads(json.dumps(b.state_dict())), ctx_b.sampler_rng.state_dict()
    c = DPSVRGPlusPlus(epochs=4, inner=3, step_size=0.3)
    ctx_c = linear_ctx(x, y, seed=11)
    c.setup(ctx_c)
    c.load_state_dict(state)
    ctx_c.sampler_rng.load_state_dict(rng_state)
    c.step(2)
    c.step(3)
    np.testing.assert_allclose(c.output(), full, rtol=1e-12)
