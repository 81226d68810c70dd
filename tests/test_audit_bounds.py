"""The audit's statistics: the one-run bound (Steinke, Nasr & Jagielski 2023) and the Clopper–Pearson
bound, checked against closed forms, an independent implementation (scipy's binomtest) and
Monte-Carlo simulations of mechanisms whose privacy is known exactly."""

import math

import numpy as np
import pytest
from scipy import stats

from privopt.audit.bounds import (
    clopper_pearson_upper,
    default_guess_counts,
    epsilon_from_rates,
    many_run_bound,
    one_run_bound,
    one_run_epsilon,
    one_run_p_value,
)
from privopt.errors import ConfigError
from privopt.privacy import gaussian_noise_multiplier


def _logit(p):
    return math.log(p / (1 - p))


@pytest.mark.parametrize("r", [10, 37, 200])
def test_perfect_guesses_without_delta_match_the_closed_form(r):
    # v = r right and delta = 0: p-value q^r with q = e^eps/(1+e^eps), so the bound is logit(beta^(1/r)).
    eps = one_run_epsilon(canaries=1000, guesses=r, correct=r, delta=0.0, level=0.05)
    assert eps == pytest.approx(_logit(0.05 ** (1 / r)), abs=1e-5)


def test_p_value_is_the_binomial_tail_plus_the_delta_term():
    m, r, v, eps = 500, 60, 45, 0.7
    q = 1 / (1 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, r, q)
    assert one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=0.0) == pytest.approx(tail)
    # The delta term: 2 m delta max_i P[v - i <= Bin < v] / i, here written out term by term.
    slope = max(sum(stats.binom.pmf(v - j, r, q) for j in range(1, i + 1)) / i for i in range(1, v + 1))
    got = one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=eps, delta=1e-4)
    assert got == pytest.approx(tail + 2 * m * 1e-4 * slope)
    # More epsilon or more delta: a larger p-value (a weaker rejection).
    assert one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=1.0, delta=0.0) > tail


def test_bound_is_zero_at_chance_and_grows_with_the_right_guesses():
    base = dict(canaries=1000, guesses=100, delta=1e-5, level=0.05)
    assert one_run_epsilon(correct=50, **base) == 0.0
    bounds = [one_run_epsilon(correct=v, **base) for v in (60, 70, 80, 90, 100)]
    assert bounds == sorted(bounds) and bounds[0] > 0


def test_bonferroni_over_guess_counts_costs_confidence():
    rng = np.random.default_rng(0)
    included = rng.random(400) < 0.5
    scores = included + rng.normal(size=400)
    alone = one_run_bound(scores, included, delta=0.0, guesses=((50, 0),))
    many = one_run_bound(scores, included, delta=0.0, guesses=((50, 0), (10, 0), (20, 20)))
    assert many.tried == 3 and alone.tried == 1
    # The same guesses tested at level beta/3 reject less.
    same = one_run_epsilon(canaries=400, guesses=50, correct=alone.correct, delta=0.0, level=0.05 / 3)
    assert same < alone.epsilon and many.epsilon >= same


def test_default_guess_counts_stay_within_half_the_canaries():
    for m in (2, 30, 1000, 5000):
        pairs = default_guess_counts(m)
        assert pairs and all(0 < ki + ko <= m and ki <= max(m // 2, 1) for ki, ko in pairs)


def _randomized_response(rng, m, eps):
    included = rng.random(m) < 0.5
    keep = rng.random(m) < 1 / (1 + math.exp(-eps))
    guesses = np.where(keep, included, ~included).astype(float)
    return guesses + 1e-9 * rng.random(m), included  # ties broken at random


def test_one_run_bound_is_valid_and_tight_for_randomized_response():
    # eps-DP randomized response is the mechanism the one-run bound is tight for.
    rng, eps, trials = np.random.default_rng(1), 1.0, 40
    bounds = [
        one_run_bound(*_randomized_response(rng, 5000, eps), delta=0.0, guesses=((2500, 2500),)).epsilon
        for _ in range(trials)
    ]
    assert sum(b > eps for b in bounds) <= 0.05 * trials + 1  # a 95% lower bound
    assert np.mean(bounds) > 0.85 * eps


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_one_run_bound_is_valid_for_the_gaussian_mechanism(eps):
    # Per canary: the Gaussian mechanism with sensitivity 1 calibrated (by dp_accounting) to (eps, 1e-5).
    rng, delta, m = np.random.default_rng(2), 1e-5, 5000
    sigma = gaussian_noise_multiplier(epsilon=eps, delta=delta)
    bounds = []
    for _ in range(20):
        included = rng.random(m) < 0.5
        bounds.append(one_run_bound(included + sigma * rng.normal(size=m), included, delta=delta).epsilon)
    assert max(bounds) <= eps
    # One run cannot be tight for a Gaussian at small delta (Steinke et al., Sec. 7), but it sees it.
    assert np.mean(bounds) > 0.25 * eps


def test_one_run_bound_catches_a_gaussian_with_a_tenth_of_the_claimed_noise():
    rng, delta = np.random.default_rng(3), 1e-5
    sigma = gaussian_noise_multiplier(epsilon=1.0, delta=delta) / 10
    included = rng.random(1000) < 0.5
    bound = one_run_bound(included + sigma * rng.normal(size=1000), included, delta=delta)
    assert bound.epsilon > 3.0


def test_clopper_pearson_matches_scipy_binomtest():
    for k, n in [(0, 20), (3, 50), (17, 40), (40, 40)]:
        # A two-sided exact interval at 90% has the one-sided 95% upper bound as its upper end.
        ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact").high
        assert clopper_pearson_upper(k, n, level=0.05) == pytest.approx(ref)
    assert clopper_pearson_upper(0, 20, level=0.05) == pytest.approx(1 - 0.05 ** (1 / 20))


def test_epsilon_from_rates_is_the_dp_hypothesis_testing_bound():
    # the better of the two inequalities: (1 - FNR)/FPR = 0.8/0.1 beats (1 - FPR)/FNR = 0.9/0.2
    assert epsilon_from_rates(0.1, 0.2, delta=0.0) == pytest.approx(math.log(0.8 / 0.1))
    assert epsilon_from_rates(0.5, 0.5, delta=0.0) == 0.0
    assert epsilon_from_rates(0.6, 0.6, delta=0.0) == 0.0  # worse than chance: nothing rejected
    assert epsilon_from_rates(0.1, 0.1, delta=0.05) == pytest.approx(math.log(0.85 / 0.1))


def test_many_run_bound_is_valid_for_the_gaussian_mechanism_and_catches_a_broken_one():
    rng, delta = np.random.default_rng(4), 1e-5
    sigma = gaussian_noise_multiplier(epsilon=1.0, delta=delta)
    for _ in range(20):
        included = rng.random(200) < 0.5
        assert many_run_bound(included + sigma * rng.normal(size=200), included, delta=delta).epsilon <= 1.0
    included = rng.random(200) < 0.5
    broken = many_run_bound(included + sigma / 10 * rng.normal(size=200), included, delta=delta)
    assert broken.epsilon > 1.0
    assert broken.negatives + broken.positives == 100  # the second half: not used to pick the threshold


def test_bad_inputs_fail_clearly():
    with pytest.raises(ConfigError, match="one inclusion flag per score"):
        one_run_bound([0.1, 0.2], [True], delta=0.0)
    with pytest.raises(ConfigError, match="confidence"):
        one_run_bound([0.1, 0.2], [True, False], delta=0.0, confidence=1.0)
    with pytest.raises(ConfigError, match="finite"):
        one_run_bound([0.1, float("nan")], [True, False], delta=0.0)
    with pytest.raises(ConfigError, match="guess counts"):
        one_run_bound([0.1, 0.2], [True, False], delta=0.0, guesses=((3, 0),))
    with pytest.raises(ConfigError, match="runs with and without"):
        many_run_bound([0.1, 0.2, 0.3, 0.4], [True, True, False, True], delta=0.0)
