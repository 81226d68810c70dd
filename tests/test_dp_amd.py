"""DP-AMD: the exact recursion without noise (independent reference), convergence to the constrained
optimum, the release's sensitivity on neighbouring datasets, noise and accounting, resume, bad input."""

import json

import numpy as np
import pytest
import torch

from erm_helpers import linear_ctx, planted_data
from privopt.algorithms.dp_amd import DPAMD
from privopt.algorithms.mirror import get_geometry
from privopt.algorithms.releases import ReleasePlanExceeded
from privopt.errors import ConfigError
from privopt.grads.release import observe_releases
from privopt.objectives.erm import LogisticERM, logistic_loss

SETS = [
    dict(constraint="l1-ball", radius=1.5),
    dict(constraint="l2-ball", radius=0.8),
    dict(constraint="simplex"),
]


def _run(algo, ctx, steps=None):
    algo.setup(ctx)
    for t in range(algo.num_steps() if steps is None else steps):
        algo.step(t)
    algo.finalize()
    return algo.output()


def _clipped_mean_grad(x, y, w, clip):
    """Mean of per-sample clipped logistic gradients by autograd (independent of the closed form)."""
    wt = torch.tensor(w, requires_grad=True)
    out = []
    for i in range(x.shape[0]):
        wt.grad = None
        logistic_loss((torch.from_numpy(x[i : i + 1]) @ wt)[:, None], torch.from_numpy(y[i : i + 1])).sum().backward()
        g = wt.grad.numpy().copy()
        out.append(g * min(1.0, clip / max(np.linalg.norm(g), 1e-300)))
    return np.mean(out, axis=0)


def _reference_amd(x, y, *, iterations, eta, lam, clip, constraint, radius=1.0):
    """The recursion of docs/algorithms/erm.md written out with explicit formulas per set."""
    p = x.shape[1]
    if constraint == "l1-ball":
        kappa, u = radius, np.full(2 * p, 1 / (2 * p))
        primal = lambda u: radius * (u[:p] - u[p:])
    elif constraint == "simplex":
        kappa, u = 1.0, np.full(p, 1 / p)
        primal = lambda u: u
    else:
        kappa, u = 1.0, np.zeros(p)
        primal = lambda u: u

    def project(v):  # bisection on the soft-threshold level / plain scaling
        if constraint == "l2-ball":
            return v * min(1.0, radius / max(np.linalg.norm(v), 1e-300))
        if constraint == "l1-ball" and np.abs(v).sum() <= radius:
            return v
        target, a = (radius, np.abs(v)) if constraint == "l1-ball" else (1.0, v)
        lo, hi = a.min() - target, a.max()
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.maximum(a - mid, 0).sum() > target else (lo, mid)
        out = np.maximum(a - hi, 0)
        return np.sign(v) * out if constraint == "l1-ball" else out

    yk = project(np.zeros(p))
    for k in range(iterations):
        r, alpha = 2 / (k + 2), (k + 2) * eta / (4 * kappa**2)
        xk = r * primal(u) + (1 - r) * yk
        g = _clipped_mean_grad(x, y, xk, clip) + lam * xk
        yk = project(xk - eta * g)
        if constraint == "l2-ball":
            u = project(u - alpha * g)
        else:
            lifted = radius * np.concatenate([g, -g]) if constraint == "l1-ball" else g
            u = u * np.exp(-alpha * lifted)
            u /= u.sum()
    return yk


@pytest.mark.parametrize("kw", SETS)
def test_without_noise_equals_the_reference_recursion(kw):
    x, y = planted_data(n=30, p=4, seed=1, scale=2.0)  # rows of norm 2: clipping at 0.6 binds
    algo = DPAMD(iterations=12, step_size=1.5, l2=0.05, clip=0.6, **kw)
    ctx = linear_ctx(x, y)
    out = _run(algo, ctx)
    ref = _reference_amd(x, y, iterations=12, eta=1.5, lam=0.05, clip=0.6, **kw)
    np.testing.assert_allclose(out, ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ctx.model.weight.detach().numpy().ravel(), ref, rtol=1e-7, atol=1e-9)
    assert algo.passes == pytest.approx(12.0)


@pytest.mark.parametrize("kw", SETS)
def test_without_noise_reaches_the_constrained_optimum(kw):
    x, y = planted_data(n=200, p=6, seed=2)
    prob = LogisticERM(features=x, labels=y)
    geo = DPAMD(**kw).config.geometry(6)
    _, f_star = prob.solve(constraint=geo, tol=1e-11)
    out = _run(DPAMD(iterations=300, step_size=4.0, clip=10.0, **kw), linear_ctx(x, y))
    assert geo.contains(out)
    assert prob.objective(out) - f_star < 1e-6


def test_released_statistic_sensitivity_on_neighbouring_datasets():
    """At the points the algorithm queries, the pre-noise clipped sum moves by at most C when one
    adversarial record is added (add/remove) and by at most 2C when one is replaced."""
    x, y = planted_data(n=40, p=5, seed=3, scale=4.0)
    rng = np.random.default_rng(4)
    clip = 0.7
    algo = DPAMD(iterations=15, step_size=2.0, clip=clip, constraint="l1-ball", radius=3.0)
    algo.setup(linear_ctx(x, y))
    points = []
    for t in range(15):
        points.append(algo.query_point(t))
        algo.step(t)
    assert algo.release_plan(40).phases[0].queries[0].sensitivity.threshold() == clip  # the declared bound
    for w in points:
        extra = rng.normal(size=(1, 5)) * 100
        label = rng.choice([-1.0, 1.0])
        xa, ya = np.vstack([x, extra]), np.append(y, label)
        xr, yr = np.vstack([x[1:], extra]), np.append(y[1:], label)
        sums = {}
        for key, (xs, ys) in {"d": (x, y), "add": (xa, ya), "replace": (xr, yr)}.items():
            other = DPAMD(iterations=15, clip=clip, constraint="l1-ball", radius=3.0)
            other.setup(linear_ctx(xs, ys))
            s = other.gradient_sum(w, clip)
            assert s.bound == clip
            sums[key] = s.value.numpy()
        assert np.linalg.norm(sums["add"] - sums["d"]) <= clip + 1e-12
        assert np.linalg.norm(sums["replace"] - sums["d"]) <= 2 * clip + 1e-12


def test_private_run_noise_and_accounting():
    from privopt.privacy import PrivacyLedger, calibrate

    x, y = planted_data(n=500, p=4, seed=5)
    algo = DPAMD(iterations=40, step_size=2.0, clip=0.5, constraint="l1-ball", radius=2.0)
    cal = calibrate(algo.inventory(n=500), epsilon=1.0, delta=1e-5, accountant="rdp")
    ledger = PrivacyLedger(delta=1e-5, neighbouring="add_remove", accountant=cal.accountant)
    events, exact = [], []
    algo.setup(linear_ctx(x, y, ledger=ledger, noise=cal.noise))
    with observe_releases(events.append):
        for t in range(40):
            exact.append(algo.gradient_sum(algo.query_point(t), 0.5).value.numpy() / 500)
            algo.step(t)
    assert len(events) == 40 and ledger.num_steps == 40
    assert {e.name for e in events} == {"grad"}
    assert all(e.noise_std == pytest.approx(cal.noise["grad"] * 0.5) and e.normalizer == 500 for e in events)
    resid = np.stack([e.value.numpy() for e in events]) - np.stack(exact)
    assert resid.std() == pytest.approx(cal.noise["grad"] * 0.5 / 500, rel=0.25)
    assert 0.98 <= ledger.epsilon() <= 1.0 + 1e-6
    with pytest.raises(ReleasePlanExceeded):
        algo.step(40)


def test_state_dict_roundtrip_resumes_identically():
    x, y = planted_data(n=30, p=3, seed=6)
    kw = dict(iterations=8, step_size=1.0, constraint="l1-ball", radius=2.0)
    full = _run(DPAMD(**kw), linear_ctx(x, y))
    b = DPAMD(**kw)
    b.setup(linear_ctx(x, y))
    for t in range(3):
        b.step(t)
    state = json.loads(json.dumps(b.state_dict()))
    c = DPAMD(**kw)
    c.setup(linear_ctx(x, y))
    c.load_state_dict(state)
    for t in range(3, 8):
        c.step(t)
    np.testing.assert_allclose(c.output(), full, rtol=1e-12)


def test_starts_inside_the_set_from_any_model_weight():
    x, y = planted_data(n=20, p=3, seed=7)
    ctx = linear_ctx(x, y)
    with torch.no_grad():
        ctx.model.weight.copy_(torch.tensor([[5.0, -4.0, 1.0]], dtype=torch.float64))
    algo = DPAMD(iterations=1, constraint="l1-ball", radius=1.0)
    algo.setup(ctx)
    assert get_geometry("l1-ball", dim=3, radius=1.0).contains(algo.output())


@pytest.mark.parametrize(
    "bad",
    [
        dict(iterations=0),
        dict(step_size=0.0),
        dict(constraint="none"),
        dict(constraint="box"),
        dict(constraint="simplex", radius=2.0),
        dict(radius=-1.0),
        dict(clip=0.0),
    ],
)
def test_bad_hyperparameters_are_named(bad):
    with pytest.raises(ConfigError):
        DPAMD(**bad)
