"""The PLD accountant reuses a subsampled Gaussian's loss distribution across calls, with results
identical to dp_accounting's own PLDAccountant (a run asks for epsilon at every evaluation)."""

import dp_accounting as dpa
import pytest

from privopt.privacy import Gaussian, Poisson, Step
from privopt.privacy import accountant as acc_mod


@pytest.mark.parametrize("count", [7, 40])
def test_reused_distribution_gives_dp_accountings_own_epsilon(count):
    step = Step(Poisson(0.02), (Gaussian(1.3),))
    event = acc_mod._pld_event(((step, count),), "add_remove")
    interval = 1e-3
    plain = dpa.pld.PLDAccountant(neighboring_relation=acc_mod.ADD, value_discretization_interval=interval)
    plain.compose(event)
    hits = acc_mod._subsampled_gaussian_pld.cache_info().hits
    first = acc_mod._pld_accountant(event, interval)
    again = acc_mod._pld_accountant(event, interval)
    assert acc_mod._subsampled_gaussian_pld.cache_info().hits > hits  # the second build was reused
    for delta in (1e-5, 1e-9):
        assert first.get_epsilon(delta) == again.get_epsilon(delta) == plain.get_epsilon(delta)
