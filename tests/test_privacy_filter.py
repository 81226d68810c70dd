"""RDP filter (fully adaptive composition) and the ledger's filter mode."""

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy import (
    FullBatch,
    Gaussian,
    Laplace,
    Poisson,
    PrivacyLedger,
    RdpFilter,
    Step,
    calibrate,
    epsilon_of,
    rdp_curve,
)
from privopt.privacy.inventory import Inventory, PlannedStep

REFRESH = Step(Poisson(0.1), (Gaussian(6.0, name="refresh"),))
INCREMENT = Step(Poisson(0.01), (Gaussian(3.0, name="increment"),))
PLAN = {REFRESH: 10, INCREMENT: 400}


def test_budget_converts_exactly_to_the_target():
    for order in (8.0, 16.0, 64.0):
        filt = RdpFilter(epsilon=2.0, delta=1e-5, order=order)
        eps, _ = rdp_privacy_accountant.compute_epsilon([order], [filt.budget], 1e-5)
        assert eps <= 2.0 and eps == pytest.approx(2.0, rel=1e-12)
        assert filt.certified().epsilon == eps and filt.certified().accountant == "rdp_filter"


def test_cost_is_dp_accountings_rdp_at_the_order():
    filt = RdpFilter(epsilon=2.0, delta=1e-5, order=12.0)
    acc = rdp_privacy_accountant.RdpAccountant(orders=[12.0])
    acc.compose(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(6.0)))
    assert filt.cost(REFRESH) == pytest.approx(acc.rdp[0], rel=1e-12)


def run_adaptive(seed, *, target=2.0, delta=1e-5):
    """Ada-DP-SPIDER-like loop: a refresh when the (noisy) drift is large, else an increment.

    Which steps run, and how many, depend on the released values; the loop only stops when the
    filter refuses even the cheap step."""
    rng = np.random.default_rng(seed)
    filt = RdpFilter.for_plan(PLAN, epsilon=target, delta=delta)
    drift, history = 0.0, []
    while True:
        step = REFRESH if drift > 1.0 else INCREMENT
        if not filt.fits(step):
            step = INCREMENT  # adapt: a refused refresh may still leave room for increments
        before = filt.counts
        try:
            filt.record(step)
        except PrivacyBudgetExceeded:
            assert filt.counts == before  # nothing recorded for the refused step
            return filt, history
        released = rng.normal(0.0, 1.0) + (0.5 if step is INCREMENT else -2.0)  # "noisy output"
        drift = max(0.0, drift + released)
        history.append(step.names[0])
        assert filt.spent <= filt.budget
        assert filt.certified().epsilon <= target


@pytest.mark.parametrize("seed", range(4))
def test_epsilon_never_exceeds_the_target_for_data_dependent_steps(seed):
    target, delta = 2.0, 1e-5
    filt, history = run_adaptive(seed, target=target, delta=delta)
    assert filt.spent <= filt.budget and filt.certified().epsilon <= target
    # the realised steps, accounted as if they had been planned, are within the target too
    realised = filt.counts
    assert sum(realised.values()) == len(history)
    assert epsilon_of(realised, delta=delta, accountant="rdp").epsilon <= target
    assert rdp_curve(realised, orders=[filt.order])[0] == pytest.approx(filt.spent, rel=1e-9)
    # the budget is (nearly) used up: not even one more increment fits
    assert not filt.fits(INCREMENT) and filt.spent > filt.budget - filt.cost(INCREMENT)


def test_the_sequence_really_depends_on_the_data():
    runs = [run_adaptive(seed)[1] for seed in range(4)]
    assert len({tuple(h) for h in runs}) > 1
    assert len({h.count("refresh") for h in runs}) > 1


def test_for_plan_picks_the_plans_best_order_and_refuses_plans_over_target():
    filt = RdpFilter.for_plan(PLAN, epsilon=2.0, delta=1e-5)
    _, best_order = rdp_privacy_accountant.compute_epsilon(
        [a for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS if a > 1.01],
        rdp_curve(PLAN, orders=[a for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS if a > 1.01]),
        1e-5,
    )
    assert filt.order == best_order
    for step, count in PLAN.items():  # the whole plan fits
        for _ in range(count):
            filt.record(step)
    with pytest.raises(ConfigError, match="plan alone"):
        RdpFilter.for_plan({REFRESH: 10_000}, epsilon=1.0, delta=1e-5)
    with pytest.raises(ConfigError, match="non-empty"):
        RdpFilter.for_plan({}, epsilon=1.0, delta=1e-5)


def test_noise_calibrated_with_rdp_for_the_plan_fits_the_filter():
    inv = Inventory(
        (PlannedStep(Poisson(0.1), (("refresh", 2.0),), 10), PlannedStep(Poisson(0.01), (("inc", 1.0),), 400))
    )
    cal = calibrate(inv, epsilon=1.0, delta=1e-5, accountant="rdp")
    plan = inv.steps_for(cal.noise)
    filt = RdpFilter.for_plan(plan, epsilon=1.0, delta=1e-5)
    assert filt.spent == 0.0
    filt.restore(plan)
    assert filt.spent <= filt.budget and filt.spent == pytest.approx(filt.budget, rel=1e-3)


def test_filter_admits_laplace_and_pure_steps_too():
    filt = RdpFilter(epsilon=1.0, delta=1e-6, order=16.0)
    losses = Step(FullBatch(), (Laplace(20.0, name="losses"),))
    n = 0
    while filt.fits(losses):
        filt.record(losses)
        n += 1
    assert n > 10 and filt.certified().epsilon <= 1.0
    with pytest.raises(PrivacyBudgetExceeded):
        filt.record(losses)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(epsilon=1.0, delta=1e-5, order=1.0), "order"),
        (dict(epsilon=1.0, delta=1e-5, order=float("nan")), "order"),
        (dict(epsilon=0.01, delta=1e-9, order=2.0), "cannot certify"),
        (dict(epsilon=1.0, delta=0.0, order=8.0), "delta"),
    ],
)
def test_bad_filter_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RdpFilter(**kwargs)


def test_ledger_filter_mode_guards_and_round_trips():
    led = PrivacyLedger(delta=1e-5, target_epsilon=2.0, planned=PLAN, mode="filter")
    assert led.mode == "filter" and led.filter.order > 1
    for _ in range(30):
        led.record(REFRESH)
    for _ in range(100):
        led.record(INCREMENT)
    assert led.epsilon() <= 2.0 and led.spent().accountant == "rdp_filter"
    d = json.loads(json.dumps(led.to_dict()))
    assert d["mode"] == "filter" and d["filter_order"] == led.filter.order
    back = PrivacyLedger.from_dict(d)
    assert back.counts == led.counts and back.filter.spent == pytest.approx(led.filter.spent, rel=1e-12)
    assert back.summary()["filter"]["order"] == led.filter.order
    with pytest.raises(PrivacyBudgetExceeded):
        while True:
            back.record(REFRESH)
    assert back.filter.spent <= back.filter.budget
    # a record that spends more than the filter's budget cannot be restored
    exhausted = back.to_dict()
    exhausted["target_epsilon"] = 1.0
    with pytest.raises(ConfigError, match="budget"):
        PrivacyLedger.from_dict(exhausted)


def test_plan_mode_records_still_load_and_filter_mode_needs_its_inputs():
    plan_led = PrivacyLedger(delta=1e-5, target_epsilon=5.0)
    plan_led.record(REFRESH)
    d = plan_led.to_dict()
    assert "mode" not in d  # the checkpoint format of plan mode is unchanged
    assert PrivacyLedger.from_dict(d).mode == "plan"
    with pytest.raises(ConfigError, match="target_epsilon"):
        PrivacyLedger(delta=1e-5, mode="filter", filter_order=8.0)
    with pytest.raises(ConfigError, match="planned"):
        PrivacyLedger(delta=1e-5, target_epsilon=1.0, mode="filter")
    with pytest.raises(ConfigError, match="mode"):
        PrivacyLedger(delta=1e-5, mode="odometer")
    led = PrivacyLedger(delta=1e-5, target_epsilon=1.0, mode="filter", filter_order=16.0)
    assert math.isfinite(led.epsilon()) and led.epsilon() <= 1.0
