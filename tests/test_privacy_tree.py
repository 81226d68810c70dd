"""Tree aggregation (DP-FTRL) events, and Laplace / pure-DP releases composed with Gaussians."""

import json

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy import (
    FullBatch,
    Gaussian,
    Inventory,
    Laplace,
    PlannedStep,
    Poisson,
    PrivacyLedger,
    PureDP,
    Step,
    TreeAggregation,
    calibrate,
    epsilon_of,
    step_from_dict,
    to_dp_event,
    tree_family,
)

ZERO_OUT = dpa.NeighboringRelation.REPLACE_SPECIAL


def rdp_eps(event, delta, relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE):
    acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(delta)


def tree_step(z=3.0, steps=1000):
    return Step(FullBatch(), (TreeAggregation(z, steps=steps, name="ftrl"),))


def test_tree_matches_dp_accounting_single_epoch_event():
    for steps, passes in [(1000, 1), ((500, 500), 1), (255, 3)]:
        ours = epsilon_of({tree_step(3.0, steps): passes}, delta=1e-6)
        assert ours.accountant == "rdp"  # PLD has no tree-aggregation event
        native = dpa.SelfComposedDpEvent(
            dpa.SingleEpochTreeAggregationDpEvent(3.0, list(steps) if isinstance(steps, tuple) else steps), passes
        )
        assert ours.epsilon == pytest.approx(rdp_eps(native, 1e-6, ZERO_OUT), rel=1e-12)
    with pytest.raises(ConfigError, match="rdp"):
        epsilon_of({tree_step(): 1}, delta=1e-6, accountant="pld")


def test_tree_under_replace_one_doubles_the_sensitivity():
    ours = epsilon_of({tree_step(4.0): 1}, delta=1e-6, neighbouring="replace_one").epsilon
    assert ours == pytest.approx(rdp_eps(dpa.SingleEpochTreeAggregationDpEvent(2.0, 1000), 1e-6, ZERO_OUT), rel=1e-12)
    assert to_dp_event(tree_step(4.0), neighbouring="replace_one") == dpa.SingleEpochTreeAggregationDpEvent(2.0, [1000])


def test_dp_ftrl_with_exp3_losses_composes_like_dp_accounting():
    # DP-OCO + EXP3: one tree over the w-player's gradients, T Laplace-privatised bandit losses.
    T, z, b = 1023, 5.0, 40.0
    schedule = {tree_step(z, T): 1, Step(FullBatch(), (Laplace(b, name="loss"),)): T}
    native = dpa.ComposedDpEvent(
        [dpa.SingleEpochTreeAggregationDpEvent(z, T), dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(b), T)]
    )
    assert epsilon_of(schedule, delta=1e-6).epsilon == pytest.approx(rdp_eps(native, 1e-6, ZERO_OUT), rel=1e-12)
    led = PrivacyLedger(delta=1e-6, target_epsilon=10.0, planned=schedule)
    led.record(tree_step(z, T))
    for _ in range(T):
        led.record(Step(FullBatch(), (Laplace(b, name="loss"),)))
    assert led.epsilon() == epsilon_of(schedule, delta=1e-6).epsilon <= 10.0


def test_tree_family_calibrates_like_dp_accountings_mechanism_calibration():
    T, eps, delta = 4095, 2.0, 1e-6
    inv = Inventory((PlannedStep(FullBatch(), (tree_family("ftrl", steps=T),), 1),))
    cal = calibrate(inv, epsilon=eps, delta=delta)
    reference = dpa.calibrate_dp_mechanism(
        lambda: rdp_privacy_accountant.RdpAccountant(neighboring_relation=ZERO_OUT),
        lambda z: dpa.SingleEpochTreeAggregationDpEvent(z, T),
        eps,
        delta,
        bracket_interval=dpa.LowerEndpointAndGuess(0.1, 1.0),
    )
    assert cal.accountant == "rdp" and cal.epsilon <= eps
    assert cal.noise["ftrl"] == pytest.approx(reference, rel=1e-4)
    back = Inventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert back == inv
    with pytest.raises(ConfigError, match="FullBatch"):
        PlannedStep(Poisson(0.1), (tree_family("ftrl", steps=T),), 1)


def test_tree_steps_validate_and_round_trip():
    step = Step(FullBatch(), (TreeAggregation(2.0, steps=(10, 20), name="t"), Laplace(3.0, name="l")))
    assert step_from_dict(json.loads(json.dumps(step.to_dict()))) == step
    for bad in (0, (), (5, -1), 2.5, True):
        with pytest.raises(ConfigError, match="steps"):
            TreeAggregation(1.0, steps=bad)
    with pytest.raises(ConfigError, match="FullBatch"):
        Step(Poisson(0.1), (TreeAggregation(1.0, steps=10),))


def test_laplace_and_pure_dp_compose_with_gaussians_in_the_ledger():
    # Noisy-SGD-MGR / AGS shape: Poisson-sampled gradients plus full-data Laplace group losses and
    # a report-noisy-max selection (pure DP) at every step.
    grad = Step(Poisson(0.01), (Gaussian(1.2, name="grad"),))
    losses = Step(FullBatch(), (Laplace(400.0, name="group-losses"),))
    select = Step(FullBatch(), (PureDP(0.002, name="select"),))
    schedule = {grad: 2000, losses: 2000, select: 2000}
    led = PrivacyLedger(delta=1e-5, target_epsilon=3.0, planned=schedule)
    for _ in range(2000):
        for s in (grad, losses, select):
            led.record(s)
    ours = led.spent()
    # dp_accounting directly: RDP sums the three curves (pure DP as randomized response), PLD
    # composes the Gaussian, the Laplace and the randomized-response coin as discrete Laplace.
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.2)), 2000))
    rdp.compose(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(400.0), 2000))
    rr = rdp_privacy_accountant.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    rr.compose(dpa.SelfComposedDpEvent(to_dp_event(select), 2000))
    rdp_eps_ = rdp_privacy_accountant.compute_epsilon(rdp.orders, rdp.rdp + rr.rdp, 1e-5)[0]
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.2)), 2000))
    pld.compose(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(400.0), 2000))
    pld.compose(dpa.SelfComposedDpEvent(dpa.dp_event.DiscreteLaplaceDpEvent(0.002, 1), 2000))
    assert ours.epsilon == pytest.approx(min(rdp_eps_, pld.get_epsilon(1e-5)), rel=2e-3)
    assert ours.epsilon <= rdp_eps_
    # each family adds privacy loss
    assert ours.epsilon > epsilon_of({grad: 2000}, delta=1e-5).epsilon
    with pytest.raises(PrivacyBudgetExceeded):
        while True:
            led.record(select)


def test_pure_dp_coin_is_exact_for_k_fold_composition():
    # k-fold composition of an eps0-DP worst case: privacy loss eps0 * (2 B - k), B ~ Bin(k, e^eps0/(1+e^eps0)).
    import math

    import numpy as np
    from scipy import optimize, stats

    eps0, k, delta = 0.05, 1000, 1e-5
    p = math.exp(eps0) / (1 + math.exp(eps0))
    b = np.arange(k + 1)
    loss, w = eps0 * (2 * b - k), stats.binom.pmf(b, k, p)
    exact = optimize.brentq(lambda e: np.sum(w * np.clip(1 - np.exp(e - loss), 0, None)) - delta, 0, eps0 * k)
    ours = epsilon_of({Step(FullBatch(), (PureDP(eps0),)): k}, delta=delta, accountant="pld").epsilon
    assert exact * (1 - 1e-9) <= ours <= exact * (1 + 1e-4)  # the grid divides eps0: no rounding
