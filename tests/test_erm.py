"""Logistic ERM objective (closed-form gradients vs autograd, reference optimum), DP-GD-ERM,
and the Covertype binary loader."""

import numpy as np
import pytest
import torch

from erm_helpers import linear_ctx, planted_data
from privopt.errors import ConfigError, DataError, ModelError
from privopt.objectives.erm import LogisticERM, logistic_loss, minmax_scale, normalize_rows


def _autograd_per_sample(x, y, w):
    """Per-sample gradients of log(1 + exp(-y w^T x)) by torch autograd, one sample at a time."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    out = []
    for i in range(x.shape[0]):
        wt = torch.tensor(w, requires_grad=True)
        logistic_loss((xt[i : i + 1] @ wt)[:, None], yt[i : i + 1]).sum().backward()
        out.append(wt.grad.numpy().copy())
    return np.stack(out)


def test_per_sample_gradients_match_autograd():
    x, y = planted_data()
    w = np.random.default_rng(1).normal(size=x.shape[1]) * 2
    prob = LogisticERM(features=x, labels=y, l2=0.3)
    np.testing.assert_allclose(prob.per_sample_grads(w), _autograd_per_sample(x, y, w), rtol=1e-10, atol=1e-12)


def test_objective_and_full_gradient_match_autograd():
    x, y = planted_data(p=5, seed=3)
    lam = 0.05
    w = np.random.default_rng(4).normal(size=5)
    prob = LogisticERM(features=x, labels=y, l2=lam)
    wt = torch.tensor(w, requires_grad=True)
    f = logistic_loss(torch.from_numpy(x) @ wt, torch.from_numpy(y)).mean() + 0.5 * lam * (wt @ wt)
    f.backward()
    assert prob.objective(w) == pytest.approx(float(f.detach()), rel=1e-12)
    np.testing.assert_allclose(prob.gradient(w), wt.grad.numpy(), rtol=1e-10, atol=1e-13)


def test_clipped_gradients_match_explicit_clipping():
    x, y = planted_data(scale=5.0)  # rows of norm 5 so that clipping at 1 binds for many samples
    w = np.random.default_rng(2).normal(size=x.shape[1])
    prob = LogisticERM(features=x, labels=y)
    raw = _autograd_per_sample(x, y, w)
    norms = np.linalg.norm(raw, axis=1)
    expect = raw * np.minimum(1.0, 0.5 / norms)[:, None]
    assert (norms > 0.5).any() and (norms < 0.5).any()
    np.testing.assert_allclose(prob.per_sample_grads(w, clip=0.5), expect, rtol=1e-10, atol=1e-13)
    assert np.linalg.norm(prob.per_sample_grads(w, clip=0.5), axis=1).max() <= 0.5 + 1e-12


def test_losses_are_stable_at_extreme_margins():
    x = np.array([[1.0], [1.0]])
    prob = LogisticERM(features=x, labels=np.array([1.0, -1.0]))
    w = np.array([800.0])
    assert np.all(np.isfinite(prob.losses(w)))
    assert prob.losses(w)[1] == pytest.approx(800.0)
    np.testing.assert_allclose(prob.grad_coefficients(w), [0.0, 1.0], atol=1e-300)


def test_solver_matches_sklearn_optimum():
    from sklearn.linear_model import LogisticRegression

    x, y = planted_data(n=300, p=6, seed=5)
    lam = 1e-2
    prob = LogisticERM(features=x, labels=y, l2=lam)
    w_star, f_star = prob.solve()
    assert np.linalg.norm(prob.gradient(w_star)) < 1e-9
    # sklearn minimises (1/2)||w||^2 + C sum_i loss_i, i.e. our F^r with C = 1/(n lam)
    sk = LogisticRegression(C=1 / (300 * lam), fit_intercept=False, tol=1e-12, max_iter=10_000).fit(x, y)
    assert f_star <= prob.objective(sk.coef_.ravel()) + 1e-12
    np.testing.assert_allclose(w_star, sk.coef_.ravel(), atol=1e-5)


def test_constants_and_preprocessing():
    rng = np.random.default_rng(0)
    raw = rng.uniform(-50, 3000, size=(40, 4))
    raw[:, 2] = 7.0  # constant column
    with pytest.warns(UserWarning, match="not private"):  # data min/max: allowed, but flagged
        scaled = minmax_scale(raw)
    assert scaled.min() >= 0 and scaled.max() <= 1 and np.all(scaled[:, 2] == 0)
    x = normalize_rows(scaled)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0)
    prob = LogisticERM(features=x, labels=np.ones(40), l2=0.1)
    assert prob.lipschitz() == pytest.approx(1.0)
    assert prob.smoothness() == pytest.approx(0.25 + 0.1)


@pytest.mark.parametrize(
    "kwargs, err",
    [
        (dict(features=np.ones((3, 2)), labels=np.array([1.0, 2.0, -1.0])), DataError),
        (dict(features=np.ones((3, 2)), labels=np.array([1.0, 0.0, -1.0])), DataError),
        (dict(features=np.full((3, 2), np.nan), labels=np.ones(3)), DataError),
        (dict(features=np.ones((3, 2)), labels=np.ones(4)), DataError),
        (dict(features=np.ones((3, 2)), labels=np.ones(3), l2=-1.0), ConfigError),
    ],
)
def test_invalid_inputs_are_named(kwargs, err):
    with pytest.raises(err):
        LogisticERM(**kwargs)


def test_zero_one_labels_are_mapped():
    prob = LogisticERM(features=np.eye(2), labels=np.array([0, 1]))
    np.testing.assert_array_equal(prob.y, [-1.0, 1.0])


# ------------------------------------------------------------------------------------ DP-GD-ERM


def test_dp_gd_erm_without_noise_is_exact_proximal_gd():
    from privopt.algorithms.dp_gd_erm import DPGDERM

    x, y = planted_data(n=50, p=4, seed=7)
    lam, eta = 0.1, 0.7
    algo = DPGDERM(iterations=25, step_size=eta, l2=lam, clip=10.0)
    ctx = linear_ctx(x, y)
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    algo.finalize()
    w = np.zeros(4)
    for _ in range(25):  # reference recursion with autograd gradients of the logistic part
        g = _autograd_per_sample(x, y, w).mean(axis=0)
        w = (w - eta * g) / (1 + eta * lam)
    np.testing.assert_allclose(algo.output(), w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ctx.model.weight.detach().numpy().ravel(), w, rtol=1e-10, atol=1e-12)
    assert algo.passes == pytest.approx(25.0)


def test_projected_dp_gd_without_noise_is_exact_projected_gd():
    from privopt.algorithms.dp_gd_erm import DPGDERM
    from privopt.algorithms.mirror import project_l1_ball

    x, y = planted_data(n=50, p=4, seed=11)
    algo = DPGDERM(iterations=20, step_size=2.0, l2=0.05, clip=10.0, constraint="l1-ball", radius=0.7)
    ctx = linear_ctx(x, y)
    algo.setup(ctx)
    for t in range(20):
        algo.step(t)
    w = np.zeros(4)
    for _ in range(20):  # prox of (l2/2)||w||^2 + indicator of the ball = projection of the shrunk point
        w = project_l1_ball((w - 2.0 * _autograd_per_sample(x, y, w).mean(axis=0)) / (1 + 2.0 * 0.05), radius=0.7)
    assert np.abs(w).sum() == pytest.approx(0.7)  # the constraint binds
    np.testing.assert_allclose(algo.output(), w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, params", [("l1-ball", {"radius": 0.8}), ("l2-ball", {"radius": 0.5}), ("simplex", {})])
def test_constrained_solver_matches_a_generic_solver_and_certifies_its_gap(name, params):
    from scipy.optimize import minimize

    from privopt.algorithms.mirror import get_geometry

    x, y = planted_data(n=120, p=4, seed=12)
    prob = LogisticERM(features=x, labels=y, l2=0.01)
    geo = get_geometry(name, dim=4, **params)
    w, f = prob.solve(constraint=geo, tol=1e-10)
    assert geo.contains(w) and prob.frank_wolfe_gap(w, geo) <= 1e-10
    # SLSQP on the split variables w = a - b (a, b >= 0) with the set's constraints
    cons = {
        "l1-ball": [{"type": "ineq", "fun": lambda ab: 0.8 - ab.sum()}],
        "l2-ball": [{"type": "ineq", "fun": lambda ab: 0.25 - ((ab[:4] - ab[4:]) ** 2).sum()}],
        "simplex": [{"type": "eq", "fun": lambda ab: ab[:4].sum() - 1.0}, {"type": "eq", "fun": lambda ab: ab[4:]}],
    }[name]
    res = minimize(
        lambda ab: prob.objective(ab[:4] - ab[4:]),
        np.full(8, 0.05),
        method="SLSQP",
        bounds=[(0, None)] * 8,
        constraints=cons,
        options={"ftol": 1e-13, "maxiter": 1000},
    )
    assert f <= prob.objective(res.x[:4] - res.x[4:]) + 1e-9


def test_dp_gd_erm_full_gradient_sensitivity_add_remove():
    """The pre-noise clipped sum moves by at most C when one (adversarial) record is added."""
    x, y = planted_data(n=40, p=5, seed=8, scale=4.0)
    rng = np.random.default_rng(9)
    clip = 0.8
    for _ in range(20):
        w = rng.normal(size=5) * 3
        extra = rng.normal(size=(1, 5)) * 100
        xa, ya = np.vstack([x, extra]), np.append(y, rng.choice([-1.0, 1.0]))
        s = LogisticERM(features=x, labels=y).grad_coefficients(w, clip=clip) @ x
        sa = LogisticERM(features=xa, labels=ya).grad_coefficients(w, clip=clip) @ xa
        assert np.linalg.norm(sa - s) <= clip + 1e-12


def test_dp_gd_erm_private_run_records_planned_steps():
    from privopt.algorithms.dp_gd_erm import DPGDERM
    from privopt.privacy import PrivacyLedger, calibrate

    x, y = planted_data(n=500, p=4, seed=10)
    algo = DPGDERM(iterations=30, step_size=0.5, l2=0.01)
    cal = calibrate(algo.inventory(n=500), epsilon=1.0, delta=1e-5, accountant="rdp")
    ledger = PrivacyLedger(delta=1e-5, neighbouring="add_remove", accountant=cal.accountant)
    algo.setup(linear_ctx(x, y, ledger=ledger, noise=cal.noise))
    for t in range(30):
        algo.step(t)
    assert ledger.epsilon() == pytest.approx(1.0, abs=0.02)
    assert ledger.epsilon() <= 1.0 + 1e-6


def test_erm_algorithms_reject_non_linear_models():
    from privopt.algorithms.dp_gd_erm import DPGDERM

    x, y = planted_data(n=20, p=3)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    with pytest.raises(ModelError, match="linear model"):
        DPGDERM().setup(linear_ctx(x, y, model=model))


@pytest.mark.parametrize(
    "bad",
    [
        dict(iterations=0),
        dict(step_size=-1.0),
        dict(clip=0.0),
        dict(l2=float("nan")),
        dict(constraint="l3-ball"),
        dict(constraint="none", radius=2.0),
        dict(constraint="l1-ball", radius=0.0),
    ],
)
def test_dp_gd_erm_bad_hyperparameters(bad):
    from privopt.algorithms.dp_gd_erm import DPGDERM

    with pytest.raises(ConfigError):
        DPGDERM(**bad)


# ----------------------------------------------------------------------------- through privopt train / fit
ERM_RUN = [
    "--set", "dataset=breast-cancer", "--set", "model=logreg", "--set", "model_params.bias=false",
    "--set", "model_params.single_logit=true", "--set", "loss=logistic", "--set", "privacy.delta=1e-4",
]  # fmt: skip


@pytest.mark.parametrize(
    "algorithm,params",
    [
        ("dp-svrg", ["algorithm_params.epochs=2", "algorithm_params.inner=50", "algorithm_params.step_size=0.1"]),
        ("dp-gd-erm", ["algorithm_params.iterations=20", "algorithm_params.step_size=0.5"]),
        ("dp-amd", ["algorithm_params.iterations=10"]),
    ],
)
def test_linear_erm_algorithms_run_through_privopt_train(algorithm, params, tmp_path, capsys):
    """`privopt list` shows them, so `privopt train` runs them: a one-logit logreg and the logistic loss."""
    import json

    from privopt.cli import main

    sets = [a for p in params for a in ("--set", p)]
    argv = ["train", "--set", f"algorithm={algorithm}", *ERM_RUN, *sets, "--out", str(tmp_path / "r"), "--quiet"]
    assert main([*argv, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "finished" and res["privacy"]["epsilon_spent"] <= 1.0 + 1e-9
    assert 0.0 <= res["metrics"]["test_accuracy"] <= 1.0 and np.isfinite(res["metrics"]["test_loss"])


def test_a_single_logit_needs_the_logistic_loss_whatever_the_first_labels(tmp_path):
    """The model check probes both class ids: cross-entropy on one logit fails on label 1 only, so two
    leading 0 labels must not let it through to a traceback mid-run."""
    from privopt.config import RunConfig
    from privopt.data import Dataset
    from privopt.training import build_loss, train

    x = torch.rand(60, 3, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 0] + [0, 1] * 29)
    data = Dataset.from_tensors(x[:40], y[:40], x_test=x[40:], y_test=y[40:], num_classes=2)
    cfg = RunConfig.from_dict({"algorithm": "dp-sgd", "algorithm_params": {"epochs": 1, "batch_size": 10}})
    with pytest.raises(ModelError, match="one logit per example needs loss: logistic"):
        train(cfg, out_dir=tmp_path / "r", progress=False, dataset=data, model=torch.nn.Linear(3, 1))
    assert not (tmp_path / "r").exists()
    logistic = build_loss("logistic")
    assert torch.allclose(
        logistic(torch.tensor([[0.0], [3.0]]), torch.tensor([0, 1])), torch.log1p(torch.exp(torch.tensor([0.0, -3.0])))
    )
    with pytest.raises(ValueError, match="0 or 1"):
        logistic(torch.zeros(2, 1), torch.tensor([0, 2]))


def test_logreg_single_logit_needs_two_classes():
    from privopt.models import build_model

    assert build_model("logreg", input_shape=(4,), num_classes=2, single_logit=True, bias=False)(
        torch.zeros(3, 4)
    ).shape == (3, 1)
    with pytest.raises(ConfigError, match="two-class"):
        build_model("logreg", input_shape=(4,), num_classes=10, single_logit=True)
