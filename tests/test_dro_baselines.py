"""The primal–dual baselines (DP-SGDA, PrivateDiff): capped dual, capped-weight x-query, reduction."""

import pytest
import torch

from dro_helpers import BIG, N, flat_grad_of, fresh_model, loss_fn, make_ctx
from privopt.algorithms import get_algorithm
from privopt.algorithms.dro_primal_dual import project_capped_mean_one, project_mean_one


def _feasible(r, cap):
    return float(r.min()) >= 0 and float(r.max()) <= cap + 1e-12 and float(r.mean()) == pytest.approx(1.0)


@pytest.mark.parametrize("cap", [1.5, 3.0])
def test_capped_projection_is_the_euclidean_projection(cap):
    g = torch.Generator().manual_seed(0)
    r = torch.randn(40, generator=g, dtype=torch.float64) * 4
    p = project_capped_mean_one(r, cap)
    assert _feasible(p, cap) and float(p.max()) == pytest.approx(cap)  # the cap binds for this r
    for _ in range(30):  # no feasible point is closer
        other = project_capped_mean_one(torch.randn(40, generator=g, dtype=torch.float64) * 4, cap)
        assert _feasible(other, cap)
        assert float((r - p).norm()) <= float((r - other).norm()) + 1e-9


def test_capped_projection_without_a_binding_cap_is_the_simplex_projection():
    r = torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(project_capped_mean_one(r, 10.0), project_mean_one(r))
    torch.testing.assert_close(project_capped_mean_one(r, float("inf")), project_mean_one(r))


@pytest.mark.parametrize("name", ["dp-sgda", "private-diff"])
def test_x_query_weights_each_clipped_gradient_by_its_capped_dual_weight(name):
    # Σ_i min(r_i, A)·Clip(∇ℓ_i, C) against a per-record autograd loop; chunk_size 7 < batch makes
    # the batch span several chunks (the dual weights must stay aligned with their records).
    algo = get_algorithm(name, steps=2, weight_cap=2.5, chunk_size=7)
    model = fresh_model()
    algo.setup(make_ctx(model))
    x, y = algo._ctx.x_train, algo._ctx.y_train
    r = torch.linspace(0.0, 4.0, N, dtype=torch.float64)
    idx = torch.arange(3, 40, 2)
    clip = 0.2
    want = torch.zeros_like(flat_grad_of(model, lambda m: loss_fn(m(x[:1]), y[:1]).sum()))
    for i in idx.tolist():
        g = flat_grad_of(model, lambda m, i=i: loss_fn(m(x[i : i + 1]), y[i : i + 1]).sum())
        want += min(float(r[i]), 2.5) * g * min(1.0, clip / float(g.norm()))
    got = algo.x_grad_sum(idx, r=r, clip=clip)
    assert got.bound == pytest.approx(2.5 * clip)
    torch.testing.assert_close(got.value.to(torch.float32), want, rtol=1e-4, atol=1e-5)


def test_dual_iterate_stays_in_the_capped_set():
    algo = get_algorithm("dp-sgda", steps=6, batch_size=20, weight_cap=1.5, dual_lr=5.0)
    algo.setup(make_ctx(fresh_model(), noise={"x-grad": 1.0, "p-grad": 1.0}))
    for t in range(algo.num_steps()):
        algo.step(t)
        assert _feasible(algo.dual_weights, 1.5)


def test_private_diff_refreshing_every_step_is_dp_sgda():
    # PrivateDiff's SPIDER estimator with phase q = 1 refreshes at every step on a batch of
    # refresh_batch records, which is DP-SGDA's minibatch gradient: the same seeds give the same run.
    def final_params(name, **kw):
        model = fresh_model()
        algo = get_algorithm(name, steps=5, lam=1.0, lr=0.3, dual_lr=0.05, **kw)
        names = algo.inventory(n=N).names
        algo.setup(make_ctx(model, noise=dict.fromkeys(names, 0.8)))
        for t in range(algo.num_steps()):
            algo.step(t)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), algo.dual_weights

    x_sgda, r_sgda = final_params("dp-sgda", batch_size=20)
    x_pd, r_pd = final_params("private-diff", q=1, refresh_batch=20, batch_size=20)
    torch.testing.assert_close(x_pd, x_sgda)
    torch.testing.assert_close(r_pd, r_sgda)
    x_pd2, _ = final_params("private-diff", q=2, refresh_batch=20, batch_size=20)
    assert not torch.allclose(x_pd2, x_sgda)  # with corrections it is a different algorithm


def test_private_diff_corrections_track_the_exact_weighted_gradient():
    # Full batches, no noise, thresholds that never bind: each SPIDER correction adds exactly the
    # change of the full-data weighted gradient, so the estimate v_t (read off the step x_t − lr·v_t)
    # equals mean_i min(r_i, A)·∇ℓ_i(x_t) at the current dual r_t at every step, refresh or correction.
    lr = 0.3
    algo = get_algorithm(
        "private-diff",
        steps=7,
        q=4,
        refresh_batch=N,
        batch_size=N,
        lam=1.0,
        lr=lr,
        dual_lr=0.5,
        clip_x=BIG,
        gamma_x=BIG,
        clip_x_diff=None,
        weight_cap=3.0,
    )
    model = fresh_model()
    algo.setup(make_ctx(model))
    params = lambda: torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    all_idx, dual_moves = torch.arange(N), []
    for t in range(algo.num_steps()):
        x_t, r_t = params(), algo.dual_weights.clone()
        want = algo.x_grad_sum(all_idx, r=r_t, clip=BIG).value / N
        algo.step(t)
        torch.testing.assert_close((x_t - params()) / lr, want.to(torch.float32), rtol=1e-4, atol=1e-6)
        dual_moves.append(float((algo.dual_weights - r_t).abs().max()))
    assert min(dual_moves) > 1e-3  # the corrections had a moving dual weight to track, not only a moving x
