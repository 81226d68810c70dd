"""Paper A DRO algorithms: the robustness safeguards (post-processing caps, projections, shifts)."""

import math

import pytest
import torch
from torch import nn

from dro_helpers import FULL_RS, NO_CLIP_RS, D, N, fresh_model, loss_fn, make_ctx, started
from privopt.algorithms import get_algorithm
from privopt.grads import get_engine
from privopt.privacy import PrivacyLedger

# ---------------------------------------------------------------------------- robustness safeguards


def test_double_spider_default_eta_starts_at_the_uniform_prediction_loss():
    algo = get_algorithm("dp-double-spider", steps=2, q=2, N1=N, N2=20, N3=N, N4=20, lam=0.5)
    algo.setup(make_ctx(fresh_model()))
    assert algo.eta == pytest.approx(math.log(2))  # two outputs: log K, data-independent


def test_double_spider_caps_eta_and_x_moves():
    # Tiny clips and big steps: every η move is capped at eta_lr·clip_eta, η stays in [−B, B] and
    # every x move at lr (the default normalised step: ‖v‖ is capped at 1), whatever the noise does.
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
        assert float((algo._x() - x0).norm()) <= 5.0 * (1 + 1e-5)
    # The constant-step option is still available.
    assert get_algorithm("dp-double-spider", lr=0.1, lr_norm=None)._beta(1e6) == pytest.approx(0.1)


def test_recursive_spider_shift_recentres_the_mean_weight_at_refreshes():
    # Full batches, no clipping: c starts at log K + λ log A (initial weights near 1/A), moves only
    # at refreshes, and each re-centring brings the mean capped weight s toward 1/A.
    algo_cap = 4.0
    algo2, _, _ = started(
        "dp-recursive-spider", steps=9, q=3, **FULL_RS, lr=0.05, **{**NO_CLIP_RS, "weight_cap": algo_cap}
    )
    assert algo2.current_shift == pytest.approx(math.log(2) + 1.0 * math.log(algo_cap))
    shifts = []
    for t in range(9):
        algo2.step(t)
        shifts.append(algo2.current_shift)
        if t % 3 == 0 and t > 0:  # re-centred at this refresh
            assert algo2.estimates["s"] == pytest.approx(1 / algo_cap, rel=0.5)
    assert shifts[0] == shifts[1] == shifts[2] != shifts[3]  # c moves only at refreshes


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
        assert abs(algo.lam - lam0) <= 0.1 * lam0 + 1e-12  # lam_step_frac
        assert math.isfinite(float(model.weight.detach().sum()))


def test_recursive_spider_default_s_batch_is_the_correction_batch():
    algo = get_algorithm("dp-recursive-spider", steps=10, q=5, b1=60, b2=25, b3=60, b4=25)
    assert algo.s_batch == 25
    rates = {s.mechanisms: s.sampling for s in algo.inventory(n=N).steps}
    assert rates[(("s", 4.0),)].rate == pytest.approx(25 / N)  # scalar queries: noise ratio 4


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
    # ‖x_{t+1} − x_t‖ ≤ lr (normalised step), and the λ move never exceeds lam_lr·max(ρ, log n − ρ),
    # the range of the true ∂_λΨ = ρ − KL(π‖uniform), even with large noise.
    model = fresh_model()
    kw = dict(steps=12, q=4, b1=60, b2=20, b3=60, b4=20, lr=0.3, lam_lr=0.01, rho=0.5, lam_step_frac=None)
    algo = get_algorithm("dp-recursive-spider", **kw)
    noise = dict.fromkeys(algo.inventory(n=N).names, 5.0)
    algo.setup(make_ctx(model, ledger=PrivacyLedger(delta=1e-5), noise=noise))
    for t in range(12):
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
        lam0 = algo.lam
        logs = algo.step(t)
        x1 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert float((x1 - x0).norm()) <= 0.3 + 1e-6
        assert 0.5 - math.log(N) - 1e-12 <= logs["z_lam"] <= 0.5 + 1e-12
        assert abs(algo.lam - lam0) <= 0.01 * max(0.5, math.log(N) - 0.5) + 1e-12


def test_recursive_spider_capped_weights_keep_queries_finite():
    """Regression (mnist-st failures): small λ and a shift far below the losses gave weights
    h/λ ≈ 1e34+ that overflowed float32 per-sample gradients. The capped inner function
    w = min(exp((ℓ − c)/λ), 1) keeps every pre-noise statistic finite and within n·C."""
    model = fresh_model()
    with torch.no_grad():
        model.weight.mul_(50.0)  # confident, often wrong predictions: losses up to the bound
    algo = get_algorithm("dp-recursive-spider", steps=4, q=2, b1=N, b2=N, b3=N, b4=N)
    algo.setup(make_ctx(model))
    algo._shift = 0.0
    idx = torch.arange(N)
    x_prev = algo._x() * 0.9
    stats = [
        algo.v_grad_sum(idx, x=None, lam=0.05, clip=1.0),
        algo.v_diff_sum(idx, x=None, lam=0.05, x_prev=x_prev, lam_prev=0.1, clip=1.0),
        algo.u_diff_sum(idx, x=None, lam=0.05, x_prev=x_prev, lam_prev=0.1, clip=1.0),
        algo.s_storm_sum(idx, x=None, lam=0.05, x_prev=x_prev, lam_prev=0.1, beta=0.5, clip=1.0),
    ]
    for s in stats:
        assert bool(torch.isfinite(s.value).all())
        assert float(s.value.norm()) <= N * 1.5 + 1e-6


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
    assert got.bound == 0.3
    got = got.value
    obj = algo._objective
    losses, g = get_engine("vmap").per_sample_grads(model, loss_fn, ctx.x_train[idx], ctx.y_train[idx])
    a, b = obj.x_weights(losses, eta).double(), obj.eta_grads(losses, eta).double()
    joint = torch.cat([g.double() * a[:, None], b[:, None]], dim=1)
    f = torch.clamp(0.3 / joint.norm(dim=1), max=1.0)
    want = (joint * f[:, None]).sum(0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert (f < 1).any()  # the clip binds, so the test can tell the joint rule from others
