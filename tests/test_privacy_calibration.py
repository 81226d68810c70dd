"""Calibration: reference noise values (docs/accounting.md, "Reference values"), inventories, infeasible targets."""

import json
import math

import pytest

from privopt.errors import ConfigError
from privopt.privacy import (
    Calibration,
    FullBatch,
    Gaussian,
    Inventory,
    Laplace,
    PlannedStep,
    Poisson,
    PureDP,
    SingleRecord,
    Step,
    WithoutReplacement,
    calibrate,
    dp_sgd_noise,
    epsilon_of,
    gaussian_noise_multiplier,
)


def dpsgd_inventory(q=0.1, steps=512):
    return Inventory((PlannedStep(Poisson(q), (("grad", 1.0),), steps),))


def test_reference_dpsgd_calibration_pld(monkeypatch):
    cal = calibrate(dpsgd_inventory(), epsilon=1.0, delta=1e-6)
    assert cal.accountant == "pld"
    assert round(cal.noise["grad"], 3) == 9.662
    assert cal.scale == cal.noise["grad"]
    # achieved epsilon is at most the target and tight (a 0.1% smaller noise violates it)
    assert cal.epsilon <= 1.0
    steps = dpsgd_inventory().steps_for(cal.noise)
    assert epsilon_of(steps, delta=1e-6).epsilon == cal.epsilon
    smaller = dpsgd_inventory().steps_for({"grad": cal.noise["grad"] * 0.999})
    assert epsilon_of(smaller, delta=1e-6).epsilon > 1.0
    # cached: the second call evaluates no epsilon and returns an independent copy
    import privopt.privacy.calibration as cal_mod

    def no_accounting(*a, **kw):
        raise AssertionError("a cached calibration must not run the accountant")

    monkeypatch.setattr(cal_mod, "epsilon_of", no_accounting)
    again = calibrate(dpsgd_inventory(), epsilon=1.0, delta=1e-6)
    assert again == cal and again.noise is not cal.noise


def test_analytic_gaussian_reference_values():
    for eps, ref, classical in [(0.5, 7.032, 9.690), (1.0, 3.731, 4.845), (2.0, 1.994, 2.422)]:
        z = gaussian_noise_multiplier(epsilon=eps, delta=1e-5)
        assert round(z, 3) == ref
        assert round(math.sqrt(2 * math.log(1.25 / 1e-5)) / eps, 3) == classical
        # it is exactly tight: the PLD accountant puts that single release at eps
        assert epsilon_of({Step(FullBatch(), (Gaussian(z),)): 1}, delta=1e-5).epsilon == pytest.approx(eps, abs=2e-4)


def svrg_inventory(n=200_000, inner_steps=75_000, snapshot_sensitivity=2.0):
    # DP-SVRG (docs/accounting.md, "Reference values"). Each inner step releases one Gaussian vector whose noise
    # std sigma is split equally in variance between two accounted parts: sigma1 = sigma2 = sigma/sqrt(2).
    #  * one-sample difference grad f(x, z_i) - grad f(x~, z_i): a uniformly drawn record
    #    (SingleRecord(n) = Poisson(1/n) under add/remove), per-record bound 2G:
    #    z_diff = sigma1 / (2G) = scale / sqrt(2) with scale = sigma / (2G);
    #  * the snapshot mean gradient: non-subsampled, sensitivity 2G/n (as in the reference):
    #    z_snap = sigma2 / (2G/n) = n * scale / sqrt(2)  (ratio n / sqrt(2)).
    # Both are released at every one of the T*m inner steps.
    r = 1 / math.sqrt(2)
    return Inventory(
        (
            PlannedStep(SingleRecord(n), (("diff", r),), inner_steps),
            PlannedStep(FullBatch(), (("snapshot", n * r * 2.0 / snapshot_sensitivity),), inner_steps),
        )
    )


def test_reference_dp_svrg_values_rdp():
    inv = svrg_inventory()
    got = {eps: calibrate(inv, epsilon=eps, delta=1e-3, accountant="rdp") for eps in (0.2, 0.5, 1.0)}
    assert {eps: round(c.scale, 3) for eps, c in got.items()} == {0.2: 1.184, 0.5: 0.854, 1.0: 0.675}
    assert {eps: round(2 * c.scale, 2) for eps, c in got.items()} == {0.2: 2.37, 0.5: 1.71, 1.0: 1.35}
    assert all(c.accountant == "rdp" and c.epsilon <= eps for eps, c in got.items())
    # the snapshot part is negligible (its noise is n times larger relative to its sensitivity),
    # so modelling its sensitivity as G/n (add/remove) instead of 2G/n changes nothing visible
    alt = calibrate(svrg_inventory(snapshot_sensitivity=1.0), epsilon=0.5, delta=1e-3, accountant="rdp")
    assert alt.scale == pytest.approx(got[0.5].scale, rel=1e-3)


def test_ratios_and_shared_families():
    inv = Inventory(
        (
            PlannedStep(FullBatch(), (("a", 1.0), ("b", 2.0)), 20),
            PlannedStep(Poisson(0.2), (("b", 2.0),), 10),
        )
    )
    assert inv.names == ("a", "b")
    cal = calibrate(inv, epsilon=2.0, delta=1e-5)
    assert cal.noise["b"] == pytest.approx(2 * cal.noise["a"])
    assert cal.epsilon <= 2.0
    over = calibrate(inv, epsilon=2.0, delta=1e-5, ratios={"b": 1.0})
    assert over.noise["b"] == pytest.approx(over.noise["a"])
    # more noise on b lets a get away with less
    assert cal.noise["a"] < over.noise["a"]
    with pytest.raises(ConfigError, match="inconsistent"):
        Inventory((PlannedStep(FullBatch(), (("a", 1.0),), 1), PlannedStep(Poisson(0.1), (("a", 2.0),), 1)))
    with pytest.raises(ConfigError, match="unknown family"):
        calibrate(inv, epsilon=2.0, delta=1e-5, ratios={"c": 1.0})


def test_steps_for_builds_named_gaussians_and_keeps_fixed_mechanisms():
    lap = Laplace(5.0, name="losses")
    inv = Inventory(
        (
            PlannedStep(Poisson(0.01), (("grad", 1.0),), 100),
            PlannedStep(FullBatch(), (lap,), 100),
            PlannedStep(FullBatch(), (("grad", 1.0),), 0),
        )
    )
    steps = inv.steps_for({"grad": 2.0})
    assert steps == {Step(Poisson(0.01), (Gaussian(2.0, name="grad"),)): 100, Step(FullBatch(), (lap,)): 100}
    with pytest.raises(ConfigError, match="grad"):
        inv.steps_for({})


def test_inventory_json_round_trip():
    inv = Inventory(
        (
            PlannedStep(Poisson(0.01), (("grad", 1.0), PureDP(0.1, name="select")), 100),
            PlannedStep(WithoutReplacement(1000, 10), (("g2", 0.5),), 7),
            PlannedStep(SingleRecord(1000), (Laplace(3.0, name="l"),), 3),
        )
    )
    back = Inventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert back == inv and hash(back) == hash(inv)


def test_infeasible_target_raises_helpful_error():
    # the fixed pure-DP release alone already spends ~2 > 1
    inv = Inventory(
        (
            PlannedStep(FullBatch(), (PureDP(2.0, name="fixed"),), 1),
            PlannedStep(Poisson(0.1), (("grad", 1.0),), 10),
        )
    )
    with pytest.raises(ConfigError, match="infeasible"):
        calibrate(inv, epsilon=1.0, delta=1e-5)
    with pytest.raises(ConfigError, match="no calibrated"):
        calibrate(Inventory((PlannedStep(FullBatch(), (PureDP(0.1),), 1),)), epsilon=1.0, delta=1e-5)


def test_dp_sgd_noise_poisson_and_wor():
    cal = dp_sgd_noise(dataset_size=10_000, batch_size=1_000, steps=512, epsilon=1.0, delta=1e-6)
    assert isinstance(cal, Calibration)
    assert cal.noise["gradient"] == calibrate(dpsgd_inventory(), epsilon=1.0, delta=1e-6).noise["grad"]
    wor = dp_sgd_noise(dataset_size=10_000, batch_size=100, steps=100, epsilon=2.0, delta=1e-5, sampling="wor")
    assert wor.accountant == "rdp" and wor.neighbouring == "replace_one" and wor.epsilon <= 2.0
    # replace-one doubles the sensitivity, so it needs more noise than add/remove Poisson at the same rate
    poi = dp_sgd_noise(dataset_size=10_000, batch_size=100, steps=100, epsilon=2.0, delta=1e-5, accountant="rdp")
    assert wor.noise["gradient"] > poi.noise["gradient"]
    with pytest.raises(ConfigError, match="rdp"):
        dp_sgd_noise(
            dataset_size=10_000, batch_size=100, steps=10, epsilon=1.0, delta=1e-5, sampling="wor", accountant="pld"
        )
    with pytest.raises(ConfigError, match="batch_size"):
        dp_sgd_noise(dataset_size=10, batch_size=100, steps=10, epsilon=1.0, delta=1e-5)
    with pytest.raises(ConfigError, match="sampling"):
        dp_sgd_noise(dataset_size=10, batch_size=1, steps=10, epsilon=1.0, delta=1e-5, sampling="shuffle")


@pytest.mark.parametrize(
    "kw",
    [
        dict(epsilon=0.0, delta=1e-5),
        dict(epsilon=1.0, delta=0.0),
        dict(epsilon=float("nan"), delta=1e-5),
        dict(epsilon=1.0, delta=float("nan")),
    ],
)
def test_bad_targets(kw):
    with pytest.raises(ConfigError):
        calibrate(dpsgd_inventory(), **kw)
    with pytest.raises(ConfigError):
        gaussian_noise_multiplier(**kw)


def test_bad_planned_steps():
    with pytest.raises(ConfigError, match="count"):
        PlannedStep(Poisson(0.1), (("g", 1.0),), -1)
    with pytest.raises(ConfigError, match="ratio"):
        PlannedStep(Poisson(0.1), (("g", 0.0),), 1)
    with pytest.raises(ConfigError, match="ratio"):
        PlannedStep(Poisson(0.1), (("g", float("nan")),), 1)
    with pytest.raises(ConfigError, match="sampling"):
        PlannedStep("poisson", (("g", 1.0),), 1)
    with pytest.raises(ConfigError):
        PlannedStep(Poisson(0.1), (), 1)
    with pytest.raises(ConfigError):
        calibrate("inventory", epsilon=1.0, delta=1e-5)
