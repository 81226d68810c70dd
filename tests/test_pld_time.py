"""One PLD evaluation takes bounded time however long the schedule, and stays a valid upper bound
(docs/accounting.md, "PLD or RDP"): no dp_accounting ``size ** count`` integer, a coarser grid
chosen by a public rule when a composition would be too large, the grid recorded; and a running
run's checkpoint records a cheap upper bound, named as such, while its final record is exact."""

import math

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_pmf

from privopt.privacy import Gaussian, Poisson, PrivacyLedger, Step, epsilon_of, pld_compose
from privopt.privacy import accountant as acc_mod
from privopt.training.outputs import SPENT_BOUND_METHOD, privacy_section

STEP = Step(Poisson(0.1), (Gaussian(3.0),))
PLD = dpa.pld.privacy_loss_distribution


@pytest.fixture
def fresh(monkeypatch):
    """No disk cache, empty in-process caches before and after (the budget is monkeypatched)."""
    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", "off")
    acc_mod._epsilon_cached.cache_clear()
    yield monkeypatch
    acc_mod._epsilon_cached.cache_clear()


def test_dense_switch_is_dp_accountings_rule_without_the_power():
    for size in (1, 2, 3, 31, 32, 999, 1000):
        pmf = pld_pmf.SparsePLDPmf(dict.fromkeys(range(size), 1.0 / size), 1e-3, 0.0, True)
        for count in (1, 2, 3, 9, 10, 11, 12, 5000):
            expected = size**count > 1000 if size > 1 else False
            assert pld_compose._goes_dense(pmf, count) == expected, (size, count)
    single = pld_pmf.SparsePLDPmf({0: 1.0}, 1e-3, 0.0, True)
    assert pld_compose._goes_dense(single, 10**7)  # dp_accounting would loop 10^7 times in Python


def test_a_long_sparse_composition_never_calls_the_sparse_path(monkeypatch):
    """At 10^7 steps dp_accounting's sparse path computes a 3*10^7-digit integer (45 s); ours
    converts first and gives the same distribution as its own dense path, within a point budget."""
    coin = PLD.from_discrete_laplace_mechanism(parameter=0.5, sensitivity=1, value_discretization_interval=1e-2)
    expected = coin.self_compose(3000).get_epsilon_for_delta(1e-6)  # dp_accounting itself, moderate count

    def refuse(*a, **k):
        raise AssertionError("the sparse self-composition was called")

    monkeypatch.setattr(pld_pmf.SparsePLDPmf, "self_compose", refuse)
    assert pld_compose.self_compose(coin, 3000).get_epsilon_for_delta(1e-6) == expected
    assert math.isfinite(pld_compose.self_compose(coin, 10**5).get_epsilon_for_delta(1e-6))
    with pytest.raises(pld_compose.TooCostly):  # refused before the FFT, which would need gigabytes
        pld_compose.self_compose(coin, 10**7, max_points=pld_compose.MAX_COMPOSED_POINTS)


def test_ten_million_steps_are_accounted_by_pld():
    """The audit's schedule (n = 10^5, batch 10, 10^7 steps): 47-90 s before, now well under a second."""
    step = Step(Poisson(1e-4), (Gaussian(1.5882),))
    res = epsilon_of({step: 10**7}, delta=1e-6, accountant="pld")
    rdp = epsilon_of({step: 10**7}, delta=1e-6, accountant="rdp")
    assert res.accountant == "pld" and res.grid is not None and res.epsilon < rdp.epsilon


def test_an_oversized_composition_is_done_on_a_coarser_grid(fresh):
    exact = epsilon_of({STEP: 512}, delta=1e-6, accountant="pld")
    rdp = epsilon_of({STEP: 512}, delta=1e-6, accountant="rdp").epsilon
    grid = exact.grid
    points = pld_compose._composed_points(
        PLD.from_gaussian_mechanism(
            standard_deviation=3.0, value_discretization_interval=grid, sampling_prob=0.1
        )._pmf_remove,
        512,
    )
    acc_mod._epsilon_cached.cache_clear()
    fresh.setattr(pld_compose, "MAX_COMPOSED_POINTS", points // 2)  # the chosen grid is now too costly
    coarse = epsilon_of({STEP: 512}, delta=1e-6, accountant="pld")
    assert coarse.grid == pytest.approx(10 * grid)  # the public rule: ten times coarser
    assert exact.epsilon <= coarse.epsilon <= rdp  # still an upper bound, pessimistic, better than RDP here
    assert coarse.to_dict()["pld_grid"] == coarse.grid
    acc_mod._epsilon_cached.cache_clear()
    assert epsilon_of({STEP: 512}, delta=1e-6, accountant="pld") == coarse  # deterministic


def test_when_no_grid_fits_rdp_answers(fresh):
    fresh.setattr(pld_compose, "MAX_COMPOSED_POINTS", 10)
    auto = epsilon_of({STEP: 512}, delta=1e-6)
    assert auto.accountant == "rdp" and auto.grid is None
    assert auto.epsilon == epsilon_of({STEP: 512}, delta=1e-6, accountant="rdp").epsilon
    assert epsilon_of({STEP: 512}, delta=1e-6, accountant="pld").epsilon == math.inf  # PLD certifies nothing


class _Cfg:
    class privacy:  # the attribute layout of a RunConfig
        epsilon, delta, neighbouring = 4.0, 1e-6, "add_remove"


def test_a_checkpoint_record_names_its_bound_and_the_final_one_is_exact():
    ledger = PrivacyLedger(delta=1e-6, target_epsilon=4.0, planned={STEP: 512})
    for _ in range(200):
        ledger.record(STEP)
    exact = privacy_section(_Cfg, ledger)
    assert exact["epsilon_spent_method"] == "exact" and exact["accountant"] == "pld"
    assert exact["pld_grid"] == ledger.spent().grid
    bound = epsilon_of({STEP: 200}, delta=1e-6, accountant="rdp")
    running = privacy_section(_Cfg, ledger, spent=bound)
    assert running["epsilon_spent_method"] == SPENT_BOUND_METHOD and running["accountant"] == "rdp"
    assert running["epsilon_spent"] >= exact["epsilon_spent"] and "pld_grid" not in running
    assert running["ledger"] == exact["ledger"]  # what a resume reads is the same
