"""Gauss-PSGD escapes a strict saddle with its privacy noise and certifies a minimum."""

from types import SimpleNamespace

import pytest
import torch
from tests.sosp_helpers import run_to_end
from torch import nn

from privopt.algorithms import RunContext, get_algorithm
from privopt.eval.sosp import sosp_report
from privopt.grads import get_engine
from privopt.privacy import calibrate, make_ledger
from privopt.rng import TorchSource


class DoubleWell(nn.Module):
    """Per-record loss f(θ) + <z, θ> with f(u, v) = u² + v⁴/4 − v²/2: a strict saddle at (0, 0)
    (Hessian diag(2, −1)), minima at (0, ±1) (Hessian diag(2, 2)); the records z are centred noise."""

    def __init__(self, start=(0.0, 0.0)):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(start))

    def forward(self, z):
        u, v = self.theta[0], self.theta[1]
        return u**2 + v**4 / 4 - v**2 / 2 + z @ self.theta


def _identity_loss(out, y):
    return out


def _toy_run(start, **params):
    """Gauss-PSGD set up on 6,000 records of the double well (secret-free: insecure seeds)."""
    z = 0.3 * torch.randn(6000, 2, generator=torch.Generator().manual_seed(0))
    hp = {"epochs": 2, "b1": 300, "b2": 30, "lr": 0.2, "clip": 1.0, "gamma": 10.0, "kappa": 0.05,
          "chi": 0.01, "radius": 0.1, "escape_steps": 30, "escape_rounds": 3, **params}  # fmt: skip
    algo = get_algorithm("gauss-psgd", **hp)
    inv = algo.inventory(n=6000)
    cal = calibrate(inv, epsilon=4.0, delta=1e-5)
    ledger = make_ledger(inv, cal.noise, delta=1e-5, target_epsilon=4.0)
    model = DoubleWell(start)
    ctx = RunContext(model=model, loss_fn=_identity_loss, x_train=z, y_train=torch.zeros(6000, dtype=torch.int64),
                     engine=get_engine("vmap"), ledger=ledger, noise=dict(cal.noise),
                     noise_rng=TorchSource(1), sampler_rng=TorchSource(2))  # fmt: skip
    algo.setup(ctx)
    return SimpleNamespace(algo=algo, model=model, ledger=ledger, total=algo.num_steps(), z=z)


def test_escapes_the_saddle_and_certifies_a_minimum():
    run = _toy_run((0.0, 0.0))
    run_to_end(run)
    algo = run.algo
    assert algo.stats["escapes"] >= 1  # left the saddle with its own privacy noise
    assert algo.certified is True  # then no escape round left the minimum: certified
    u, v = run.model.theta.detach().tolist()
    assert abs(u) < 0.1 and abs(abs(v) - 1) < 0.1
    rep = sosp_report(run.model, _identity_loss, run.z, torch.zeros(6000))
    assert rep["hessian_min_eig"] > 1.5 and rep["grad_norm"] < 0.1
    assert run.ledger.epsilon() <= 4.0


def test_without_negative_curvature_the_first_point_is_certified():
    run = _toy_run((0.0, 1.0))
    run_to_end(run)
    assert run.algo.certified is True and run.algo.stats["escapes"] == 0
    assert run.algo.stats["rounds"] == 3
    assert torch.allclose(run.model.theta.detach(), torch.tensor([0.0, 1.0]))  # x̃ itself is returned


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_budget_that_ends_mid_escape_returns_the_candidate_uncertified(rounds):
    run = _toy_run((0.0, 1.0), epochs=1, b1=2000, escape_rounds=rounds + 5, escape_steps=400)
    run_to_end(run)
    assert run.algo.certified is False and run.algo.oracle.exhausted
    assert torch.allclose(run.model.theta.detach(), torch.tensor([0.0, 1.0]))
