"""numpy noise helpers: distributions, report-noisy-max behaviour and its DP inequality, validation."""

import math

import numpy as np
import pytest

from privopt.errors import ConfigError
from privopt.privacy import (
    gaussian_noise,
    laplace_noise,
    laplace_scale,
    report_noisy_max,
    report_noisy_max_epsilon,
)


def test_gaussian_and_laplace_have_the_declared_scale():
    rng = np.random.default_rng(0)
    g = gaussian_noise(std=2.5, size=200_000, rng=rng)
    assert g.std() == pytest.approx(2.5, rel=0.01) and abs(g.mean()) < 0.02
    lap = laplace_noise(scale=1.5, size=200_000, rng=rng)
    assert np.abs(lap).mean() == pytest.approx(1.5, rel=0.01)  # E|Lap(b)| = b
    assert lap.shape == (200_000,)
    assert laplace_noise(scale=1.0, size=(3, 4), rng=rng).shape == (3, 4)


def test_seeded_rng_is_reproducible():
    a = laplace_noise(scale=1.0, size=5, rng=np.random.default_rng(7))
    b = laplace_noise(scale=1.0, size=5, rng=np.random.default_rng(7))
    assert np.array_equal(a, b)


def test_report_noisy_max_finds_clear_winner_and_randomises_close_calls():
    rng = np.random.default_rng(1)
    assert all(report_noisy_max([0.0, 5.0, 1.0], scale=0.01, rng=rng) == 1 for _ in range(50))
    picks = [report_noisy_max([0.0, 0.0], scale=1.0, rng=rng) for _ in range(4000)]
    assert 0.45 < np.mean(picks) < 0.55


def test_report_noisy_max_satisfies_its_dp_bound_empirically():
    # neighbours: one record changes one coordinate by Delta -> Delta/scale-DP
    delta_, scale, trials = 0.5, 1.0, 40_000
    eps = report_noisy_max_epsilon(sensitivity=delta_, scale=scale)
    v, w = np.array([0.0, 0.2, 0.1]), np.array([0.0, 0.2 - delta_, 0.1])
    rng = np.random.default_rng(2)
    pv = np.bincount([report_noisy_max(v, scale=scale, rng=rng) for _ in range(trials)], minlength=3) / trials
    pw = np.bincount([report_noisy_max(w, scale=scale, rng=rng) for _ in range(trials)], minlength=3) / trials
    slack = 4 * math.sqrt(0.25 / trials)  # sampling error
    assert np.all(pv <= math.exp(eps) * pw + slack) and np.all(pw <= math.exp(eps) * pv + slack)
    # the bound is not vacuous: the changed coordinate's probability does move
    assert pv[1] - pw[1] > 0.05


def test_epsilon_helpers():
    assert report_noisy_max_epsilon(sensitivity=1.0, scale=4.0) == 0.25
    assert report_noisy_max_epsilon(sensitivity=1.0, scale=4.0, monotone=False) == 0.5
    assert laplace_scale(sensitivity=2.0, epsilon=0.5) == 4.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_scales(bad):
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError):
        laplace_noise(scale=bad, size=1, rng=rng)
    with pytest.raises(ConfigError):
        gaussian_noise(std=bad, size=1, rng=rng)
    with pytest.raises(ConfigError):
        report_noisy_max([1.0, 2.0], scale=bad, rng=rng)


def test_bad_inputs():
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="Generator"):
        laplace_noise(scale=1.0, size=1, rng=0)
    with pytest.raises(ConfigError):
        report_noisy_max([], scale=1.0, rng=rng)
    with pytest.raises(ConfigError):
        report_noisy_max([[1.0, 2.0]], scale=1.0, rng=rng)
    with pytest.raises(ConfigError, match="finite"):
        report_noisy_max([1.0, float("nan")], scale=1.0, rng=rng)
