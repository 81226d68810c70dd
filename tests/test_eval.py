"""Evaluation: classification metrics, the KL-DRO gradient norm (envelope theorem, chunking) and the
membership-inference attack with its DP AUC cap (docs/privacy.md)."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from sklearn.metrics import f1_score, roc_auc_score
from torch import nn

from privopt.errors import ConfigError, DataError
from privopt.eval import (
    classification_metrics,
    dp_auc_bound,
    dual_grad_norm,
    group_accuracies,
    hanley_mcneil_se,
    kl_dro_grad_norm,
    kl_dro_stats,
    mia_auc,
    mia_report,
    worst_group_accuracy,
)
from privopt.objectives import DualObjective


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


# ------------------------------------------------------------------ metrics
def test_multiclass_metrics_match_independent_computation():
    rng = np.random.default_rng(0)
    n, k = 300, 4
    y = rng.integers(0, k, size=n)
    logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y]  # informative but imperfect
    m = classification_metrics(torch.from_numpy(logits), torch.from_numpy(y), num_classes=k)
    pred = logits.argmax(1)
    assert m["accuracy"] == pytest.approx(np.mean(pred == y))
    per = [np.mean(pred[y == c] == c) for c in range(k)]
    assert m["per_class_accuracy"] == pytest.approx(per)
    assert m["worst_class_accuracy"] == pytest.approx(min(per))
    assert m["balanced_accuracy"] == pytest.approx(np.mean(per))
    prob = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert m["roc_auc"] == pytest.approx(roc_auc_score(y, prob, multi_class="ovr", average="macro"))
    assert m["f1"] == pytest.approx(f1_score(y, pred, average="macro"))
    assert m["num_samples"] == n
    assert 0.5 < m["roc_auc"] < 1.0


def test_binary_metrics_single_logit_and_two_columns_agree():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=200)
    z = rng.normal(size=200) + 1.2 * (2 * y - 1)
    two = np.stack([np.zeros(200), z], axis=1)
    a = classification_metrics(z, y, num_classes=2)
    b = classification_metrics(two, y, num_classes=2)
    c = classification_metrics(z[:, None], y, num_classes=2)
    for key in ("accuracy", "roc_auc", "f1", "worst_class_accuracy"):
        assert a[key] == pytest.approx(b[key]) == pytest.approx(c[key])
    assert a["roc_auc"] == pytest.approx(roc_auc_score(y, z))
    assert a["f1"] == pytest.approx(f1_score(y, (z > 0).astype(int)))


def test_metrics_are_robust_to_absent_classes():
    y = np.array([0, 0, 1, 1, 1, 0])  # class 2 never appears
    logits = np.array([[3, 0, 0], [0, 2, 0], [0, 3, 0], [0, 0, 3], [0, 2, 1], [1, 0, 0]], dtype=float)
    m = classification_metrics(logits, y, num_classes=3)
    assert math.isnan(m["per_class_accuracy"][2])
    assert m["per_class_accuracy"][:2] == pytest.approx([2 / 3, 2 / 3])
    assert m["worst_class_accuracy"] == pytest.approx(2 / 3)
    assert math.isfinite(m["roc_auc"])
    # Binary with only one class present: AUC undefined (nan), everything else computed.
    mb = classification_metrics(np.array([0.3, -1.0, 2.0]), np.array([1, 1, 1]), num_classes=2)
    assert math.isnan(mb["roc_auc"]) and mb["accuracy"] == pytest.approx(2 / 3)


def test_metrics_validate_inputs():
    with pytest.raises(ConfigError, match="num_classes"):
        classification_metrics(np.zeros((3, 1)), np.zeros(3), num_classes=1)
    with pytest.raises(DataError, match="labels must be integers"):
        classification_metrics(np.zeros((3, 3)), np.array([0, 1, 5]), num_classes=3)
    with pytest.raises(DataError, match="shape"):
        classification_metrics(np.zeros((3, 4)), np.array([0, 1, 2]), num_classes=3)
    with pytest.raises(DataError, match="entries"):
        classification_metrics(np.zeros((3, 3)), np.array([0, 1]), num_classes=3)
    with pytest.raises(DataError, match="NaN"):
        classification_metrics(np.array([[0.0, np.nan]]), np.array([0]), num_classes=2)


def test_worst_group_accuracy():
    rng = np.random.default_rng(2)
    n = 120
    y = rng.integers(0, 2, size=n)
    g = rng.integers(0, 4, size=n)
    logits = rng.normal(size=(n, 2))
    pred = logits.argmax(1)
    expected = {int(k): float(np.mean(pred[g == k] == y[g == k])) for k in range(4)}
    assert group_accuracies(logits, y, g) == pytest.approx(expected)
    assert worst_group_accuracy(torch.from_numpy(logits), torch.from_numpy(y), torch.from_numpy(g)) == pytest.approx(
        min(expected.values())
    )
    with pytest.raises(DataError, match="disagree"):
        worst_group_accuracy(logits, y, g[:-1])


# ------------------------------------------------------------------ gradient norms
def _model_and_data(seed=0, n=60):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x = torch.randn(n, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (n,))
    return model, x, y


def _psi_kl(model, x, y, lam0, rho):
    """Brute force Ψ_KL = min_{λ≥λ0} Ψ(λ) via bounded Brent on the full-batch value."""
    with torch.no_grad():
        ell = ce(model(x), y)

    def psi(lam):
        return float(lam * (torch.logsumexp(ell / lam, 0) - math.log(len(ell))) + lam * rho)

    res = minimize_scalar(psi, bounds=(lam0, 100.0), method="bounded", options={"xatol": 1e-12})
    return min(res.fun, psi(lam0))


def test_kl_dro_grad_norm_is_the_gradient_of_the_minimised_objective():
    """Envelope theorem check: directional finite differences of Ψ_KL(x) = min_λ Ψ(x, λ) match
    <∇_x Ψ(x, λ*), v> for random directions v."""
    model, x, y = _model_and_data()
    lam0, rho = 1e-3, 0.1
    stats = kl_dro_stats(model, ce, x, y, lam0=lam0, rho=rho, batch_size=16)
    assert stats.lam_star > lam0  # interior optimum: the λ-dependence matters
    assert stats.psi == pytest.approx(_psi_kl(model, x, y, lam0, rho), rel=1e-9)

    # Gradient at λ* by autograd, to get the direction (the norm is what the metric reports).
    lam = stats.lam_star
    ell = ce(model(x), y)
    psi = lam * (torch.logsumexp(ell / lam, 0) - math.log(len(ell))) + lam * rho
    grads = torch.autograd.grad(psi, list(model.parameters()))
    assert stats.grad_norm == pytest.approx(float(torch.cat([g.reshape(-1) for g in grads]).norm()), rel=1e-9)

    base = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        v = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in base]
        h = 1e-5
        vals = []
        for sign in (1, -1):
            with torch.no_grad():
                for p, b, d in zip(model.parameters(), base, v):
                    p.copy_(b + sign * h * d)
            vals.append(_psi_kl(model, x, y, lam0, rho))
        with torch.no_grad():
            for p, b in zip(model.parameters(), base):
                p.copy_(b)
        fd = (vals[0] - vals[1]) / (2 * h)
        directional = sum(float((g * d).sum()) for g, d in zip(grads, v))
        assert fd == pytest.approx(directional, rel=1e-4, abs=1e-7)


def test_kl_dro_grad_norm_chunking_and_side_effects():
    model, x, y = _model_and_data(seed=1, n=53)
    model.train()
    a = kl_dro_grad_norm(model, ce, x, y, lam0=1e-3, rho=0.5, batch_size=7)
    b = kl_dro_grad_norm(model, ce, x, y, lam0=1e-3, rho=0.5, batch_size=1000)
    assert a == pytest.approx(b, rel=1e-10)
    assert model.training  # restored
    assert all(p.grad is None for p in model.parameters())  # .grad untouched


def test_kl_dro_grad_norm_large_radius_uses_lambda0():
    model, x, y = _model_and_data(seed=2, n=30)
    stats = kl_dro_stats(model, ce, x, y, lam0=0.05, rho=10.0)  # ρ > log n: λ* = λ0
    assert stats.lam_star == 0.05
    ell = ce(model(x), y)
    pi = torch.softmax(ell.detach() / 0.05, 0)
    grads = torch.autograd.grad((pi * ell).sum(), list(model.parameters()))
    assert stats.grad_norm == pytest.approx(float(torch.cat([g.reshape(-1) for g in grads]).norm()), rel=1e-9)


def test_dual_grad_norm_matches_autograd():
    model, x, y = _model_and_data(seed=3, n=40)
    obj = DualObjective(divergence="chi2", lam=0.5, a_max=None)
    eta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    value = obj.value(ce(model(x), y), eta)
    grads = torch.autograd.grad(value, list(model.parameters()) + [eta])
    expected = float(torch.cat([g.reshape(-1) for g in grads]).norm())
    assert dual_grad_norm(model, ce, x, y, objective=obj, eta=0.8, batch_size=9) == pytest.approx(expected, rel=1e-9)


def test_grad_norm_validates_inputs():
    model, x, y = _model_and_data(n=10)
    with pytest.raises(DataError, match="rows"):
        kl_dro_grad_norm(model, ce, x, y[:5], lam0=1e-3, rho=0.5)
    with pytest.raises(ConfigError, match="batch_size"):
        kl_dro_grad_norm(model, ce, x, y, lam0=1e-3, rho=0.5, batch_size=0)
    with pytest.raises(ConfigError, match="per-sample"):
        kl_dro_grad_norm(model, lambda o, t: ce(o, t).mean(), x, y, lam0=1e-3, rho=0.5)


# ------------------------------------------------------------------ membership inference
def test_dp_auc_bound_values():
    # Reference values of the bound (docs/privacy.md).
    for eps, ref in [(0.1, 0.525), (0.5, 0.622), (1, 0.731), (2, 0.881), (3, 0.953), (5, 0.993)]:
        assert dp_auc_bound(eps, 0.0) == pytest.approx(ref, abs=5e-4)
    assert dp_auc_bound(0.0, 0.0) == 0.5
    assert dp_auc_bound(1.0, 1e-5) == pytest.approx(math.e / (1 + math.e) + 1e-5)
    assert dp_auc_bound(800.0, 0.1) == 1.0 and dp_auc_bound(math.inf) == 1.0
    with pytest.raises(ConfigError, match="epsilon"):
        dp_auc_bound(-1.0, 0.0)
    with pytest.raises(ConfigError, match="delta"):
        dp_auc_bound(1.0, 2.0)


def test_hanley_mcneil_matches_the_null_spread_of_the_auc():
    n1, n2 = 40, 60
    se = hanley_mcneil_se(0.5, n1, n2)
    assert se == pytest.approx(math.sqrt((n1 + n2 + 1) / (12 * n1 * n2)), rel=0.05)
    rng = np.random.default_rng(0)
    # Mann–Whitney AUC of pure-noise scores (no ties), vectorised over 4000 replicates.
    ranks = rng.normal(size=(4000, n1 + n2)).argsort(axis=1).argsort(axis=1) + 1
    aucs = (ranks[:, :n1].sum(axis=1) - n1 * (n1 + 1) / 2) / (n1 * n2)
    assert np.std(aucs) == pytest.approx(se, rel=0.1)
    assert hanley_mcneil_se(0.99, n1, n2) < se  # less spread near perfect separation


def _random_task(n, gen):
    return torch.randn(n, 20, generator=gen), torch.randint(0, 2, (n,), generator=gen)


def test_overfit_model_is_detected_and_violates_a_small_epsilon_bound():  # 1 thread: conftest
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x_in, y_in = _random_task(60, gen)  # random labels: only memorisation can fit them
    x_out, y_out = _random_task(200, gen)
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        ce(model(x_in), y_in).mean().backward()
        opt.step()
    auc = mia_auc(model, ce, members=(x_in, y_in), non_members=(x_out, y_out))
    assert auc > 0.8
    assert mia_auc(model, ce, members=(x_in, y_in), non_members=(x_out, y_out), score="confidence") > 0.75
    rep = mia_report(model, ce, members=(x_in, y_in), non_members=(x_out, y_out), epsilon=0.1, delta=1e-5)
    assert rep["n_members"] == rep["n_non_members"] == 60  # balanced by subsampling non-members
    assert rep["mia_auc"] == pytest.approx(auc)  # same seed, same subsample
    assert not rep["within_bound"]
    assert rep["mia_bound"] == pytest.approx(dp_auc_bound(0.1, 1e-5))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_data_independent_model_is_within_the_zero_epsilon_bound(seed):
    """A model that never saw the data is 0-DP: its attack AUC is ≈ 0.5 within the slack."""
    gen = torch.Generator().manual_seed(100 + seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2))
    members, non_members = _random_task(400, gen), _random_task(400, gen)
    rep = mia_report(model, ce, members=members, non_members=non_members, epsilon=0.0, delta=0.0, seed=seed)
    assert rep["mia_bound"] == 0.5
    assert rep["slack"] == pytest.approx(3 * hanley_mcneil_se(0.5, 400, 400))
    assert abs(rep["mia_auc"] - 0.5) <= rep["slack"]
    assert rep["within_bound"]


def test_mia_validates_inputs():
    model = nn.Linear(3, 2)
    data = (torch.randn(5, 3), torch.randint(0, 2, (5,)))
    with pytest.raises(ConfigError, match="score"):
        mia_auc(model, ce, members=data, non_members=data, score="entropy")
    with pytest.raises(DataError, match="at least one"):
        mia_auc(model, ce, members=(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)), non_members=data)
    with pytest.raises(DataError, match="rows"):
        mia_auc(model, ce, members=(data[0], data[1][:3]), non_members=data)
