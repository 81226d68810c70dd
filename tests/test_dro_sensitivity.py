"""Every noisy query of the DRO algorithms is a sum of per-record terms bounded by its threshold.

For each pre-noise statistic we add one adversarial record (huge input, wrong label: large loss
and gradients) to a batch and check that the statistic moves by at most the per-record bound the
noise is calibrated with (the add/remove-one sensitivity), and that the bound is nearly attained
(so the check has teeth).
"""

import math

import pytest
import torch

from dro_helpers import fresh_model, loss_fn, make_ctx
from privopt.algorithms import get_algorithm

N, D = 60, 4


def setup_algo(name, **kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = (x[:, 0] > 0).long()
    # The adversarial record (index N): far out, mislabelled.
    x = torch.cat([x, 50.0 * torch.ones(1, D)])
    y = torch.cat([y, torch.tensor([0])])
    model = fresh_model()  # nn.Linear(D, 2) under torch.manual_seed(0)
    algo = get_algorithm(name, **kw)
    algo.setup(make_ctx(model, data=(x, y)))  # noise / sampler generators seeded 1 / 2
    return algo, model


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


BATCH = torch.arange(0, N, 2)
WITH = torch.cat([BATCH, torch.tensor([N])])


def check(stat_fn, bound, attained=1.0):
    with_record, without = stat_fn(WITH), stat_fn(BATCH)
    assert with_record.bound == without.bound == pytest.approx(bound)  # the sum carries its declared bound
    moved = float((with_record.value.to(torch.float64) - without.value.to(torch.float64)).norm())
    assert moved <= bound * (1 + 1e-5), (moved, bound)
    assert moved >= 0.3 * attained * bound, (moved, bound)  # the adversarial record is clipped, not tiny


# The weight cap A = 4 (the former default) and the default 1.25; at A = 1.25 an η-term 1 − a_i lies
# in [−0.25, 1], so only a clip below 0.25 is attained by the adversarial record (the check's teeth).
@pytest.mark.parametrize(("clip", "cap"), [(0.05, 4.0), (1.0, 4.0), (0.05, None)])
def test_double_spider_queries(clip, cap):
    kw = {} if cap is None else {"weight_cap": cap}
    algo, model = setup_algo("dp-double-spider", steps=4, lam=0.1, eta_init=0.2, **kw)
    x = flat(model)
    x_prev = -x  # flips the adversarial record's loss between the two points
    check(lambda i: algo.eta_grad_sum(i, x=x, eta=0.2, clip=clip), clip)
    check(lambda i: algo.eta_diff_sum(i, x=x, eta=0.2, x_prev=x_prev, eta_prev=0.9, clip=clip), clip)
    # a_i·Clip(∇ℓ_i, C) with a_i ≤ A (the weight cap): bound A·C, reached by the adversarial record
    # (its loss puts its weight at the cap).
    cap = algo.config.weight_cap
    check(lambda i: algo.x_grad_sum(i, x=x, eta=0.2, clip=clip), cap * clip)
    check(lambda i: algo.x_diff_sum(i, x=x, eta=0.2, x_prev=x_prev, eta_prev=0.9, clip=clip), clip)


@pytest.mark.parametrize("clip", [0.05, 1.0])
def test_recursive_spider_queries(clip):
    # The shift puts the adversarial record at a = (ℓ − c)/λ = −1, where its λ-term −w·a = 1/e is
    # the largest any record can have, its weight w = 1/e and its gradient far above the clip.
    algo, model = setup_algo("dp-recursive-spider", steps=4, lam_init=1.0)
    x = flat(model)
    with torch.no_grad():
        adversarial = min(float(loss_fn(model(algo._ctx.x_train[N:]), algo._ctx.y_train[N:])), algo.config.loss_bound)
    algo._shift = adversarial + 0.7
    x_prev = x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    check(lambda i: algo.v_grad_sum(i, x=x, lam=0.7, clip=clip), clip, attained=math.exp(-1))
    check(lambda i: algo.v_diff_sum(i, x=x, lam=0.7, x_prev=x_prev, lam_prev=1.3, clip=clip), clip, math.exp(-1))
    check(lambda i: algo.u_grad_sum(i, x=x, lam=0.7, clip=clip), clip)
    # the λ-terms at the two points are close (both near 1/e): a small but non-zero difference
    check(lambda i: algo.u_diff_sum(i, x=x, lam=0.7, x_prev=x_prev, lam_prev=1.3, clip=clip), clip, 0.1)
    check(lambda i: algo.s_value_sum(i, x=x, lam=0.7, clip=clip), clip)
    beta = 0.3
    # The STORM s-query: a record's term Clip(h(w)) − (1−β)·Clip(h(w_prev)) is bounded by
    # (2 − β)·C5, the bound the sum carries; here both are clipped (β·C), so check the bound only.
    storm = [
        algo.s_storm_sum(b, x=x, lam=0.7, x_prev=x_prev, lam_prev=1.3, beta=beta, clip=clip) for b in (WITH, BATCH)
    ]
    assert storm[0].bound == pytest.approx((2 - beta) * clip)
    moved = float((storm[0].value - storm[1].value).abs())
    assert 0 < moved <= (2 - beta) * clip


def test_storm_bound_is_attained_by_a_sign_flip():
    # Clip(h(w)) − (1−β)Clip(h(w')) with h(w) clipped to C and h(w') ≈ 0 (the record's loss
    # jumps between the two points) moves the sum by ≈ C, within the declared (2 − β)·C.
    algo, model = setup_algo("dp-recursive-spider", steps=4, lam_init=1.0)
    algo._shift = 5.0
    x = flat(model)
    far = -x  # flipping the linear model flips which class the adversarial record favours
    storm = [algo.s_storm_sum(b, x=x, lam=0.05, x_prev=far, lam_prev=0.05, beta=0.5, clip=1.0) for b in (WITH, BATCH)]
    moved = float((storm[0].value - storm[1].value).abs())
    assert 0.9 <= moved <= 1.5 == storm[0].bound


def test_storm_release_is_declared_with_the_widened_bound():
    # The plan declares the STORM update with (2 − β)·C5 and the s_0 initialisation with C5; a
    # statistic carrying a larger bound than declared is refused before any noise is drawn.
    algo = get_algorithm("dp-recursive-spider", steps=4, q=2, beta=0.25, clip_s=0.6)
    plan = algo.release_plan(N)
    storm = plan.phase("s").query("s").sensitivity
    init = plan.phase("refresh").query("s-init").sensitivity
    assert storm.threshold() * storm.factor == pytest.approx(1.75 * 0.6)
    assert init.threshold() * init.factor == pytest.approx(0.6)


@pytest.mark.parametrize("name", ["dp-sgda", "private-diff"])
def test_primal_dual_queries(name):
    algo, model = setup_algo(name, steps=4, lam=0.5, loss_bound=4.0)
    x = flat(model)
    g = torch.Generator().manual_seed(4)
    r = torch.rand(N + 1, generator=g, dtype=torch.float64) * 5
    r_prev = torch.rand(N + 1, generator=g, dtype=torch.float64) * 5
    x_prev = x + 0.3 * torch.randn(x.shape, generator=g)
    # r_i·Clip(∇ℓ_i, C) with r_i clamped to the weight cap A (4 by default): bound A·C, reached by
    # the adversarial record, whose dual weight is above the cap.
    cap = algo.config.weight_cap
    r[N], r_prev[N] = 2 * cap, 0.0
    check(lambda i: algo.x_grad_sum(i, r=r, clip=0.5, x=x), cap * 0.5)
    check(lambda i: algo.x_diff_sum(i, r=r, r_prev=r_prev, x_prev=x_prev, clip=0.5, x=x), 0.5)
    # The loss vector: one record moves one coordinate, by at most the loss bound.
    check(lambda i: algo.loss_vector_sum(i, x=x), 4.0)


def test_joint_dp_sgd_query():
    algo, _model = setup_algo("dp-sgd-joint", lam=0.1, batch_size=10, eta_init=0.2)
    check(lambda i: algo.joint_grad_sum(i, eta=0.2, clip=0.7), 0.7)


@pytest.mark.parametrize("name", ["dp-sgd", "dp-gd"])
def test_dp_sgd_query_carries_its_clip(name):
    # The engine's ClippedSum is read through its own ``clip`` field by the release.
    from privopt.grads.sums import as_bounded

    algo, model = setup_algo(name, **({"batch_size": 10} if name == "dp-sgd" else {}))
    ctx = algo._ctx

    def stat(i):
        return as_bounded(ctx.engine.clipped_sum(model, loss_fn, ctx.x_train[i], ctx.y_train[i], clip=0.4))

    check(stat, 0.4)


def test_double_spider_correction_is_the_per_record_definition():
    """x-diff (one engine pass per point) equals ``Σ Clip(a_i·Clip(∇ℓ_i(x), C) − a'_i·Clip(∇ℓ_i(x'), C), C_t)``
    built from per-sample gradients, each point with its own η (so swapped points or weights fail)."""
    from privopt.grads import get_engine
    from privopt.grads.engine import clip_factors

    algo, model = setup_algo("dp-double-spider", steps=4, lam=0.1, eta_init=0.2, clip_x=0.3)
    x = flat(model)
    x_prev = x + 0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    xb, yb = algo._ctx.x_train[BATCH], algo._ctx.y_train[BATCH]
    terms = []
    for point, eta in ((x, 0.2), (x_prev, 0.9)):
        losses, g = get_engine("vmap").per_sample_grads(model, loss_fn, xb, yb, params=algo._params(point))
        a = algo.objective.weight_fn(eta)(losses).double().clamp(0, algo.config.weight_cap)
        c = clip_factors(torch.linalg.vector_norm(g.double(), dim=1), 0.3)
        terms.append(g.double() * (a * c).unsqueeze(1))
    h = terms[0] - terms[1]
    want = (h * clip_factors(torch.linalg.vector_norm(h, dim=1), 0.05).unsqueeze(1)).sum(0)
    assert bool((torch.linalg.vector_norm(h, dim=1) > 0.05).any())  # the outer clip binds somewhere
    got = algo.x_diff_sum(BATCH, x=x, eta=0.2, x_prev=x_prev, eta_prev=0.9, clip=0.05)
    assert torch.allclose(got.value.double(), want, rtol=1e-5, atol=1e-7)
    swapped = algo.x_diff_sum(BATCH, x=x, eta=0.9, x_prev=x_prev, eta_prev=0.2, clip=0.05)
    assert not torch.allclose(swapped.value.double(), want, rtol=1e-3, atol=1e-5)
