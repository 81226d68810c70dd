"""PrivateBatch: every release is recorded (once per batch) before its noise is drawn, with noise
scaled by the per-record bound the released sum carries; audit hooks."""

import math

import pytest
import torch

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.grads import ClippedSum
from privopt.grads.release import (
    PrivateBatch,
    gaussian_noise_like,
    insecure_scale_noise_for_testing,
    observe_releases,
)
from privopt.grads.sums import BoundedSum, clipped_scalar_difference_sum, clipped_scalar_sum
from privopt.privacy import FullBatch, Gaussian, Poisson, PrivacyLedger, Step
from privopt.rng import TorchSource


def zeros(k, bound=1.0):
    return BoundedSum(torch.zeros(k), bound=bound)


def test_noise_scale_and_normalisation():
    ledger = PrivacyLedger(delta=1e-5)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [
            PrivateBatch(ledger, Poisson(0.1), {"grad": 2.0}, rng=g).gaussian("grad", zeros(1000, 0.5), normalizer=10.0)
            for _ in range(20)
        ]
    )
    # std on the mean = z * bound / normaliser = 2 * 0.5 / 10
    assert draws.std().item() == pytest.approx(0.1, rel=0.03)
    assert abs(draws.mean().item()) < 0.005
    assert ledger.num_steps == 20


def test_the_engine_clipped_sum_is_read_through_its_clip():
    ledger = PrivacyLedger(delta=1e-5)
    res = ClippedSum(total=torch.zeros(4000), norms=torch.ones(3), losses=torch.ones(3), losses_prev=None, clip=0.25)
    out = PrivateBatch(ledger, Poisson(0.1), {"grad": 4.0}, rng=TorchSource(seed=3)).gaussian(
        "grad", res, normalizer=1.0
    )
    assert out.std().item() == pytest.approx(4.0 * 0.25, rel=0.05)


def test_a_bare_tensor_is_refused():
    batch = PrivateBatch(PrivacyLedger(delta=1e-5), Poisson(0.1), {"g": 1.0}, rng=torch.Generator())
    with pytest.raises(ConfigError, match="carries its per-record bound"):
        batch.gaussian("g", torch.zeros(3), normalizer=1.0)


def test_bounds_change_only_by_explicit_scaling():
    s = BoundedSum(torch.tensor([1.0, -2.0]), bound=0.5)
    t = s.scaled(-3.0)
    assert t.bound == 1.5 and t.value.tolist() == [-3.0, 6.0]
    with pytest.raises(AttributeError):  # frozen: the bound cannot be edited in place
        s.bound = 2.0
    with pytest.raises(ConfigError):
        BoundedSum(torch.zeros(1), bound=0.0)
    with pytest.raises(ConfigError):
        s.scaled(0.0)
    assert clipped_scalar_sum(torch.tensor([5.0, -5.0, 0.1]), 2.0).bound == 2.0


@pytest.mark.parametrize("w", [0.0, 0.3, 1.0, -0.5])
def test_weighted_difference_of_clipped_terms_has_bound_one_plus_w(w):
    # The worst case of Clip(a) − w·Clip(b) is a = ±big, b = ∓big: |C + |w|·C| — attained.
    worst = clipped_scalar_difference_sum(
        torch.tensor([9.0]), torch.tensor([-9.0 * math.copysign(1, w)]), clip=2.0, weight_prev=w
    )
    assert worst.bound == pytest.approx((1 + abs(w)) * 2.0)
    assert float(worst.value.abs()) == pytest.approx(worst.bound)


def test_several_releases_on_one_batch_are_one_step():
    ledger = PrivacyLedger(delta=1e-5)
    batch = PrivateBatch(ledger, Poisson(0.05), {"x": 1.0, "eta": 3.0}, rng=torch.Generator())
    batch.gaussian("x", zeros(3), normalizer=1.0)
    batch.gaussian("eta", zeros(1), normalizer=1.0)
    assert ledger.counts == {Step(Poisson(0.05), (Gaussian(1.0, name="x"), Gaussian(3.0, name="eta"))): 1}
    with pytest.raises(ConfigError, match="already made"):
        batch.gaussian("x", zeros(3), normalizer=1.0)
    with pytest.raises(ConfigError, match="not declared"):
        batch.gaussian("other", zeros(3), normalizer=1.0)


def test_refused_step_draws_no_noise_and_records_nothing():
    step = Step(FullBatch(), (Gaussian(1.0, name="grad"),))
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=10.0, planned={step: 3})
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        PrivateBatch(ledger, FullBatch(), {"grad": 1.0}, rng=g).gaussian("grad", zeros(2), normalizer=1.0)
    state = g.get_state()
    with pytest.raises(PrivacyBudgetExceeded):
        for _ in range(1000):
            PrivateBatch(ledger, FullBatch(), {"grad": 1.0}, rng=g).gaussian("grad", zeros(2), normalizer=1.0)
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
    out = batch.gaussian("grad", BoundedSum(torch.ones(4), bound=1.0), normalizer=2.0)
    assert torch.equal(out, torch.full((4,), 0.5))


def test_bad_arguments():
    ledger = PrivacyLedger(delta=1e-5)
    with pytest.raises(ConfigError):
        PrivateBatch(ledger, Poisson(0.1), {}, rng=torch.Generator())
    batch = PrivateBatch(ledger, Poisson(0.1), {"g": 1.0}, rng=torch.Generator())
    with pytest.raises(ConfigError, match="normalizer"):
        batch.gaussian("g", zeros(1), normalizer=0.0)


# ----------------------------------------------------------------------------- audit hooks
def test_release_observers_see_every_release_with_its_parameters():
    ledger = PrivacyLedger(delta=1e-5)
    seen, outer = [], []
    with observe_releases(outer.append):
        with observe_releases(seen.append):
            batch = PrivateBatch(ledger, Poisson(0.2), {"a": 2.0, "b": 0.5}, rng=TorchSource(seed=0))
            out_a = batch.gaussian("a", BoundedSum(torch.ones(3), bound=0.3), normalizer=4.0)
            batch.gaussian("b", BoundedSum(torch.ones(1), bound=1.0), normalizer=2.0)
        PrivateBatch(ledger, FullBatch(), {"c": 1.0}, rng=TorchSource(seed=1)).gaussian("c", zeros(2), normalizer=1.0)
    PrivateBatch(ledger, FullBatch(), {"d": 1.0}, rng=TorchSource(seed=1)).gaussian("d", zeros(2), normalizer=1.0)
    assert [e.name for e in seen] == ["a", "b"] and [e.name for e in outer] == ["a", "b", "c"]
    a = seen[0]
    assert a.noise_std == pytest.approx(0.6) and a.bound == 0.3 and a.normalizer == 4.0
    assert a.sampling == Poisson(0.2)
    assert torch.equal(a.value, out_a)
    a.value.zero_()  # observers get a copy: the algorithm's tensor is untouched
    assert not torch.equal(a.value, out_a)


def test_insecure_noise_scaling_is_test_only_and_scales_the_noise():
    def draw(scale=None):
        rng = TorchSource(seed=5)
        if scale is None:
            return gaussian_noise_like(torch.zeros(5000), std=2.0, rng=rng)
        with pytest.warns(RuntimeWarning, match="NOT private"), insecure_scale_noise_for_testing(scale):
            return gaussian_noise_like(torch.zeros(5000), std=2.0, rng=rng)

    full, broken = draw(), draw(0.1)
    torch.testing.assert_close(broken, 0.1 * full)
    torch.testing.assert_close(draw(), full)  # back to normal after the context
    with pytest.raises(ConfigError), insecure_scale_noise_for_testing(-1.0):
        pass


def test_the_noise_switch_is_not_reachable_from_the_library():
    # Only the release module defines it: no config key, CLI option or algorithm can turn it on.
    from pathlib import Path

    import privopt

    root = Path(privopt.__file__).parent
    users = [p for p in root.rglob("*.py") if "insecure_scale_noise_for_testing" in p.read_text()]
    assert [p.relative_to(root).as_posix() for p in users] == ["grads/release.py"]
