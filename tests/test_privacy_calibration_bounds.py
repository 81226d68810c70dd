"""Calibration at the edges: huge epsilon, tiny delta, very long schedules, time budget, progress."""

import math

import pytest

from privopt.errors import ConfigError
from privopt.privacy import (
    CalibrationProgress,
    Inventory,
    PlannedStep,
    Poisson,
    calibrate,
    check_delta_for_size,
    dp_sgd_noise,
    epsilon_of,
)

N, B = 60_000, 256  # the README's `privopt account` example


def dpsgd(steps, **kw):
    # Exactness must not depend on how fast (or how loaded) the machine is: a generous search budget.
    kw.setdefault("time_limit", 600.0)
    return dp_sgd_noise(dataset_size=N, batch_size=B, steps=steps, **kw)


def steps_of(cal, steps):
    return Inventory((PlannedStep(Poisson(B / N), (("gradient", 1.0),), steps),)).steps_for(cal.noise)


def assert_consistent(cal, steps, delta):
    """What the ledger will recompute for the calibrated plan is the calibration's epsilon."""
    assert epsilon_of(steps_of(cal, steps), delta=delta).epsilon == cal.epsilon <= cal.target_epsilon


def test_tiny_delta_falls_back_to_rdp():
    cal = dpsgd(4690, epsilon=1.0, delta=1e-30)
    assert cal.accountant == "rdp" and not cal.extra
    assert cal.noise["gradient"] == pytest.approx(dpsgd(4690, epsilon=1.0, delta=1e-30, accountant="rdp").scale)
    assert cal.epsilon == pytest.approx(1.0, rel=1e-4)
    assert_consistent(cal, 4690, 1e-30)
    with pytest.raises(ConfigError, match="1e-15"):  # PLD alone cannot certify such a delta
        dpsgd(4690, epsilon=1.0, delta=1e-30, accountant="pld")


def test_huge_epsilon_answers_quickly_with_a_valid_noise():
    cal = dpsgd(4690, epsilon=1e6, delta=1e-5)
    rdp = dpsgd(4690, epsilon=1e6, delta=1e-5, accountant="rdp")
    assert cal.epsilon <= 1e6 and rdp.epsilon == pytest.approx(1e6, rel=1e-4)
    assert cal.noise["gradient"] <= rdp.noise["gradient"]  # the tighter of the two accountants
    assert_consistent(cal, 4690, 1e-5)


def test_long_schedule_is_calibrated_with_pld_and_close_to_target():
    cal = dpsgd(500_000, epsilon=1.0, delta=1e-5)
    rdp = dpsgd(500_000, epsilon=1.0, delta=1e-5, accountant="rdp")
    assert cal.accountant == "pld" and not cal.extra
    assert 0.99 <= cal.epsilon <= 1.0
    assert cal.noise["gradient"] < 0.97 * rdp.noise["gradient"]  # PLD's tighter bound, not 2x more noise
    assert_consistent(cal, 500_000, 1e-5)


@pytest.mark.slow
def test_two_million_steps_within_one_percent_of_target():
    cal = dpsgd(2_000_000, epsilon=1.0, delta=1e-5)
    rdp = dpsgd(2_000_000, epsilon=1.0, delta=1e-5, accountant="rdp")
    assert 0.99 <= cal.epsilon <= 1.0
    assert cal.noise["gradient"] <= rdp.noise["gradient"]


def test_time_limit_returns_a_valid_noise_and_says_so(monkeypatch):
    import privopt.privacy.calibration as calibration

    # The limit strikes right after the first PLD evaluation, whatever the machine's speed or load: the
    # deadline is moved into the past then (the check itself is a clock comparison; what it must
    # guarantee is tested here). A fixed short limit would not do: a warm PLD cache finishes in time.
    seen: list[CalibrationProgress] = []
    calibrators = []
    init = calibration._Calibrator.__init__

    def keep(self, *args, **kw):
        init(self, *args, **kw)
        calibrators.append(self)

    def expire_after_first_pld(p: CalibrationProgress):
        seen.append(p)
        if p.stage != "rdp":
            calibrators[-1].clock["deadline"] = float("-inf")

    monkeypatch.setattr(calibration._Calibrator, "__init__", keep)
    cal = dpsgd(300_000, epsilon=0.7, delta=1e-6, time_limit=600.0, progress=expire_after_first_pld)
    assert cal.epsilon <= 0.7 and cal.extra["complete"] is False
    assert_consistent_ish = epsilon_of(steps_of(cal, 300_000), delta=1e-6).epsilon
    assert assert_consistent_ish <= 0.7
    assert [p.evaluations for p in seen] == list(range(1, len(seen) + 1))
    assert seen[0].stage == "rdp" and all(p.elapsed >= 0 for p in seen)
    # an incomplete result is not cached: a later call with time to spare finishes the search
    monkeypatch.undo()
    full = dpsgd(300_000, epsilon=0.7, delta=1e-6)
    assert not full.extra and full.noise["gradient"] <= cal.noise["gradient"]


def test_progress_reports_every_evaluation_until_the_answer():
    seen = []
    inventory = Inventory((PlannedStep(Poisson(0.02), (("grad", 1.0),), 700),))
    cal = calibrate(
        inventory,
        epsilon=1.3,
        delta=1e-6,
        progress=seen.append,
    )
    assert seen and seen[-1].best_scale == cal.scale
    stages = [p.stage for p in seen]
    assert sorted(set(stages), key=stages.index) == ["rdp", "auto, coarse grid", "auto"]
    # the coarse grid only steers: two or three exact evaluations finish the search, and the
    # answer is the exact accountant's
    assert 1 <= stages.count("auto") <= 3
    assert cal.epsilon == epsilon_of(inventory.steps_for(cal.noise), delta=1e-6).epsilon <= 1.3
    assert all(p.best_scale is None or p.epsilon <= 1.3 or p.best_scale != p.scale for p in seen)
    assert "calibrating (rdp)" in seen[0].describe()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_time_limit(bad):
    with pytest.raises(ConfigError, match="time_limit"):
        dpsgd(100, epsilon=1.0, delta=1e-6, time_limit=bad)


def test_delta_must_be_below_one_over_n_unless_allowed():
    assert check_delta_for_size(1e-5, dataset_size=N) == 1e-5
    with pytest.raises(ConfigError, match="1/n"):
        check_delta_for_size(1.0 / N, dataset_size=N)
    assert check_delta_for_size(0.5, dataset_size=N, allow_large=True) == 0.5
    for bad in (dict(delta=0.0, dataset_size=N), dict(delta=1e-5, dataset_size=0), dict(delta=1e-5, dataset_size=1.5)):
        with pytest.raises(ConfigError):
            check_delta_for_size(**bad)


def test_infeasible_targets_still_explain_themselves():
    from privopt.privacy import FullBatch, PureDP

    inv = Inventory(
        (PlannedStep(FullBatch(), (PureDP(2.0, name="fixed"),), 1), PlannedStep(Poisson(0.1), (("grad", 1.0),), 10))
    )
    with pytest.raises(ConfigError, match="infeasible") as info:
        calibrate(inv, epsilon=1.0, delta=1e-5)
    assert math.isfinite(float(str(info.value).split("gives epsilon=")[1].split(" ")[0]))
