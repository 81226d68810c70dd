"""Minimax Phased ERM: the certified inner solvers, the phase output's sensitivity bound measured by
solving both neighbours, disjoint phases and the run's accounting."""

import math

import pytest
import torch

from privopt.algorithms import get_algorithm
from privopt.algorithms.worst_group_phased import phase_constants
from privopt.algorithms.worst_group_scsc import SaddleObjective, SolverNotCertified, solve_accelerated, solve_ogd
from privopt.errors import ModelError
from privopt.privacy import PrivacyLedger, calibrate
from wg_helpers import make_ctx, tiny_groups

R, RADIUS = 1.0, 2.0
FEAT = math.sqrt(R**2 + 1)
LIP = math.sqrt(2.0) * FEAT
BOUND = math.log1p(math.exp(math.sqrt(2.0) * RADIUS * FEAT))


def problem(x, y, g, *, consts, norm, center=None):
    dim = 2 * (x.shape[1] + 1)
    zero = torch.zeros(dim, dtype=torch.float64)
    return SaddleObjective(
        x, y, g, norm=norm, num_classes=2, mu_w=consts.mu_w, mu_lam=consts.mu_lam,
        center=zero if center is None else center, ball_center=zero, radius=RADIUS,
    )  # fmt: skip


def data(n_per_group=12, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * n_per_group, d, generator=gen, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True).clamp_min(R) * R
    y = torch.randint(0, 2, (2 * n_per_group,), generator=gen)
    g = torch.arange(2).repeat_interleave(n_per_group)
    return x, y, g


def true_gap(obj, w, lam):
    """max_λ F(w, λ) − min_{w'∈W} F(w', λ), the second solved to high accuracy with λ fixed."""
    upper = obj.value(w)
    v = w.clone()
    for _ in range(4000):  # projected gradient on the strongly convex, smooth F(·, λ)
        _ce, resid = obj._per_record(v)
        v = obj.project(v - 0.2 * obj._grad_weighted(v, resid, lam))
    losses = obj.losses(v)
    ent = float((lam * torch.log(lam)).sum())
    lower = float((lam * losses).sum()) + 0.5 * obj.mu_w * float((v - obj.center).pow(2).sum()) - obj.mu_lam * ent
    return upper - lower


@pytest.mark.parametrize("solver", [solve_accelerated, solve_ogd])
def test_inner_solver_certifies_gap_at_most_alpha_and_the_certificate_is_valid(solver):
    x, y, g = data()
    consts = phase_constants(t=1, eta=0.3, n=12, phases=1, lipschitz=LIP, bound=BOUND)
    obj = problem(x, y, g, consts=consts, norm=torch.tensor([12.0, 12.0]))
    target = consts.alpha if solver is solve_accelerated else max(consts.alpha, 1e-3)
    res = solver(obj, torch.zeros(6, dtype=torch.float64), target_gap=target)
    assert res.gap <= target
    lam = torch.softmax(obj.losses(res.w) / obj.mu_lam, dim=0)
    assert true_gap(obj, res.w, lam) <= res.gap + 1e-9  # the certificate never understates the gap


def test_solver_refuses_to_return_an_uncertified_point():
    x, y, g = data()
    consts = phase_constants(t=1, eta=0.3, n=12, phases=1, lipschitz=LIP, bound=BOUND)
    obj = problem(x, y, g, consts=consts, norm=torch.tensor([12.0, 12.0]))
    with pytest.raises(SolverNotCertified, match="nothing was released"):
        solve_ogd(obj, torch.zeros(6, dtype=torch.float64), target_gap=1e-12, max_iters=50, check_every=10)


def _neighbours(x, y, g, k, gen):
    """Replace record k by an adversarial one (norm R, either label), and remove record k."""
    z = torch.randn(1, x.shape[1], generator=gen, dtype=torch.float64)
    xr, yr = x.clone(), y.clone()
    xr[k], yr[k] = (z / z.norm() * R)[0], 1 - y[k]
    keep = torch.arange(len(y)) != k
    return [(xr, yr, g), (x[keep], y[keep], g[keep])]


@pytest.mark.parametrize("eta", [0.05, 0.5, 3.0])
def test_phase_output_moves_at_most_the_declared_sensitivity_between_neighbours(eta):
    # Lemma 3: α_t-saddle points of neighbouring collections are within Δ_t. Measured by solving
    # BOTH neighbours to the phase's target gap (replace-one with an adversarial record, and
    # remove-one, whose fixed-normaliser objective equals replacing the record by a zero loss).
    x, y, g = data(seed=1)
    norm = torch.tensor([12.0, 12.0])
    consts = phase_constants(t=1, eta=eta, n=12, phases=1, lipschitz=LIP, bound=BOUND)
    w0 = torch.zeros(6, dtype=torch.float64)
    base = solve_accelerated(problem(x, y, g, consts=consts, norm=norm), w0, target_gap=consts.alpha).w
    gen, worst = torch.Generator().manual_seed(2), 0.0
    for k in (0, 5, 13, 23):
        for xs, ys, gs in _neighbours(x, y, g, k, gen):
            other = solve_accelerated(problem(xs, ys, gs, consts=consts, norm=norm), w0, target_gap=consts.alpha).w
            worst = max(worst, float((base - other).norm()))
    assert 0 < worst <= consts.sensitivity


def test_phased_erm_uses_disjoint_records_and_accounts_one_release():
    ctx, _ = make_ctx(tiny_groups(n=400, seed=0), model="logreg")
    algo = get_algorithm("minimax-phased-erm", phases=3, eta=0.01, radius=2.0, group_sizes="private")
    inv = algo.inventory(n=ctx.n)
    cal = calibrate(inv, epsilon=2.0, delta=1e-4)
    ctx.noise = dict(cal.noise)
    ctx.ledger = PrivacyLedger(delta=1e-4, target_epsilon=2.0, planned=inv.steps_for(cal.noise))
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    used = algo.releases.state_dict()["used"]["phase-output"]
    assert bool(used.all())  # every record in exactly one phase (the last phase takes the rest)
    assert ctx.ledger.num_steps == 2 and ctx.ledger.epsilon() <= 2.0  # counts + ONE phase release
    assert all(d["gap"] <= d["alpha"] for d in algo.diagnostics)


def test_phased_erm_refuses_a_non_convex_model():
    ctx, _ = make_ctx(tiny_groups(n=50, seed=0), model="mlp")
    with pytest.raises(ModelError, match="convex"):
        get_algorithm("minimax-phased-erm", phases=2).setup(ctx)


def _phase_solution(data, x, y, g, sizes, eta):
    """Phase 1 of a one-phase run on (x, y, g) through the algorithm (feature clip, constants), with the
    released group sizes fixed to ``sizes`` for both neighbours (public once released)."""
    ctx, _ = make_ctx(data, x=x, y=y, groups=g, model="logreg")
    algo = get_algorithm(
        "minimax-phased-erm", phases=1, eta=eta, radius=2.0, feature_norm=1.5, group_sizes="private", private=False
    )
    algo.setup(ctx)
    algo._sizes = sizes.clone()
    consts = algo.constants(1)
    res = algo._solve(algo._phase_data(1), consts, algo._w().double())
    return res.w, consts, algo


@pytest.mark.parametrize("eta", [0.05, 0.5])
def test_phase_output_through_the_algorithm_with_extreme_records_and_unequal_groups(eta):
    """The stability bound Δ_t through the algorithm's own path: its per-record feature clip (records
    far beyond ``feature_norm``, up to float32's largest), its Lipschitz constant and loss bound, and
    unequal groups (Δ_t is governed by the smallest; the record sits there). Replace-one and remove-one."""
    data = tiny_groups(n=200, seed=3, fractions=(0.6, 0.3, 0.1))
    x, y, g = data.x_train, data.y_train, data.g_train
    sizes = torch.bincount(g, minlength=3).to(torch.float64)
    base, consts, _ = _phase_solution(data, x, y, g, sizes, eta)
    assert consts.n_t == float(sizes.min())  # one phase: the smallest group sets the constants
    worst = 0.0
    for k in (int(torch.nonzero(g == 2)[0]), 0):
        for scale in (1.0, 1e6, 3e38):
            xr, yr = x.clone(), y.clone()
            xr[k], yr[k] = scale * torch.tensor([1.0, -1.0, 1.0, 1.0]), 1 - y[k]
            w, _, algo = _phase_solution(data, xr, yr, g, sizes, eta)
            assert float(algo._x[k].norm()) == pytest.approx(1.5, rel=1e-12) or scale == 1.0  # clipped to R
            worst = max(worst, float((base - w).norm()))
        keep = torch.arange(len(y)) != k
        w, _, _ = _phase_solution(data, x[keep], y[keep], g[keep], sizes, eta)
        worst = max(worst, float((base - w).norm()))
    assert 0 < worst <= consts.sensitivity
