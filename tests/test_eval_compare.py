"""The shared difference-of-means comparison: Welch's interval, its edge cases and the verdicts."""

import math

import numpy as np
import pytest
from scipy import stats

from privopt.eval.compare import VERDICTS, compare_means, verdict, welch_interval


@pytest.mark.parametrize("seed", range(6))
def test_the_interval_is_scipys_welch_interval_on_random_samples(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.8, rng.uniform(0.001, 0.05), size=rng.integers(2, 11)).tolist()
    b = rng.normal(0.8, rng.uniform(0.001, 0.05), size=rng.integers(2, 11)).tolist()
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    d = compare_means(a, b)
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), rel=1e-9, abs=1e-12)
    assert d.difference == pytest.approx(np.mean(a) - np.mean(b)) and (d.runs, d.baseline_runs) == (len(a), len(b))
    assert d.verdict == verdict(d.difference, d.low, d.high)


def test_equal_samples_are_level_and_constant_samples_give_a_point():
    assert compare_means([0.0, 0.0, 0.0], [0.0, 0.0]).verdict == "level"  # e.g. a worst class at 0 % everywhere
    same = compare_means([0.7, 0.8, 0.9], [0.7, 0.8, 0.9])
    assert same.difference == 0 and same.low < 0 < same.high and same.verdict == "ahead within noise"
    flat = compare_means([0.7, 0.7], [0.8, 0.8, 0.8])
    assert (flat.low, flat.high) == (pytest.approx(-0.1), pytest.approx(-0.1)) and flat.verdict == "behind"


@pytest.mark.parametrize(("a", "b"), [([0.9], [0.1, 0.2, 0.3]), ([0.9, 0.8], [0.1]), ([0.9], [0.1]), ([], [0.5])])
def test_fewer_than_two_runs_on_a_side_give_no_interval_and_no_claim(a, b):
    d = compare_means(a, b)
    assert math.isnan(d.low) and math.isnan(d.high) and d.verdict == "no interval"
    assert all(math.isnan(x) for x in welch_interval(a, b))
    assert math.isnan(d.difference) == (not a)


def test_failed_runs_are_left_out():
    d = compare_means([0.9, None, math.nan, 0.8, math.inf], [0.1, 0.2])
    assert (d.runs, d.baseline_runs) == (2, 2) and d.difference == pytest.approx(0.7) and d.verdict == "ahead"
    assert compare_means([0.9, math.nan], [0.1, 0.2]).verdict == "no interval"  # one finite run left


@pytest.mark.parametrize(
    ("difference", "low", "high", "expected"),
    [
        (0.02, 1e-12, 0.04, "ahead"),  # the whole interval above 0
        (0.02, 0.0, 0.04, "ahead within noise"),  # touching 0 is reaching it
        (0.0, -0.01, 0.01, "ahead within noise"),  # a tie meets a ">=" bar and proves nothing
        (-1e-12, -0.01, 0.01, "behind within noise"),
        (-0.02, -0.04, 0.0, "behind within noise"),
        (-0.02, -0.04, -1e-12, "behind"),
        (0.0, 0.0, 0.0, "level"),
        (0.3, 0.3, 0.3, "ahead"),  # a constant gap with no spread is a clear difference
        (0.3, math.nan, math.nan, "no interval"),
    ],
)
def test_the_verdict_boundaries(difference, low, high, expected):
    assert verdict(difference, low, high) == expected and expected in VERDICTS
