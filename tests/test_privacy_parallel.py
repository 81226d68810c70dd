"""Parallel composition over disjoint passes (privopt.privacy.ParallelLedger)."""

import pytest

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy import (
    FullBatch,
    Gaussian,
    Inventory,
    ParallelLedger,
    PlannedStep,
    Poisson,
    PrivacyLedger,
    Step,
    calibrate,
    epsilon_of,
    ledger_from_dict,
    make_ledger,
)

Z = 3.0
PASS = Step(FullBatch(), (Gaussian(Z, name="pass"),))
O1 = Step(FullBatch(), (Gaussian(Z, name="o1"),))
O2 = Step(FullBatch(), (Gaussian(Z, name="o2"),))


def test_single_pass_costs_one_release_whatever_the_number_of_parts():
    ledger = ParallelLedger(delta=1e-5, target_epsilon=10.0, planned={PASS: 3})
    ledger.begin_pass()
    for i in range(200):  # an adaptive mix of refreshes and increments, every record used once
        ledger.record(O1 if i % 7 == 0 else O2)
    one = epsilon_of({PASS: 1}, delta=1e-5).epsilon
    assert ledger.epsilon() == pytest.approx(one, rel=1e-12)
    # Sequential composition of the same releases (what a plan ledger would certify) is far larger.
    sequential = epsilon_of({O1: 29, O2: 171}, delta=1e-5).epsilon
    assert sequential > 5 * one
    assert ledger.num_steps == 200 and ledger.summary()["releases"] == {"o1": 29, "o2": 171}


@pytest.mark.parametrize("passes", [2, 3])
def test_multi_pass_composes_one_release_per_pass(passes):
    ledger = ParallelLedger(delta=1e-5, target_epsilon=10.0, planned={PASS: 3})
    for _ in range(passes):
        ledger.begin_pass()
        for _ in range(50):
            ledger.record(O2)
    assert ledger.epsilon() == pytest.approx(epsilon_of({PASS: passes}, delta=1e-5).epsilon, rel=1e-12)
    # Gaussian composition: `passes` passes at multiplier z are one Gaussian at z / sqrt(passes).
    single = epsilon_of({Step(FullBatch(), (Gaussian(Z / passes**0.5),)): 1}, delta=1e-5, accountant="pld").epsilon
    assert ledger.epsilon() == pytest.approx(single, rel=2e-3)
    assert ledger.epsilon() > epsilon_of({PASS: passes - 1}, delta=1e-5).epsilon


def test_passes_beyond_the_plan_or_target_are_refused_and_nothing_recorded():
    ledger = ParallelLedger(delta=1e-5, target_epsilon=10.0, planned={PASS: 2})
    ledger.begin_pass()
    ledger.begin_pass()
    before = ledger.epsilon()
    assert not ledger.fits_pass()
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.begin_pass()
    assert ledger.passes == 2 and ledger.epsilon() == before
    with pytest.raises(ConfigError, match="already spend"):
        ParallelLedger(delta=1e-5, target_epsilon=0.1, planned={PASS: 2})


def test_a_release_the_pass_does_not_bound_is_refused():
    ledger = ParallelLedger(delta=1e-5, planned={PASS: 1})
    with pytest.raises(ConfigError, match="begin_pass"):
        ledger.record(O1)
    ledger.begin_pass()
    with pytest.raises(ConfigError, match="below the pass step"):
        ledger.record(Step(FullBatch(), (Gaussian(Z / 2, name="o1"),)))
    with pytest.raises(ConfigError, match="below the pass step"):  # two Gaussians on one part: z/sqrt(2)
        ledger.record(Step(FullBatch(), (Gaussian(Z, name="a"), Gaussian(Z, name="b"))))
    with pytest.raises(ConfigError, match="full-batch Gaussian"):
        ledger.record(Step(Poisson(0.1), (Gaussian(Z),)))
    ledger.record(Step(FullBatch(), (Gaussian(2 * Z, name="o1"),)))  # more noise is fine
    assert ledger.num_steps == 1


def test_record_roundtrip_and_factories():
    inv = Inventory((PlannedStep(FullBatch(), (("pass", 1.0),), 4),), composition="parallel")
    assert Inventory.from_dict(inv.to_dict()) == inv
    cal = calibrate(inv, epsilon=1.0, delta=1e-5)
    ledger = make_ledger(inv, cal.noise, delta=1e-5, target_epsilon=1.0)
    assert isinstance(ledger, ParallelLedger)
    step = Step(FullBatch(), (Gaussian(cal.noise["pass"], name="o1"),))
    for _ in range(4):
        ledger.begin_pass()
        ledger.record(step)
    assert ledger.epsilon() <= 1.0
    restored = ledger_from_dict(ledger.to_dict())
    assert restored.to_dict() == ledger.to_dict() and restored.epsilon() == ledger.epsilon()
    plan = Inventory((PlannedStep(Poisson(0.1), (("g", 1.0),), 10),))
    assert isinstance(make_ledger(plan, {"g": 3.0}, delta=1e-5, target_epsilon=5.0), PrivacyLedger)
    filt = Inventory(plan.steps, composition="filter")
    assert make_ledger(filt, {"g": 3.0}, delta=1e-5, target_epsilon=5.0).mode == "filter"
    with pytest.raises(ConfigError, match="composition"):
        Inventory(plan.steps, composition="magic")
