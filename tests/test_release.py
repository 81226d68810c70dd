"""PrivateBatch: every release is recorded (once per batch) before its noise is drawn."""

import pytest
import torch

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.grads.release import PrivateBatch
from privopt.privacy import FullBatch, Gaussian, Poisson, PrivacyLedger, Step


def test_noise_scale_and_normalisation():
    ledger = PrivacyLedger(delta=1e-5)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [
            PrivateBatch(ledger, Poisson(0.1), {"grad": 2.0}, rng=g).gaussian(
                "grad", torch.zeros(1000), clip=0.5, normalizer=10.0
            )
            for _ in range(20)
        ]
    )
    # std on the mean = z * C / normaliser = 2 * 0.5 / 10
    assert draws.std().item() == pytest.approx(0.1, rel=0.03)
    assert abs(draws.mean().item()) < 0.005
    assert ledger.num_steps == 20


def test_several_releases_on_one_batch_are_one_step():
    ledger = PrivacyLedger(delta=1e-5)
    batch = PrivateBatch(ledger, Poisson(0.05), {"x": 1.0, "eta": 3.0}, rng=torch.Generator())
    batch.gaussian("x", torch.zeros(3), clip=1.0, normalizer=1.0)
    batch.gaussian("eta", torch.zeros(1), clip=1.0, normalizer=1.0)
    assert ledger.counts == {Step(Poisson(0.05), (Gaussian(1.0, name="x"), Gaussian(3.0, name="eta"))): 1}
    with pytest.raises(ConfigError, match="already made"):
        batch.gaussian("x", torch.zeros(3), clip=1.0, normalizer=1.0)
    with pytest.raises(ConfigError, match="not declared"):
        batch.gaussian("other", torch.zeros(3), clip=1.0, normalizer=1.0)


def test_refused_step_draws_no_noise_and_records_nothing():
    step = Step(FullBatch(), (Gaussian(1.0, name="grad"),))
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=10.0, planned={step: 3})
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        PrivateBatch(ledger, FullBatch(), {"grad": 1.0}, rng=g).gaussian(
            "grad", torch.zeros(2), clip=1.0, normalizer=1.0
        )
    state = g.get_state()
    with pytest.raises(PrivacyBudgetExceeded):
        for _ in range(1000):
            PrivateBatch(ledger, FullBatch(), {"grad": 1.0}, rng=g).gaussian(
                "grad", torch.zeros(2), clip=1.0, normalizer=1.0
            )
    assert ledger.epsilon() <= 10.0
    n_ok = ledger.counts[step]
    assert 3 < n_ok < 1000
    # the generator advanced only for the accepted releases, never for the refused one
    g2 = torch.Generator()
    g2.set_state(state)
    for _ in range(n_ok - 3):
        torch.randn(2, generator=g2)
    assert torch.equal(g.get_state(), g2.get_state())


def test_non_private_batch_adds_no_noise():
    batch = PrivateBatch(None, Poisson(0.1), {"grad": 1.0}, rng=None)
    out = batch.gaussian("grad", torch.ones(4), clip=1.0, normalizer=2.0)
    assert torch.equal(out, torch.full((4,), 0.5))


def test_bad_arguments():
    ledger = PrivacyLedger(delta=1e-5)
    with pytest.raises(ConfigError):
        PrivateBatch(ledger, Poisson(0.1), {}, rng=torch.Generator())
    batch = PrivateBatch(ledger, Poisson(0.1), {"g": 1.0}, rng=torch.Generator())
    with pytest.raises(ConfigError, match="normalizer"):
        batch.gaussian("g", torch.zeros(1), clip=1.0, normalizer=0.0)
