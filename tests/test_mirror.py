"""Mirror-descent geometry: proximal steps against a numerical argmin, projections against their
optimality conditions, Bregman divergences, strong convexity, and bad input."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from privopt.algorithms.mirror import (
    EntropicL1Ball,
    EntropicSimplex,
    EuclideanBall,
    available_geometries,
    get_geometry,
    project_l1_ball,
    project_simplex,
)
from privopt.errors import ConfigError

GEOMETRIES = [
    ("simplex", {}),
    ("l1-ball", {"radius": 2.5}),
    ("l2-ball", {"radius": 1.5}),
]


def _random_state(geo, rng):
    if isinstance(geo, EuclideanBall):
        return geo.project(rng.normal(size=geo.dim) * geo.radius)
    u = rng.random(geo.state_dim) + 0.05
    return u / u.sum()


def _numerical_prox(geo, state, g, step):
    """argmin over states of step*<g, to_primal(u)> + D(u, state), by SLSQP with the set's constraints."""
    if isinstance(geo, EuclideanBall):
        cons = [{"type": "ineq", "fun": lambda u: geo.radius**2 - u @ u}]
        x0 = geo.start()
    else:
        cons = [{"type": "eq", "fun": lambda u: u.sum() - 1.0}]
        x0 = geo.start()

    def obj(u):
        u_eval = np.maximum(u, 1e-300) if not isinstance(geo, EuclideanBall) else u
        return step * float(g @ geo.to_primal(u_eval)) + geo.bregman(u_eval, state)

    bounds = None if isinstance(geo, EuclideanBall) else [(1e-12, 1.0)] * geo.state_dim
    res = minimize(obj, x0, method="SLSQP", bounds=bounds, constraints=cons, options={"ftol": 1e-14, "maxiter": 500})
    return res.x, res.fun


@pytest.mark.parametrize("name,params", GEOMETRIES)
def test_prox_step_is_the_argmin(name, params):
    rng = np.random.default_rng(0)
    geo = get_geometry(name, dim=4, **params)
    for _ in range(3):
        state = _random_state(geo, rng)
        g = rng.normal(size=geo.dim) * 3.0
        step = float(rng.uniform(0.1, 1.0))
        new = geo.prox_step(state, g, step=step)
        value = step * float(g @ geo.to_primal(new)) + geo.bregman(new, state)
        _, best = _numerical_prox(geo, state, g, step)
        assert value <= best + 1e-7  # closed form is at least as good as the numerical optimum
        assert geo.contains(geo.to_primal(new))


@pytest.mark.parametrize("cls", [EntropicSimplex, EntropicL1Ball])
def test_entropy_step_is_multiplicative_weights(cls):
    rng = np.random.default_rng(1)
    geo = cls(dim=3)
    u = _random_state(geo, rng)
    g = rng.normal(size=3)
    lifted = g if cls is EntropicSimplex else np.concatenate([g, -g])  # radius 1
    expected = u * np.exp(-0.7 * lifted)
    np.testing.assert_allclose(geo.prox_step(u, g, step=0.7), expected / expected.sum(), rtol=1e-12)


def test_entropy_step_is_stable_for_huge_steps():
    geo = EntropicSimplex(dim=3)
    out = geo.prox_step(geo.start(), np.array([1e6, 0.0, 2e6]), step=1e3)
    np.testing.assert_allclose(out, [0.0, 1.0, 0.0], atol=1e-300)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("name,params", GEOMETRIES)
def test_projection_optimality(name, params):
    """P(v) is in the set, idempotent, and satisfies <v - P(v), y - P(v)> <= 0 for every y in the set."""
    rng = np.random.default_rng(2)
    geo = get_geometry(name, dim=5, **params)
    for _ in range(5):
        v = rng.normal(size=5) * 3.0
        p = geo.project(v)
        assert geo.contains(p)
        np.testing.assert_allclose(geo.project(p), p, atol=1e-12)
        for _ in range(20):
            y = geo.to_primal(_random_state(geo, rng))
            assert (v - p) @ (y - p) <= 1e-10


def test_projection_helpers_match_a_numerical_projection():
    rng = np.random.default_rng(3)
    v = rng.normal(size=6) * 2
    for proj, cons in (
        (project_simplex(v, total=1.5), {"type": "eq", "fun": lambda x: x.sum() - 1.5}),
        (project_l1_ball(v, radius=1.5), None),
    ):
        if cons is not None:
            res = minimize(lambda x: ((x - v) ** 2).sum(), np.full(6, 0.25), bounds=[(0, None)] * 6, constraints=[cons])
        else:  # split x = a - b, a, b >= 0, sum(a + b) <= 1.5
            res = minimize(
                lambda ab: ((ab[:6] - ab[6:] - v) ** 2).sum(),
                np.zeros(12),
                bounds=[(0, None)] * 12,
                constraints=[{"type": "ineq", "fun": lambda ab: 1.5 - ab.sum()}],
            )
            res.x = res.x[:6] - res.x[6:]
        np.testing.assert_allclose(proj, res.x, atol=1e-5)
    inside = np.array([0.2, -0.3])
    np.testing.assert_array_equal(project_l1_ball(inside, radius=1.0), inside)


def test_l1_ball_states_and_points():
    rng = np.random.default_rng(4)
    ball = EntropicL1Ball(dim=4, radius=2.0)
    np.testing.assert_allclose(ball.center(), np.zeros(4))
    for x in (np.array([0.5, -0.25, 0.0, 1.0]), np.array([2.0, 0.0, 0.0, 0.0]), rng.normal(size=4) * 5):
        u = ball.from_primal(x)
        assert u.shape == (8,) and u.min() >= 0 and math.isclose(u.sum(), 1.0)
        np.testing.assert_allclose(ball.to_primal(u), ball.project(x), atol=1e-12)


@pytest.mark.parametrize("name,params", GEOMETRIES)
def test_bregman_divergence_properties(name, params):
    rng = np.random.default_rng(5)
    geo = get_geometry(name, dim=4, **params)
    u, v = _random_state(geo, rng), _random_state(geo, rng)
    assert geo.bregman(u, u) == pytest.approx(0.0, abs=1e-12)
    assert geo.bregman(u, v) > 0
    # D(u, v) = w(u) - w(v) - <grad w(v), u - v> for the documented map
    if isinstance(geo, EuclideanBall):
        w, grad_w = (lambda s: 0.5 * s @ s), (lambda s: s)
    else:
        w, grad_w = (lambda s: float(s @ np.log(s))), (lambda s: np.log(s) + 1.0)
    assert geo.bregman(u, v) == pytest.approx(w(u) - w(v) - grad_w(v) @ (u - v), rel=1e-10)
    # strong convexity: D(u, v) >= ||x(u) - x(v)||^2 / 2 in the map's norm, whose dual is dual_norm
    xu, xv = geo.to_primal(u), geo.to_primal(v)
    primal_norm = {"simplex": lambda d: np.abs(d).sum(), "l2-ball": np.linalg.norm}.get(
        name, lambda d: np.abs(d).sum() / params.get("radius", 1.0)
    )
    assert geo.bregman(u, v) >= 0.5 * primal_norm(xu - xv) ** 2 - 1e-12
    g = rng.normal(size=4)
    assert g @ (xu - xv) <= geo.dual_norm(g) * primal_norm(xu - xv) + 1e-12  # the norms are dual


def test_bregman_radius_and_diameter():
    simplex = EntropicSimplex(dim=5)
    vertex = np.eye(5)[2]
    assert (
        simplex.bregman(vertex, simplex.start())
        == pytest.approx(simplex.bregman_radius())
        == pytest.approx(math.log(5))
    )
    assert simplex.diameter() == pytest.approx(np.linalg.norm(np.eye(5)[0] - np.eye(5)[1]))
    ball = EntropicL1Ball(dim=3, radius=2.0)
    assert ball.bregman(ball.from_primal([0.0, -2.0, 0.0]), ball.start()) == pytest.approx(math.log(6))
    assert ball.diameter() == 4.0
    l2 = EuclideanBall(dim=3, radius=2.0)
    assert l2.bregman(l2.project([5.0, 0, 0]), l2.start()) == pytest.approx(l2.bregman_radius()) == 2.0
    assert simplex.bregman(simplex.start(), vertex) == math.inf


@pytest.mark.parametrize("name,params", GEOMETRIES)
def test_mirror_descent_converges_on_a_convex_problem(name, params):
    """Mirror descent with steps 1/sqrt(t) on f(x) = ||x - a||^2 reaches the projection of a."""
    geo = get_geometry(name, dim=3, **params)
    a = np.array([3.0, -0.5, 0.2])
    target = geo.project(a)
    state = geo.start()
    avg = np.zeros(3)
    steps = 4000
    for t in range(steps):
        x = geo.to_primal(state)
        avg += x
        state = geo.prox_step(state, 2.0 * (x - a), step=0.5 / math.sqrt(t + 1))
    avg /= steps
    f = lambda x: float(((x - a) ** 2).sum())
    assert f(avg) - f(target) < 0.05


def test_accepts_torch_tensors_and_lists():
    geo = get_geometry("simplex", dim=2)
    out = geo.prox_step(torch.tensor([0.5, 0.5]), [0.0, 1.0], step=1.0)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert out[0] > out[1]


def test_bad_input_is_refused_clearly():
    assert set(available_geometries()) >= {"simplex", "l1-ball", "l2-ball"}
    with pytest.raises(ConfigError, match="unknown geometry"):
        get_geometry("hypercube", dim=3)
    with pytest.raises(ConfigError, match="bad parameters"):
        get_geometry("simplex", dim=3, radius=2.0)
    with pytest.raises(ConfigError, match="dim"):
        EntropicSimplex(dim=0)
    with pytest.raises(ConfigError, match="radius"):
        EuclideanBall(dim=2, radius=-1.0)
    geo = EntropicSimplex(dim=3)
    with pytest.raises(ConfigError, match="simplex"):
        geo.prox_step(np.array([0.5, 0.6, 0.1]), np.zeros(3), step=1.0)
    with pytest.raises(ConfigError, match="3 entries"):
        geo.prox_step(geo.start(), np.zeros(4), step=1.0)
    with pytest.raises(ConfigError, match="NaN"):
        geo.prox_step(geo.start(), np.array([0.0, np.nan, 0.0]), step=1.0)
    with pytest.raises(ConfigError, match="step"):
        geo.prox_step(geo.start(), np.zeros(3), step=0.0)


@pytest.mark.parametrize("name,params", GEOMETRIES)
def test_linear_minimizer_and_dual_norm_factor(name, params):
    rng = np.random.default_rng(6)
    geo = get_geometry(name, dim=4, **params)
    for _ in range(5):
        g = rng.normal(size=4)
        s = geo.linear_minimizer(g)
        assert geo.contains(s)
        for _ in range(50):
            y = geo.to_primal(_random_state(geo, rng))
            assert g @ s <= g @ y + 1e-12
        assert geo.dual_norm(g) <= geo.dual_norm_factor() * np.linalg.norm(g) + 1e-12
    e = np.eye(4)[1]
    assert geo.dual_norm(e) == pytest.approx(geo.dual_norm_factor())  # the factor is attained
