"""Private model selection (Paper C, Algorithm 4): per-record curvature queries, their sensitivity,
the accounting, and that it picks the minimum over the saddle."""

import pytest
import torch
from tests.test_gauss_psgd import DoubleWell, _identity_loss
from torch import nn

from privopt.algorithms.federation import Client, Federation
from privopt.algorithms.private_selection import PrivateModelSelection, _clipped_rows, per_record_hvp
from privopt.distributed import LocalComm
from privopt.grads.flat import flat_params
from privopt.privacy import calibrate, make_ledger
from privopt.rng import TorchSource


def _ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def test_per_record_hvp_matches_an_autograd_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    w, v = flat_params(model), torch.randn(flat_params(model).numel())
    rows = per_record_hvp(model, _ce, x, y, w, v)
    params = list(model.parameters())
    for i in range(6):
        loss = _ce(model(x[i : i + 1]), y[i : i + 1]).sum()
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params, create_graph=True)])
        hv = torch.cat([t.reshape(-1) for t in torch.autograd.grad(g @ v, params)])
        assert torch.allclose(rows[i], hv, atol=1e-5)


def test_clipped_curvature_sums_move_by_at_most_their_bound():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    x, y = torch.randn(30, 4), torch.randint(0, 3, (30,))
    x2 = x.clone()
    x2[0] = 40.0  # an adversarial record
    w = flat_params(model)
    v = torch.randn(w.numel())
    v = v / v.norm()
    a = _clipped_rows(per_record_hvp(model, _ce, x, y, w, v), 0.5)
    b = _clipped_rows(per_record_hvp(model, _ce, x2, y, w, v), 0.5)
    c = _clipped_rows(per_record_hvp(model, _ce, x[1:], y[1:], w, v), 0.5)
    assert a.bound == b.bound == 0.5
    assert float((a.value - b.value).norm()) <= 2 * 0.5 + 1e-6  # replace one
    assert float((a.value - c.value).norm()) <= 0.5 + 1e-6  # remove one


def _federation(private, epsilon, sel, candidates):
    """Two clients holding 4,000 held-out records of the double well each, with their ledgers."""
    z = 0.3 * torch.randn(8000, 2, generator=torch.Generator().manual_seed(4))
    zeros = torch.zeros(8000, dtype=torch.int64)
    inv = sel.inventory(candidates=candidates)
    cal = calibrate(inv, epsilon=epsilon, delta=1e-6)
    clients = []
    for j in range(2):
        ledger = make_ledger(inv, cal.noise, delta=1e-6, target_epsilon=epsilon) if private else None
        part = slice(4000 * j, 4000 * (j + 1))
        clients.append(Client(j, z[part], zeros[part], TorchSource(10 + j), TorchSource(20 + j), ledger))
    fed = Federation(clients, num_clients=2, shard_sizes=[4000, 4000], trust="local", comm=LocalComm())
    return fed, dict(cal.noise)


@pytest.mark.parametrize("method", ["lanczos", "hessian"])
@pytest.mark.parametrize("private", [False, True])
def test_selects_the_minimum_over_the_saddle(method, private):
    sel = PrivateModelSelection(alpha=0.05, rho=1.0, method=method, lanczos_steps=2, grad_clip=2.0, hvp_clip=4.0)
    fed, noise = _federation(private, 3.0, sel, candidates=3)
    model = DoubleWell()
    cands = [torch.tensor([0.0, 0.0]), torch.tensor([0.5, 0.8]), torch.tensor([0.0, 1.0])]
    res = sel.select(cands, federation=fed, model=model, loss_fn=_identity_loss, noise=noise, private=private)
    assert res.index == 2  # the saddle (λ_min = −1) and a non-stationary point are rejected
    assert res.min_eigs[0] < -0.5 and res.grad_norms[1] > res.grad_threshold
    assert res.min_eigs[2] == pytest.approx(2.0, abs=0.3)
    if private:
        for c in fed.clients:
            assert c.ledger.epsilon() <= 3.0
            assert c.ledger.summary()["releases"] == {"sel-grad": 3, "sel-curv": 3 * sel.k}


def test_lanczos_without_noise_equals_the_dense_smallest_eigenvalue():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    d = flat_params(model).numel()
    x, y = torch.randn(50, 3), torch.randint(0, 2, (50,))
    clients = [Client(0, x, y, TorchSource(1), TorchSource(2), None)]
    fed = Federation(clients, num_clients=1, shard_sizes=[50], trust="local", comm=LocalComm())
    sel = PrivateModelSelection(alpha=1.0, method="lanczos", lanczos_steps=d, hvp_clip=1e9, grad_clip=1e9)
    lam = sel._lanczos(fed, model, _ce, flat_params(model), {"sel-curv": 1.0}, private=False)
    dense = PrivateModelSelection(alpha=1.0, method="hessian", hvp_clip=1e9)
    exact = dense._hessian_release(fed, model, _ce, flat_params(model), {"sel-curv": 1.0}, private=False)
    assert float(lam) == pytest.approx(float(exact), abs=1e-4)
