"""The numpy noise primitives draw from privopt's secure generator (SecureSource) as well as from a
numpy Generator, refuse any other rng, and keep ``privopt.privacy`` free of torch at import."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from privopt.errors import ConfigError
from privopt.privacy import gaussian_noise, laplace_noise, report_noisy_max
from privopt.rng import SecureSource, TorchSource


def test_secure_gaussian_has_the_declared_distribution():
    g = gaussian_noise(std=2.5, size=200_000, rng=SecureSource())
    assert g.dtype == np.float64 and g.shape == (200_000,)
    assert abs(g.mean()) < 0.05 and g.std() == pytest.approx(2.5, rel=0.02)
    assert np.mean(np.abs(g) < 2.5) == pytest.approx(0.6827, abs=0.01)  # the shape, not only two moments
    assert np.isfinite(g).all()


def test_secure_laplace_has_the_declared_distribution():
    lap = laplace_noise(scale=1.5, size=(400, 500), rng=SecureSource())
    assert lap.dtype == np.float64 and lap.shape == (400, 500)
    assert abs(lap.mean()) < 0.05
    assert np.abs(lap).mean() == pytest.approx(1.5, rel=0.02)  # E|Lap(b)| = b
    assert lap.std() == pytest.approx(1.5 * np.sqrt(2), rel=0.03)
    assert np.isfinite(lap).all()


def test_secure_draws_are_fresh_and_shaped_like_numpy():
    rng = SecureSource()
    assert not np.array_equal(gaussian_noise(std=1.0, size=8, rng=rng), gaussian_noise(std=1.0, size=8, rng=rng))
    assert isinstance(laplace_noise(scale=1.0, size=None, rng=rng), float)  # numpy's scalar convention
    assert isinstance(gaussian_noise(std=1.0, size=None, rng=rng), float)
    assert gaussian_noise(std=1.0, size=(0, 3), rng=rng).shape == (0, 3)
    assert laplace_noise(scale=1.0, size=np.int64(4), rng=rng).shape == (4,)
    with pytest.raises(ConfigError, match="size must be None"):
        laplace_noise(scale=1.0, size=(2, -1), rng=rng)


def test_secure_report_noisy_max_picks_clear_winners_and_randomises_ties():
    rng = SecureSource()
    assert all(report_noisy_max([0.0, 5.0, 1.0], scale=0.01, rng=rng) == 1 for _ in range(50))
    picks = [report_noisy_max([0.0, 0.0], scale=1.0, rng=rng) for _ in range(4000)]
    assert 0.45 < np.mean(picks) < 0.55


@pytest.mark.parametrize("bad", [TorchSource(seed=0), torch.Generator(), 0, None, np.random.RandomState(0)])
def test_other_rngs_are_refused(bad):
    for draw in (
        lambda: gaussian_noise(std=1.0, size=3, rng=bad),
        lambda: laplace_noise(scale=1.0, size=3, rng=bad),
        lambda: report_noisy_max([0.0, 1.0], scale=1.0, rng=bad),
    ):
        with pytest.raises(ConfigError, match="rng must be a privopt.rng.SecureSource .* or a numpy.random.Generator"):
            draw()


def test_numpy_generator_still_works():
    a = laplace_noise(scale=1.0, size=5, rng=np.random.default_rng(7))
    assert np.array_equal(a, np.random.default_rng(7).laplace(0.0, 1.0, size=5))


def test_privacy_package_imports_without_torch():
    code = (
        "import sys\n"
        "import privopt.privacy\n"
        "from privopt.privacy import gaussian_noise\n"
        "import numpy as np\n"
        "gaussian_noise(std=1.0, size=2, rng=np.random.default_rng(0))\n"
        "assert 'torch' not in sys.modules, 'privopt.privacy imported torch'\n"
        "assert 'privopt.rng' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
