"""Sensitivity audit: records that make a per-record value NaN or overflow must still move every
pre-noise statistic by at most its declared per-record bound.

A record with finite but extreme features can make its loss NaN (the logits overflow to ``inf``
and cross-entropy computes ``inf − inf``) or its gradient's norm overflow. ``clamp`` keeps NaN,
and one NaN term makes the whole released sum NaN, which no noise hides: the record's presence
is then released exactly. Each test adds such a record to a batch and checks that the statistic
stays finite and moves by at most its bound (the add/remove-one sensitivity the noise is
calibrated with). See also ``tests/test_dro_sensitivity.py`` (moderate adversarial records).
"""

import math

import numpy as np
import pytest
import torch

from dro_helpers import fresh_model, loss_fn, make_ctx
from privopt.algorithms import get_algorithm
from privopt.grads.sums import clamped_losses, clipped_scalar_difference_sum, clipped_scalar_sum

N, D = 60, 4
BATCH = torch.arange(0, N, 2)
WITH = torch.cat([BATCH, torch.tensor([N])])
F32_MAX = torch.finfo(torch.float32).max


def overflow_record(model) -> torch.Tensor:
    """Finite features whose first logit overflows to +inf: cross-entropy is NaN for every label."""
    x = (F32_MAX * torch.sign(model.weight[0].detach())).reshape(1, -1)
    with torch.no_grad():
        assert bool(torch.isnan(loss_fn(model(x), torch.tensor([1]))).all())  # the premise of every test here
    return x


def dro_algo(name, **kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = (x[:, 0] > 0).long()
    model = fresh_model()
    x, y = torch.cat([x, overflow_record(model)]), torch.cat([y, torch.tensor([1])])
    algo = get_algorithm(name, **kw)
    algo.setup(make_ctx(model, data=(x, y)))
    return algo, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def moved_by(stat_fn, bound) -> float:
    with_record, without = stat_fn(WITH), stat_fn(BATCH)
    assert with_record.bound == pytest.approx(bound)
    moved = float((with_record.value.double() - without.value.double()).norm())
    assert math.isfinite(moved), "a NaN/inf record made the pre-noise statistic non-finite"
    assert moved <= bound * (1 + 1e-6), (moved, bound)
    return moved


def test_scalar_helpers_map_nan_to_a_term_within_the_bound():
    v = torch.tensor([0.5, float("nan"), -3.0, float("inf")])
    assert clipped_scalar_sum(v, 1.0).value.item() == pytest.approx(0.5 - 1.0 + 1.0)
    prev = torch.tensor([float("nan"), 2.0, 0.0, float("nan")])
    d = clipped_scalar_difference_sum(v, prev, clip=1.0, weight_prev=0.5)
    assert d.value.item() == pytest.approx(0.5 - 0.5 - 1.0 + 1.0)
    assert clamped_losses(v, 2.0).tolist() == [0.5, 0.0, 0.0, 2.0]


def test_double_spider_eta_queries_with_a_nan_loss_record():
    algo, x = dro_algo("dp-double-spider", steps=4, lam=0.1, eta_init=0.2, weight_cap=4.0)
    moved_by(lambda i: algo.eta_grad_sum(i, x=x, eta=0.2, clip=0.5), 0.5)
    moved_by(lambda i: algo.eta_diff_sum(i, x=x, eta=0.2, x_prev=-x, eta_prev=0.9, clip=0.5), 0.5)
    moved_by(lambda i: algo.x_grad_sum(i, x=x, eta=0.2, clip=0.5), 4.0 * 0.5)
    moved_by(lambda i: algo.x_diff_sum(i, x=x, eta=0.2, x_prev=-x, eta_prev=0.9, clip=0.5), 0.5)


def test_recursive_spider_scalar_queries_with_a_nan_loss_record():
    algo, x = dro_algo("dp-recursive-spider", steps=4, lam_init=1.0)
    x_prev = x + 0.3
    moved_by(lambda i: algo.u_grad_sum(i, x=x, lam=0.7, clip=0.5), 0.5)
    moved_by(lambda i: algo.u_diff_sum(i, x=x, lam=0.7, x_prev=x_prev, lam_prev=1.3, clip=0.5), 0.5)
    moved_by(lambda i: algo.s_value_sum(i, x=x, lam=0.7, clip=0.5), 0.5)
    storm = lambda i: algo.s_storm_sum(i, x=x, lam=0.7, x_prev=x_prev, lam_prev=1.3, beta=0.25, clip=0.5)
    moved_by(storm, 1.75 * 0.5)
    moved_by(lambda i: algo.v_grad_sum(i, x=x, lam=0.7, clip=0.5), 0.5)


@pytest.mark.parametrize("name", ["dp-sgda", "private-diff"])
def test_primal_dual_loss_vector_with_a_nan_loss_record(name):
    algo, x = dro_algo(name, steps=4, lam=0.5, loss_bound=4.0)
    moved_by(lambda i: algo.loss_vector_sum(i, x=x), 4.0)


def test_joint_dp_sgd_eta_coordinate_with_a_nan_loss_record():
    algo, _ = dro_algo("dp-sgd-joint", lam=0.1, batch_size=10, eta_init=0.2)
    moved_by(lambda i: algo.joint_grad_sum(i, eta=0.2, clip=0.7), 0.7)


def _groups_problem():
    from wg_helpers import make_ctx as wg_ctx
    from wg_helpers import tiny_groups

    data = tiny_groups(n=120, seed=5)
    ctx, _ = wg_ctx(data)
    lin = ctx.model[0]
    with torch.no_grad():  # logreg starts at zero; any non-zero first row lets the record overflow
        lin.weight.copy_(torch.tensor([[0.5, -1.0, 0.25, 2.0], [-0.3, 0.2, 1.0, -0.5]]))
    x_bad = (F32_MAX * torch.sign(lin.weight[0].detach())).reshape(1, -1).to(data.x_train.dtype)
    return data, ctx, x_bad


def test_worst_group_loss_releases_with_a_nan_loss_record():
    """Group loss sums (Laplace, L1 bound B), AGS's report-noisy-max means (one coordinate moves,
    by at most B/min n̂: the monotone case charged as 1/b) and OCO's bandit loss sum (bound B)."""
    from privopt.algorithms.worst_group_common import group_loss_sums
    from wg_helpers import ce

    data, ctx, x_bad = _groups_problem()
    with torch.no_grad():
        assert bool(torch.isnan(ce(ctx.model(x_bad), torch.tensor([1]))).all())
    x, y, g = data.x_train, data.y_train, data.g_train
    xa, ya, ga = torch.cat([x, x_bad]), torch.cat([y, torch.tensor([1])]), torch.cat([g, torch.tensor([2])])
    bound = 1.5
    with_rec = group_loss_sums(ctx.model, ce, xa, ya, ga, num_groups=3, bound=bound).value
    without = group_loss_sums(ctx.model, ce, x, y, g, num_groups=3, bound=bound).value
    diff = with_rec - without
    assert bool(torch.isfinite(diff).all()) and float(diff.abs().sum()) <= bound
    sizes = torch.tensor([40.0, 35.0, 7.5])  # released (noisy) sizes: public normalisers
    means = (with_rec - without) / sizes
    assert int((means != 0).sum()) <= 1 and float(means.abs().max()) <= bound / float(sizes.min())
    algo = get_algorithm("dp-oco-exp3", private=False, batch_size=20, loss_bound=bound)
    from wg_helpers import make_ctx as wg_ctx

    ctx2, _ = wg_ctx(data, x=xa, y=ya, groups=ga)
    ctx2.model.load_state_dict(ctx.model.state_dict())
    algo.setup(ctx2)
    idx = torch.arange(0, 121, 3)
    moved = float(algo._loss_sum(idx).value - algo._loss_sum(idx[idx != 120]).value)
    assert math.isfinite(moved) and abs(moved) <= bound


def test_private_selection_rows_with_non_finite_norms_contribute_nothing():
    from privopt.algorithms.private_selection import _clipped_rows

    rows = torch.tensor([[3.0, 4.0], [F32_MAX, F32_MAX], [float("nan"), 1.0], [0.3, 0.4]])
    s = _clipped_rows(rows, 1.0)
    assert torch.allclose(s.value, torch.tensor([0.6 + 0.3, 0.8 + 0.4]))
    for k in range(rows.shape[0]):
        keep = torch.arange(rows.shape[0]) != k
        assert float((s.value - _clipped_rows(rows[keep], 1.0).value).norm()) <= 1.0 + 1e-6


EXTREME_ROWS = [[1e200, 0.0, 0.0], [-1e200, 1e200, 1e200], [1e160, 1e160, 0.0], [50.0, -50.0, 10.0]]


@pytest.mark.parametrize("extra", EXTREME_ROWS)
@pytest.mark.parametrize("label", [-1.0, 1.0])
def test_erm_gradient_sum_with_an_overflowing_row_norm(extra, label):
    """DP-GD-ERM's and DP-AMD's release (and SVRG's snapshot): ``Σ clip_C(g_i(w))``. A row norm that
    overflows to inf gave ``0·inf = NaN`` for a correctly classified record."""
    from privopt.objectives.erm import LogisticERM

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 3)), np.where(rng.random(20) < 0.5, -1.0, 1.0)
    xa, ya = np.vstack([x, extra]), np.append(y, label)
    for w in (np.array([1.0, -0.5, 0.2]), np.array([-1.0, 0.5, -0.2])):
        full = LogisticERM(features=xa, labels=ya).grad_coefficients(w, clip=0.8) @ xa
        moved = full - LogisticERM(features=x, labels=y).grad_coefficients(w, clip=0.8) @ x
        assert np.all(np.isfinite(full)) and np.linalg.norm(moved) <= 0.8 * (1 + 1e-12)


@pytest.mark.parametrize("extra", EXTREME_ROWS)
@pytest.mark.parametrize("label", [-1.0, 1.0])
def test_svrg_inner_step_one_record_term_is_within_2c(extra, label):
    """The inner loop clips on its own (not through ``grad_coefficients``): one step on the record
    alone, drift 0, step 1, no L2, moves the iterate by its term ``(c_i(x) − c_i(x~))·x_i``."""
    from privopt.algorithms.svrg import svrg_inner_loop
    from privopt.objectives.erm import LogisticERM

    prob = LogisticERM(features=np.array([extra]), labels=np.array([label]))
    clip, w = 0.7, np.array([1e-3, -2e-3, 1e-3])
    worst = 0.0
    for snapshot in (-w, w, np.zeros(3), 1e3 * w, -1e3 * w):
        snap = prob.grad_coefficients(snapshot, clip=clip)
        for start in (w, -w, 1e3 * w, -1e3 * w):
            one = dict(snap_coef=snap, indices=np.array([0]), drift=np.zeros((1, 3)), step_size=1.0, clip=clip)
            x1, _ = svrg_inner_loop(prob, x_start=start, counts=np.array([1]), **one)
            x0, _ = svrg_inner_loop(prob, x_start=start, counts=np.array([0]), **one)
            term = np.linalg.norm(x1 - x0)
            assert math.isfinite(term) and term <= 2 * clip * (1 + 1e-9), term
            worst = max(worst, term)
    # Teeth: the term reaches C. (For the logistic loss both coefficients have the sign of −y, so C
    # is its true maximum; 2C is the generic bound of a difference of two clipped terms.)
    assert worst >= 0.9 * clip, worst
