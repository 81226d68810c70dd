"""The noisy releases are the only channel from the training records to what a DRO run logs and trains.

docs/privacy.md: an algorithm's logged values (DP Double-SPIDER's ``eta``, ``g``, ``v_norm``,
``step_size``; Recursive-SPIDER's ``lam``, ``s``, ``shift``; the baselines' ``r_max``, ...) are
post-processing of its released values, and its model is too; docs/algorithms/dpsgd.md: sums are
normalised by the EXPECTED batch size, never the realised one. Here every Gaussian release is made
blind (its statistic replaced by zeros, the noise and normaliser kept), so the run can depend on
the data only through something else. Then a record replaced by an adversarial one (far out and
mislabelled, or overflowing float32's squares) and another draw of the secret batches must leave
every logged value and the final model bit for bit the same. The worker, worst-group, ERM and
federated runs have the same kind of check on whole runs (``tests/test_leak_audit_*.py``,
``tests/test_training_outputs.py``); these algorithms had none.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privopt.algorithms import get_algorithm
from privopt.algorithms.base import RunContext
from privopt.grads import get_engine
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import BoundedSum, as_bounded
from privopt.privacy import PrivacyLedger
from privopt.rng import TorchSource

N = 120
RUNS = {  # short runs that make refreshes AND step-proportional corrections
    "dp-double-spider": {"steps": 12, "q": 3, "N1": 60, "N2": 20, "N3": 60, "N4": 20},
    "dp-recursive-spider": {"steps": 12, "q": 3, "b1": 60, "b2": 20, "b3": 60, "b4": 20, "s_batch": 20},
    "dp-sgda": {"steps": 10, "batch_size": 30},
    "private-diff": {"steps": 12, "q": 3, "refresh_batch": 60, "batch_size": 20},
    "dp-sgd-joint": {"epochs": 2, "batch_size": 30},
    "dp-sgd": {"epochs": 2, "batch_size": 30},
    "dp-gd": {"epochs": 3},
}
ADVERSARIAL = [  # (features, label) replacing record 7
    (torch.full((4,), 50.0), 0),
    (torch.full((4,), 1e30), 1),  # its float32 squares overflow: a non-finite norm
    (torch.tensor([-3.0, 0.0, 0.0, 9.0]), 1),
]


def _loss(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def _data(replace=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=g)
    y = (x[:, 0] > 0).long()
    if replace is not None:
        x[7], y[7] = replace
    return x, y


def _run(name, data, *, sampler_seed=2):
    """(logged values of every step, final parameters) of a private run with fixed noise multipliers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    algo = get_algorithm(name, **RUNS[name])
    noise = dict.fromkeys(algo.release_plan(N).family_counts(), 1.0)
    ctx = RunContext(
        model=model, loss_fn=_loss, x_train=data[0], y_train=data[1], engine=get_engine("vmap"),
        ledger=PrivacyLedger(delta=1e-5), noise=noise, noise_rng=TorchSource(seed=1),
        sampler_rng=TorchSource(seed=sampler_seed),
    )  # fmt: skip
    algo.setup(ctx)
    logs = [algo.step(t) for t in range(algo.num_steps())]
    algo.finalize()
    return logs, [p.detach().clone() for p in model.parameters()]


def _same(a, b) -> bool:
    return a[0] == b[0] and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))


@pytest.fixture
def blind(monkeypatch):
    """Every Gaussian release noises zeros instead of its statistic (same bound, noise, normaliser)."""
    real = PrivateBatch.gaussian

    def gaussian(self, name, stat, *, normalizer):
        s = as_bounded(stat)
        return real(self, name, BoundedSum(torch.zeros_like(s.value), bound=s.bound), normalizer=normalizer)

    monkeypatch.setattr(PrivateBatch, "gaussian", gaussian)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_logs_and_model_depend_on_the_records_only_through_the_releases(name, blind):
    base = _run(name, _data())
    assert len(base[0]) >= 3
    for replace in ADVERSARIAL:
        assert _same(_run(name, _data(replace)), base), replace
    # other secret batches: a realised batch size or membership read anywhere else would show
    assert _same(_run(name, _data(), sampler_seed=9), base)


@pytest.mark.parametrize("name", ["dp-double-spider", "dp-recursive-spider", "dp-sgda"])
def test_the_check_has_teeth_without_blind_releases(name):
    """With the real statistics the same neighbours and batches do change the logs and the model."""
    base = _run(name, _data())
    assert not _same(_run(name, _data(ADVERSARIAL[0])), base)
    assert not _same(_run(name, _data(), sampler_seed=9), base)
