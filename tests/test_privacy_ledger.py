"""PrivacyLedger: the budget guard, its cheap path, and exact JSON round trips."""

import json

import pytest

import privopt.privacy.ledger as ledger_mod
from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.privacy import (
    FullBatch,
    Gaussian,
    Laplace,
    Poisson,
    PrivacyLedger,
    PureDP,
    Step,
    WithoutReplacement,
    epsilon_of,
)

GRAD = Step(Poisson(0.1), (Gaussian(3.0, name="grad"),))
SEL = Step(FullBatch(), (PureDP(0.05, name="select"), Laplace(40.0, name="losses")))


@pytest.fixture
def count_calls(monkeypatch):
    calls = []
    real = ledger_mod._acc.epsilon_of

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ledger_mod._acc, "epsilon_of", spy)
    return calls


def test_guard_refuses_the_over_budget_step_and_leaves_counts_unchanged():
    target = epsilon_of({GRAD: 30}, delta=1e-5).epsilon  # exactly 30 steps fit
    led = PrivacyLedger(delta=1e-5, target_epsilon=target)
    for _ in range(30):
        led.record(GRAD)
    before = led.counts
    with pytest.raises(PrivacyBudgetExceeded, match="would make it") as info:
        led.record(GRAD)
    assert led.counts == before and led.num_steps == 30
    assert info.value.spent == pytest.approx(target) and info.value.would_be > target == info.value.target
    # a different, cheaper step may still fit... or not: either way the state stays consistent
    with pytest.raises(PrivacyBudgetExceeded):
        led.record(Step(FullBatch(), (Gaussian(1.0, name="big"),)))
    assert led.counts == before
    assert led.epsilon() <= target


def test_planned_schedule_needs_no_accountant_call(count_calls):
    planned = {GRAD: 300, SEL: 30}
    led = PrivacyLedger(delta=1e-5, target_epsilon=10.0, planned=planned)
    assert len(count_calls) == 1  # the one-off check of the plan
    for i in range(300):
        led.record(GRAD)
        if i % 10 == 0:
            led.record(SEL)
    assert len(count_calls) == 1
    assert led.counts == planned
    assert led.epsilon() == epsilon_of(planned, delta=1e-5).epsilon


def test_beyond_plan_costs_logarithmically_many_calls(count_calls):
    led = PrivacyLedger(delta=1e-5, target_epsilon=50.0)
    for _ in range(2000):
        led.record(GRAD)
    assert len(count_calls) <= 25
    assert led.num_steps == 2000


def test_unguarded_ledger_records_everything():
    led = PrivacyLedger(delta=1e-5)
    for _ in range(5):
        led.record(SEL)
    assert led.num_steps == 5 and led.target_epsilon is None
    assert led.epsilon() > 0


def test_plan_over_target_is_a_config_error():
    with pytest.raises(ConfigError, match="planned schedule"):
        PrivacyLedger(delta=1e-5, target_epsilon=0.5, planned={GRAD: 1000})


def test_json_round_trip_is_exact():
    led = PrivacyLedger(delta=1e-5, accountant="pld", target_epsilon=8.0, planned={GRAD: 50, SEL: 5})
    for _ in range(20):
        led.record(GRAD)
    led.record(SEL)
    text = json.dumps(led.to_dict())
    back = PrivacyLedger.from_dict(json.loads(text))
    assert back.to_dict() == led.to_dict()
    assert list(back.counts.items()) == list(led.counts.items())
    assert back.planned == led.planned and back.target_epsilon == 8.0 and back.accountant == "pld"
    assert back.epsilon() == led.epsilon()
    # the restored guard keeps working (and still uses the plan)
    back.record(GRAD)
    assert back.counts[GRAD] == 21


def test_round_trip_replace_one_without_plan():
    step = Step(WithoutReplacement(1000, 10), (Gaussian(2.0, name="g"),))
    led = PrivacyLedger(delta=1e-6, neighbouring="replace_one")
    for _ in range(3):
        led.record(step)
    back = PrivacyLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert back.counts == {step: 3} and back.neighbouring == "replace_one"
    assert back.spent() == led.spent() and back.spent().accountant == "rdp"


def test_restoring_an_over_budget_record_fails():
    led = PrivacyLedger(delta=1e-5)
    for _ in range(100):
        led.record(GRAD)
    d = led.to_dict()
    d["target_epsilon"] = 0.5
    with pytest.raises(ConfigError, match="restored"):
        PrivacyLedger.from_dict(d)
    with pytest.raises(ConfigError):
        PrivacyLedger.from_dict({"delta": 1e-5})
    with pytest.raises(ConfigError):
        PrivacyLedger.from_dict({**d, "counts": [{"step": {"sampling": {"kind": "bogus"}}, "count": 1}]})


def test_summary_counts_releases_per_name():
    led = PrivacyLedger(delta=1e-5)
    for _ in range(4):
        led.record(GRAD)
    led.record(SEL)
    s = led.summary()
    assert s["releases"] == {"grad": 4, "select": 1, "losses": 1}
    assert s["num_steps"] == 5 and s["epsilon"] == led.epsilon()
    json.dumps(s)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(delta=0.0),
        dict(delta=float("nan")),
        dict(delta=1e-5, target_epsilon=-1.0),
        dict(delta=1e-5, target_epsilon=float("nan")),
        dict(delta=1e-5, neighbouring="swap"),
        dict(delta=1e-5, accountant="moments"),
        dict(delta=1e-5, planned={GRAD: -3}),
        dict(delta=1e-5, planned={GRAD: 3}, neighbouring="replace_one"),  # Poisson needs add/remove
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ConfigError):
        PrivacyLedger(**kwargs)


def test_record_rejects_non_steps():
    led = PrivacyLedger(delta=1e-5, target_epsilon=1.0)
    with pytest.raises(ConfigError):
        led.record("grad")
    with pytest.raises(ConfigError, match="add_remove"):
        PrivacyLedger(delta=1e-5, neighbouring="replace_one").record(GRAD)
