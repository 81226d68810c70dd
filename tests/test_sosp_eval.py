"""SOSP diagnostics: gradient norm, Hessian-vector products and Lanczos λ_min against dense autograd."""

import math

import pytest
import torch
from torch import nn

from privopt.eval.sosp import full_gradient, hessian_min_eig, hessian_vector_product, sosp_metric, sosp_report
from privopt.grads.flat import flat_params, params_from_flat


def _ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def _problem(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)
    x, y = torch.randn(40, 4, dtype=dtype), torch.randint(0, 3, (40,))
    return model, x, y


def _dense_hessian(model, x, y):
    def f(flat):
        out = torch.func.functional_call(model, params_from_flat(model, flat), (x,))
        return _ce(out, y).mean()

    return torch.autograd.functional.hessian(f, flat_params(model))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lanczos_min_eigenvalue_equals_dense_eigvalsh(seed):
    model, x, y = _problem(seed)
    dense = torch.linalg.eigvalsh(_dense_hessian(model, x, y))
    lam, converged = hessian_min_eig(model, _ce, x, y, chunk=16, tol=1e-10)
    assert converged and lam == pytest.approx(float(dense[0]), abs=1e-8)
    assert float(dense[0]) < 0  # a non-convex point: the test is not about a PSD matrix


def test_without_convergence_an_upper_bound_on_the_min_eigenvalue_is_returned():
    model, x, y = _problem(1)
    dense = torch.linalg.eigvalsh(_dense_hessian(model, x, y))
    lam, converged = hessian_min_eig(model, _ce, x, y, chunk=16, tol=1e-14, maxiter=1, ncv=4)
    assert not converged and math.isfinite(lam)  # a number, not NaN, when ARPACK returns nothing
    assert float(dense[0]) - 1e-9 <= lam <= float(dense[-1])
    more, _ = hessian_min_eig(model, _ce, x, y, chunk=16, tol=1e-14, maxiter=1, ncv=int(dense.numel()))
    assert more == pytest.approx(float(dense[0]), abs=1e-6)  # a full Krylov space gives λ_min


def test_hvp_and_gradient_match_autograd():
    model, x, y = _problem(3)
    h = _dense_hessian(model, x, y)
    v = torch.randn(h.shape[0], dtype=torch.float64)
    assert torch.allclose(hessian_vector_product(model, _ce, x, y, chunk=7)(v), h @ v, atol=1e-10)
    loss = _ce(model(x), y).mean()
    g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, list(model.parameters()))])
    assert torch.allclose(full_gradient(model, _ce, x, y, chunk=9), g, atol=1e-12)


def test_report_and_run_metric():
    model, x, y = _problem(4, dtype=torch.float32)
    rep = sosp_report(model, _ce, x, y)
    assert rep["grad_norm"] > 0 and rep["lanczos_converged"] == 1.0
    data = type("D", (), {"x_test": x, "y_test": y})()
    out = sosp_metric("test", max_records=20)(model=model, loss_fn=_ce, data=data, record={})
    assert set(out) == {"sosp_test_grad_norm", "sosp_test_hessian_min_eig", "sosp_test_lanczos_converged"}
