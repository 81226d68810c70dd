"""A run that stops before the end of its plan, on a decision read from its own releases, is a
truncation of the planned run (post-processing of it): its DP guarantee is the plan's ε, and the ε
of the releases it made is only ex-post. Ledgers say so (``guarantee()``), records too."""

import json

import pytest

from privopt.privacy import FullBatch, Gaussian, Poisson, PrivacyLedger, Step, epsilon_of
from privopt.privacy.parallel import ParallelLedger
from privopt.training.outputs import EX_POST_NOTE, privacy_section
from sosp_helpers import run_to_end
from test_gauss_psgd import _toy_run

STEP = Step(Poisson(0.01), (Gaussian(1.0),))


def test_a_plan_mode_ledger_guarantees_its_whole_plan():
    ledger = PrivacyLedger(delta=1e-5, planned={STEP: 100})
    for _ in range(30):
        ledger.record(STEP)
    full = epsilon_of({STEP: 100}, delta=1e-5).epsilon
    assert ledger.epsilon() == pytest.approx(epsilon_of({STEP: 30}, delta=1e-5).epsilon)
    assert ledger.guarantee().epsilon == pytest.approx(full) and full > ledger.epsilon()
    for _ in range(80):  # beyond the plan (no target): what it spent
        ledger.record(STEP)
    assert ledger.guarantee().epsilon == pytest.approx(ledger.epsilon())
    assert PrivacyLedger(delta=1e-5).guarantee().epsilon == 0.0  # no plan: what it spent


def test_a_parallel_ledger_guarantees_its_planned_passes():
    step = Step(FullBatch(), (Gaussian(3.0),))
    ledger = ParallelLedger(delta=1e-5, planned={step: 4})
    ledger.begin_pass()
    assert ledger.guarantee().epsilon == pytest.approx(epsilon_of({step: 4}, delta=1e-5).epsilon)
    assert ledger.guarantee().epsilon > ledger.epsilon() > 0


class _Cfg:
    class privacy:  # the attribute layout of a RunConfig
        epsilon, delta, neighbouring = 4.0, 1e-5, "add_remove"


def test_a_certified_early_stop_publishes_the_plans_epsilon_as_its_guarantee():
    run = _toy_run((0.0, 1.0), epochs=4)  # starts at a minimum: certified after the first pass
    run_to_end(run)
    assert run.algo.certified is True and run.ledger.passes < 4
    rec = json.loads(json.dumps(privacy_section(_Cfg, run.ledger)))
    assert rec["epsilon_spent"] < rec["epsilon_guarantee"] <= 4.0
    assert rec["epsilon_guarantee"] == pytest.approx(run.ledger._eps(4).epsilon)
    assert rec["epsilon_spent_is_ex_post"] == EX_POST_NOTE


def test_a_run_that_completes_its_plan_has_one_epsilon():
    ledger = PrivacyLedger(delta=1e-5, planned={STEP: 10})
    for _ in range(10):
        ledger.record(STEP)
    rec = privacy_section(_Cfg, ledger)
    assert rec["epsilon_guarantee"] == rec["epsilon_spent"] and "epsilon_spent_is_ex_post" not in rec


def test_a_running_runs_checkpoint_record_is_not_flagged_as_stopped():
    ledger = PrivacyLedger(delta=1e-5, planned={STEP: 10})
    for _ in range(3):
        ledger.record(STEP)
    running = privacy_section(_Cfg, ledger, spent=ledger.spent())  # a checkpoint passes its cheap bound
    assert running["epsilon_spent"] < running["epsilon_guarantee"]
    assert "epsilon_spent_is_ex_post" not in running and running["epsilon_spent_method"] != "exact"
    stopped = privacy_section(_Cfg, ledger)  # the same ledger in a final record: stopped early
    assert stopped["epsilon_spent_is_ex_post"] == EX_POST_NOTE
