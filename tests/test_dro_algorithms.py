"""Paper A DRO algorithms: noise-free estimators, inventories vs ledgers, descent, state, output."""

import math

import pytest
import torch
from torch import nn

from privopt.algorithms import get_algorithm
from privopt.algorithms.base import RunContext
from privopt.algorithms.dro_baselines import project_mean_one
from privopt.errors import ConfigError
from privopt.grads import get_engine
from privopt.objectives.compositional import KLCompositional
from privopt.objectives.dual import DualObjective
from privopt.privacy import PrivacyLedger

N, D = 120, 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models: intra-op threads only add contention (x100 slower on a loaded 2-core box).
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


BIG = 1e9  # clip thresholds that never bind


def loss_fn(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def make_data(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    y = ((x[:, 0] + 0.7 * torch.randn(n, generator=g)) > 0.3).long()
    return x, y


def make_ctx(model, *, ledger=None, noise=None, seed=0, data=None):
    x, y = data if data is not None else make_data()
    return RunContext(
        model=model,
        loss_fn=loss_fn,
        x_train=x,
        y_train=y,
        engine=get_engine("vmap"),
        ledger=ledger,
        noise=noise or {},
        noise_rng=torch.Generator().manual_seed(seed + 1),
        sampler_rng=torch.Generator().manual_seed(seed + 2),
    )


def fresh_model(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(D, 2)


def flat_grad_of(model, scalar_fn):
    """Autograd gradient of scalar_fn(model) w.r.t. the model's parameters, flat."""
    model.zero_grad()
    val = scalar_fn(model)
    grads = torch.autograd.grad(val, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


# ---------------------------------------------------------------------------- DP Double-SPIDER


def exact_dual_grads(model, x, y, eta, lam):
    """Full-data (∇_x L, ∇_η L) by autograd of the dual VALUE (independent of the weights path)."""
    obj = DualObjective(divergence="kl", lam=lam, a_max=None)
    eta_t = torch.tensor(eta, dtype=torch.float64, requires_grad=True)
    g_eta = torch.autograd.grad(obj.value(loss_fn(model(x), y).detach(), eta_t), eta_t)[0]
    g_x = flat_grad_of(model, lambda m: obj.value(loss_fn(m(x), y), eta).to(torch.float32))
    return g_x, float(g_eta)


def test_double_spider_full_batch_equals_exact_gradients():
    model = fresh_model()
    ctx = make_ctx(model)
    algo = get_algorithm(
        "dp-double-spider",
        lam=0.5,
        steps=10,
        q=4,
        N1=N,
        N2=N,
        N3=N,
        N4=N,
        lr=0.3,
        eta_lr=0.3,
        eta_init=0.5,
        clip_eta=BIG,
        clip_x=BIG,
        gamma_eta=BIG,
        gamma_x=BIG,
    )
    algo.setup(ctx)
    for t in range(10):
        x_t = [p.detach().clone() for p in model.parameters()]
        eta_t = algo.eta
        _, g_exact = exact_dual_grads(model, ctx.x_train, ctx.y_train, eta_t, 0.5)
        algo.step(t)
        est = algo.estimates
        assert est["g"] == pytest.approx(g_exact, rel=1e-5, abs=1e-7)
        # v_t is the x-gradient at (x_t, η_{t+1}) — evaluate at the pre-step parameters.
        probe = fresh_model()
        with torch.no_grad():
            for p, q in zip(probe.parameters(), x_t):
                p.copy_(q)
        v_exact, _ = exact_dual_grads(probe, ctx.x_train, ctx.y_train, algo.eta, 0.5)
        torch.testing.assert_close(est["v"], v_exact, rtol=1e-4, atol=1e-6)
        assert algo.eta == pytest.approx(eta_t - 0.3 * g_exact, rel=1e-5, abs=1e-7)


def per_sample_dual_xgrad(model, x, y, eta, lam):
    obj = DualObjective(divergence="kl", lam=lam, a_max=None)
    return torch.stack(
        [
            flat_grad_of(model, lambda m, i=i: obj.value(loss_fn(m(x[i : i + 1]), y[i : i + 1]), eta).to(torch.float32))
            for i in range(x.shape[0])
        ]
    )


def test_double_spider_minibatch_recursion_is_exact_spider():
    model = fresh_model()
    ctx = make_ctx(model)
    lam, n4 = 0.5, 30
    algo = get_algorithm(
        "dp-double-spider",
        lam=lam,
        steps=3,
        q=8,
        N1=N,
        N2=n4,
        N3=N,
        N4=n4,
        lr=0.3,
        eta_lr=0.3,
        eta_init=0.5,
        clip_eta=BIG,
        clip_x=BIG,
        gamma_eta=BIG,
        gamma_x=BIG,
    )
    algo.setup(ctx)
    algo.step(0)
    for t in (1, 2):
        prev_model = fresh_model()
        prev_model.load_state_dict(model.state_dict())
        v_prev, eta_prev = algo.estimates["v"].clone(), algo._state["eta_prev"]
        eta_t = algo.eta
        # x_{t-1} is stored by the algorithm; rebuild a module holding it.
        old = fresh_model()
        with torch.no_grad():
            flat = algo._state["x_prev"]
            old.weight.copy_(flat[: 2 * D].view(2, D))
            old.bias.copy_(flat[2 * D :])
        algo.step(t)
        idx = algo.last_batches["x"]
        xb, yb = ctx.x_train[idx], ctx.y_train[idx]
        now = per_sample_dual_xgrad(prev_model, xb, yb, algo.eta, lam)  # at (x_t, η_{t+1})
        before = per_sample_dual_xgrad(old, xb, yb, eta_t, lam)  # at (x_{t−1}, η_t)
        expected = v_prev + (now - before).sum(0) / n4
        torch.testing.assert_close(algo.estimates["v"], expected, rtol=1e-4, atol=1e-6)
        assert eta_prev is not None


# ---------------------------------------------------------------------------- DP Recursive-SPIDER


def exact_inner(model, x, y, lam, c):
    """Full-data (∇_x h2, ∂_λ h2, h2) for h = exp((ℓ − c)/λ) by autograd."""
    lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    losses = loss_fn(model(x), y).detach().to(torch.float64)
    h2 = torch.exp((losses - c) / lam_t).mean()
    du = torch.autograd.grad(h2, lam_t)[0]
    v = flat_grad_of(model, lambda m: torch.exp((loss_fn(m(x), y).to(torch.float64) - c) / lam).mean().float())
    return v, float(du), float(h2.detach())


@pytest.mark.parametrize("name", ["dp-recursive-spider", "scdro"])
def test_recursive_spider_full_batch_equals_exact_inner_means(name):
    model = fresh_model()
    ctx = make_ctx(model)
    kw = dict(steps=8, q=3, b1=N, b2=N, b3=N, b4=N, s_batch=N, lr=0.05, beta=0.5, shift=3.0, loss_bound=10.0)
    if name == "dp-recursive-spider":
        kw.update(clip_v=BIG, clip_u=BIG, clip_s=BIG, gamma_v=BIG, gamma_u=BIG)
    algo = get_algorithm(name, **kw)
    algo.setup(ctx)
    for t in range(8):
        lam_t = algo.lam
        v, u, h2 = exact_inner(model, ctx.x_train, ctx.y_train, lam_t, 3.0)
        algo.step(t)
        est = algo.estimates
        torch.testing.assert_close(est["v"], v, rtol=1e-4, atol=1e-7)
        assert est["u"] == pytest.approx(u, rel=1e-6)
        # STORM with a full batch and an exact s_0 tracks h2 exactly.
        assert est["s"] == pytest.approx(h2, rel=1e-6)


# ---------------------------------------------------------------------------- inventories vs ledger

SHORT = {
    "dp-double-spider": dict(steps=11, q=4, N1=60, N2=20, N3=60, N4=20, lam=1.0, eta_init=0.5),
    "dp-double-spider-unshared": dict(steps=11, q=4, N1=N, N2=20, N3=60, N4=25, lam=1.0, eta_init=0.5),
    "dp-recursive-spider": dict(steps=11, q=4, b1=60, b2=20, b3=60, b4=20, s_batch=2, lr=0.01),
    "dp-recursive-spider-unshared": dict(steps=9, q=4, b1=N, b2=20, b3=60, b4=30, s_batch=1, lr=0.01),
    "dp-sgda": dict(steps=7, batch_size=20, lam=1.0),
    "private-diff": dict(steps=9, q=4, refresh_batch=60, batch_size=20, lam=1.0),
    "dp-sgd-joint": dict(epochs=1, batch_size=20, lam=1.0),
}


@pytest.mark.parametrize("key", sorted(SHORT))
def test_inventory_counts_equal_ledger_counts(key):
    name = key.replace("-unshared", "")
    algo = get_algorithm(name, **SHORT[key])
    inv = algo.inventory(n=N)
    noise = dict.fromkeys(inv.names, 1.3)
    ledger = PrivacyLedger(delta=1e-5)
    ctx = make_ctx(fresh_model(), ledger=ledger, noise=noise)
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    assert ledger.counts == inv.steps_for(noise)
    if key.endswith("unshared"):
        assert len(inv.steps) >= 4  # families on different batch sizes are separate steps


def test_zero_move_skips_the_correction():
    model = fresh_model()
    ledger = PrivacyLedger(delta=1e-5)
    algo = get_algorithm("dp-double-spider", steps=4, q=4, N1=60, N2=20, N3=60, N4=20, lam=1.0, eta_init=0.5)
    inv = algo.inventory(n=N)
    noise = dict.fromkeys(inv.names, 1.0)
    algo.setup(make_ctx(model, ledger=ledger, noise=noise))
    algo.step(0)
    # Undo the move: x_t = x_{t−1} and η_t = η_{t−1} → the η-difference has distance 0.
    algo._set_x(algo._state["x_prev"])
    algo._state["eta"] = algo._state["eta_prev"]
    algo._state["g"] = 0.0  # then η_{t+1} = η_t, so the x-difference is skipped too
    before = ledger.num_steps
    algo.step(1)
    assert ledger.num_steps == before


# ---------------------------------------------------------------------------- descent (non-private)


def dual_value(model, x, y, lam):
    with torch.no_grad():
        return DualObjective(divergence="kl", lam=lam, a_max=None).psi_value(loss_fn(model(x), y))


def kl_value(model, x, y):
    with torch.no_grad():
        return KLCompositional(rho=0.5, lam0=1e-3, loss_bound=10.0).psi_kl(loss_fn(model(x), y))


DESCENT = {
    "dp-double-spider": (
        dict(
            steps=30,
            q=5,
            N1=N,
            N2=40,
            N3=N,
            N4=40,
            lam=1.0,
            lr=0.5,
            eta_lr=0.5,
            eta_init=0.7,
            clip_eta=BIG,
            clip_x=BIG,
            gamma_eta=BIG,
            gamma_x=BIG,
        ),
        "dual",
    ),
    "dp-recursive-spider": (
        dict(
            steps=30,
            q=5,
            b1=N,
            b2=60,
            b3=N,
            b4=60,
            s_batch=60,
            lr=0.05,
            shift=3.0,
            loss_bound=10.0,
            clip_v=BIG,
            clip_u=BIG,
            clip_s=BIG,
            gamma_v=BIG,
            gamma_u=BIG,
        ),
        "kl",
    ),
    "scdro": (dict(steps=30, q=5, b1=N, b2=60, b3=N, b4=60, s_batch=60, lr=0.05, shift=3.0, loss_bound=10.0), "kl"),
    "dp-sgda": (dict(steps=30, batch_size=40, lam=1.0, lr=0.5, dual_lr=0.05, clip_x=BIG), "dual"),
    "private-diff": (
        dict(steps=30, q=5, refresh_batch=N, batch_size=40, lam=1.0, lr=0.5, dual_lr=0.05, clip_x=BIG, gamma_x=BIG),
        "dual",
    ),
    "dp-sgd-joint": (dict(epochs=10, batch_size=40, lam=1.0, lr=0.5, eta_lr=0.5, eta_init=0.7, clip=BIG), "dual"),
    "erm": (dict(epochs=10, batch_size=40, lr=0.5), "dual"),
}


@pytest.mark.parametrize("name", sorted(DESCENT))
def test_each_algorithm_decreases_its_dro_objective_without_noise(name):
    kw, kind = DESCENT[name]
    model = fresh_model()
    ctx = make_ctx(model)
    x, y = ctx.x_train, ctx.y_train
    value = (lambda: kl_value(model, x, y)) if kind == "kl" else (lambda: dual_value(model, x, y, 1.0))
    start = value()
    algo = get_algorithm(name, **kw)
    if hasattr(algo, "output"):
        algo.output = "last"
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    algo.finalize()
    end = value()
    assert math.isfinite(end) and end < start - 0.02, (name, start, end)


# ---------------------------------------------------------------------------- output, state, config


def test_random_output_iterate_is_loaded_by_finalize():
    model = fresh_model()
    algo = get_algorithm("dp-double-spider", steps=12, q=4, N1=N, N2=30, N3=N, N4=30, lam=1.0, eta_init=0.5)
    algo.setup(make_ctx(model))
    iterates = []
    for t in range(12):
        algo.step(t)
        iterates.append((torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone(), algo.eta))
    tau = algo._tau
    assert 1 <= tau <= 12
    algo.finalize()
    final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(final, iterates[tau - 1][0])
    assert algo.eta == pytest.approx(iterates[tau - 1][1])


@pytest.mark.parametrize(
    "name,kw",
    [
        ("dp-double-spider", dict(steps=8, q=3, N1=60, N2=20, N3=60, N4=20, lam=1.0, eta_init=0.5)),
        ("dp-recursive-spider", dict(steps=8, q=3, b1=60, b2=20, b3=60, b4=20, s_batch=5, lr=0.01)),
        ("private-diff", dict(steps=8, q=3, refresh_batch=60, batch_size=20, lam=1.0)),
    ],
)
def test_state_dict_resume_reproduces_the_run(name, kw):
    noise = dict.fromkeys(get_algorithm(name, **kw).inventory(n=N).names, 2.0)

    def run(split):
        model = fresh_model()
        ctx = make_ctx(model, ledger=PrivacyLedger(delta=1e-5), noise=noise)
        algo = get_algorithm(name, **kw)
        algo.setup(ctx)
        for t in range(split):
            algo.step(t)
        if split < 8:  # "restart": new algorithm and module, restore everything
            state = algo.state_dict()
            rng = (ctx.noise_rng.state_dict(), ctx.sampler_rng.state_dict())
            model2 = fresh_model(seed=5)
            model2.load_state_dict(model.state_dict())
            ctx2 = make_ctx(model2, ledger=ctx.ledger, noise=noise)
            algo = get_algorithm(name, **kw)
            algo.setup(ctx2)
            algo.load_state_dict(state)
            ctx2.noise_rng.load_state_dict(rng[0])
            ctx2.sampler_rng.load_state_dict(rng[1])
            model = model2
            for t in range(split, 8):
                algo.step(t)
        algo.finalize()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    torch.testing.assert_close(run(8), run(3))


def test_bad_hyperparameters_fail_clearly():
    with pytest.raises(ConfigError, match="q"):
        get_algorithm("dp-double-spider", q=0)
    with pytest.raises(ConfigError, match="clip_eta_diff"):
        get_algorithm("dp-double-spider", gamma_eta=None)
    with pytest.raises(ConfigError, match="lam_init"):
        get_algorithm("dp-recursive-spider", lam0=0.1, lam_init=0.01)
    with pytest.raises(ConfigError, match="beta"):
        get_algorithm("dp-recursive-spider", beta=0.0)
    with pytest.raises(ConfigError, match="bounded domain"):
        get_algorithm("dp-sgda", divergence="cvar", divergence_params={"alpha": 0.2})
    with pytest.raises(ConfigError, match="divergence"):
        get_algorithm("dp-double-spider", divergence="nope")


def test_epochs_determine_the_number_of_steps():
    algo = get_algorithm("dp-double-spider", epochs=10, q=32, N1=2048, N2=128, N3=2048, N4=128)
    # A phase costs 2048 + 2·31·128 = 9984 per-sample gradients.
    assert algo._T_for(25_500) == round(10 * 25_500 * 32 / 9984)
    capped = get_algorithm("dp-double-spider", epochs=1, q=4, N1=2048, N2=10, N3=2048, N4=10)
    assert capped._T_for(100) == round(100 * 4 / (100 + 2 * 3 * 10))  # refresh capped at n
    assert capped.inventory(n=100).steps[0].sampling.kind == "full"


def test_project_mean_one_is_the_euclidean_projection():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(50, generator=g, dtype=torch.float64) * 3
    p = project_mean_one(r)
    assert float(p.min()) >= 0 and float(p.mean()) == pytest.approx(1.0)
    # Optimality (KKT): no feasible direction improves; compare against random feasible points.
    for _ in range(20):
        other = project_mean_one(torch.randn(50, generator=g, dtype=torch.float64))
        assert float((r - p).norm()) <= float((r - other).norm()) + 1e-12


# ---------------------------------------------------------------------------- robustness safeguards


def test_double_spider_default_eta_starts_at_the_uniform_prediction_loss():
    algo = get_algorithm("dp-double-spider", steps=2, q=2, N1=N, N2=20, N3=N, N4=20, lam=0.5)
    algo.setup(make_ctx(fresh_model()))
    assert algo.eta == pytest.approx(math.log(2))  # two outputs: log K, data-independent


def test_double_spider_caps_eta_and_x_moves():
    # Tiny clips and big steps: every η move is capped at eta_lr·clip_eta, η stays in [−B, B] and
    # every x move at lr·clip_x (the default normalised step), whatever the noise does.
    model = fresh_model()
    kw = dict(
        steps=12,
        q=4,
        N1=60,
        N2=20,
        N3=60,
        N4=20,
        lam=0.2,
        lr=5.0,
        eta_lr=3.0,
        clip_eta=0.1,
        clip_x=0.05,
        loss_bound=2.0,
    )
    algo = get_algorithm("dp-double-spider", **kw)
    inv = algo.inventory(n=N)
    noise = dict.fromkeys(inv.names, 5.0)
    algo.setup(make_ctx(model, ledger=PrivacyLedger(delta=1e-5), noise=noise))
    for t in range(12):
        x0, eta0 = algo._x(), algo.eta
        algo.step(t)
        assert abs(algo.eta - eta0) <= 3.0 * 0.1 + 1e-9
        assert -2.0 <= algo.eta <= 2.0
        assert float((algo._x() - x0).norm()) <= 5.0 * 0.05 * (1 + 1e-5)
    # The constant-step option is still available.
    assert get_algorithm("dp-double-spider", lr_norm=None)._beta(1e6) == pytest.approx(0.1)


def test_recursive_spider_adaptive_shift_keeps_the_estimators_exact():
    # Full batches, no clipping: after every re-centring of c, v/u/s equal the exact inner means
    # at the shift in use (the rescaling of s is exact post-processing).
    model = fresh_model()
    ctx = make_ctx(model)
    algo = get_algorithm(
        "dp-recursive-spider",
        steps=9,
        q=3,
        b1=N,
        b2=N,
        b3=N,
        b4=N,
        s_batch=N,
        lr=0.05,
        beta=0.5,
        loss_bound=10.0,
        clip_v=BIG,
        clip_u=BIG,
        clip_s=BIG,
        gamma_v=BIG,
        gamma_u=BIG,
    )
    algo.setup(ctx)
    assert algo.current_shift == pytest.approx(math.log(2))
    shifts = set()
    for t in range(9):
        before = fresh_model()
        before.load_state_dict(model.state_dict())
        lam_t = algo.lam
        algo.step(t)
        c = algo.current_shift
        shifts.add(round(c, 9))
        v, u, h2 = exact_inner(before, ctx.x_train, ctx.y_train, lam_t, c)
        est = algo.estimates
        torch.testing.assert_close(est["v"], v, rtol=1e-4, atol=1e-7)
        assert est["u"] == pytest.approx(u, rel=1e-5)
        assert est["s"] == pytest.approx(h2, rel=1e-6)
        if t % 3 == 0 and t > 0:  # re-centred at this refresh: s ≈ e^{−shift_offset}
            assert h2 == pytest.approx(math.exp(-1.0), rel=0.5)
    assert len(shifts) >= 3  # c really moved


def test_recursive_spider_lambda_trust_region():
    model = fresh_model()
    kw = dict(steps=12, q=4, b1=60, b2=20, b3=60, b4=20, lr=50.0, rho=0.5, loss_bound=4.0)
    algo = get_algorithm("dp-recursive-spider", **kw)
    noise = dict.fromkeys(algo.inventory(n=N).names, 3.0)
    algo.setup(make_ctx(model, ledger=PrivacyLedger(delta=1e-5), noise=noise))
    lam_max = 4.0 / math.sqrt(8 * 0.5)
    for t in range(12):
        lam0 = algo.lam
        algo.step(t)
        assert 1e-3 <= algo.lam <= lam_max + 1e-12
        assert abs(algo.lam - lam0) <= 0.5 * lam0 + 1e-12
        assert math.isfinite(float(model.weight.detach().sum()))


def test_recursive_spider_default_s_batch_is_the_correction_batch():
    algo = get_algorithm("dp-recursive-spider", steps=10, q=5, b1=60, b2=25, b3=60, b4=25)
    assert algo.s_batch == 25
    rates = {s.mechanisms: s.sampling for s in algo.inventory(n=N).steps}
    assert rates[(("s", 1.0),)].rate == pytest.approx(25 / N)


@pytest.mark.parametrize("name", ["dp-double-spider", "dp-recursive-spider", "dp-sgda", "private-diff"])
def test_private_false_runs_the_same_updates_without_noise_or_events(name):
    # The documented noise-free reference mode: no inventory, nothing recorded, deterministic given
    # the sampler seed, while the class itself stays private (the harness treats it as DP).
    kw = (
        dict(steps=6, q=3, batch_size=20, refresh_batch=60)
        if name == "private-diff"
        else (dict(steps=6, batch_size=20) if name == "dp-sgda" else dict(steps=6, q=3))
    )
    algo = get_algorithm(name, private=False, **kw)
    assert algo.private is False and type(algo).private is True
    assert algo.inventory(n=N) is None
    ledger = PrivacyLedger(delta=1e-5)
    finals = []
    for _ in range(2):
        model = fresh_model()
        a = get_algorithm(name, private=False, **kw)
        a.setup(make_ctx(model, ledger=ledger, noise={}))
        for t in range(6):
            a.step(t)
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(finals[0], finals[1])
    assert not ledger.counts  # nothing was recorded


def test_recursive_spider_x_step_is_capped_and_lambda_gradient_projected():
    # ‖x_{t+1} − x_t‖ ≤ lr·x_step_cap, and the λ move never exceeds lam_lr·max(ρ, log n − ρ),
    # the range of the true ∂_λΨ = ρ − KL(π‖uniform), even with large noise.
    model = fresh_model()
    kw = dict(
        steps=12, q=4, b1=60, b2=20, b3=60, b4=20, lr=0.3, lam_lr=0.01, x_step_cap=0.5, rho=0.5, lam_step_frac=None
    )
    algo = get_algorithm("dp-recursive-spider", **kw)
    noise = dict.fromkeys(algo.inventory(n=N).names, 5.0)
    algo.setup(make_ctx(model, ledger=PrivacyLedger(delta=1e-5), noise=noise))
    for t in range(12):
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
        lam0 = algo.lam
        logs = algo.step(t)
        x1 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert float((x1 - x0).norm()) <= 0.3 * 0.5 + 1e-6
        assert 0.5 - math.log(N) - 1e-12 <= logs["z_lam"] <= 0.5 + 1e-12
        assert abs(algo.lam - lam0) <= 0.01 * max(0.5, math.log(N) - 0.5) + 1e-12


@pytest.mark.parametrize("exp_cap", [None, 20.0])
def test_recursive_spider_exp_cap_keeps_queries_finite(exp_cap):
    """Regression (mnist-st failures): small λ and a shift far below the losses gave weights
    h/λ ≈ 1e34+ that overflow float32 per-sample gradients (inf norms → nan sums, then s = nan).
    The default exponent cap keeps those samples finite; without it the engines now drop the
    samples whose norms are not finite. Either way every pre-noise statistic stays finite."""
    model = fresh_model()
    with torch.no_grad():
        model.weight.mul_(50.0)  # confident, often wrong predictions: losses up to the bound
    algo = get_algorithm("dp-recursive-spider", steps=4, q=2, b1=N, b2=N, b3=N, b4=N, exp_cap=exp_cap)
    algo.setup(make_ctx(model))
    algo._state["c"] = 0.0
    idx = torch.arange(N)
    x_prev = algo._x() * 0.9
    stats = [
        algo.v_grad_sum(idx, x=None, lam=0.05, clip=1.0),
        algo.v_diff_sum(idx, x=None, lam=0.05, x_prev=x_prev, lam_prev=0.1, clip=1.0),
        algo.u_diff_sum(idx, x=None, lam=0.05, x_prev=x_prev, lam_prev=0.1, clip=1.0),
        algo.s_storm_sum(idx, x=None, lam=0.05, x_prev=x_prev, lam_prev=0.1, beta=0.5, clip=1.0),
    ]
    assert all(bool(torch.isfinite(s).all()) for s in stats)
    assert all(float(s.norm()) <= N * 1.5 + 1e-6 for s in stats)  # per-record clipping: at most n·C


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_joint_grad_sum_equals_materialised_joint_clipping(engine):
    """dp-sgd-joint clips (a_i·∇ℓ_i, ∇_η L_i) as ONE vector; the two-pass engine form must equal it."""
    from privopt.algorithms.dro_baselines import DPSGDJoint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 2))
    algo = DPSGDJoint(lam=0.5, batch_size=20, clip=0.3, chunk_size=7)
    ctx = make_ctx(model)
    ctx.engine = get_engine(engine)
    algo.setup(ctx)
    idx = torch.arange(30)
    eta = 0.4
    got = algo.joint_grad_sum(idx, eta=eta, clip=0.3)
    obj = DualObjective(divergence="kl", lam=0.5, a_max=algo.exp_cap, loss_bound=algo.loss_bound)
    losses, g = get_engine("vmap").per_sample_grads(model, loss_fn, ctx.x_train[idx], ctx.y_train[idx])
    a, b = obj.x_weights(losses, eta).double(), obj.eta_grads(losses, eta).double()
    joint = torch.cat([g.double() * a[:, None], b[:, None]], dim=1)
    f = torch.clamp(0.3 / joint.norm(dim=1), max=1.0)
    want = (joint * f[:, None]).sum(0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert (f < 1).any()  # the clip binds, so the test can tell the joint rule from others
