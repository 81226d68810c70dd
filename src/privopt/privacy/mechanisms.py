"""Noise primitives in pure numpy. They record NOTHING: the caller records the matching
:class:`~privopt.privacy.events.Step` in its :class:`~privopt.privacy.ledger.PrivacyLedger` first.

Each function states the sensitivity its privacy parameter refers to, so the caller can build the
right event:

* :func:`gaussian_noise` -- add to a sum whose records contribute at most ``C`` in L2 norm, with
  ``std = z * C``; event ``Gaussian(noise_multiplier=z)`` (L2 sensitivity C under add/remove,
  2C under replace-one; :func:`~privopt.privacy.accountant.to_dp_event` applies the factor).
* :func:`laplace_noise` -- add to a release whose records contribute at most ``C`` in L1 norm,
  with ``scale = b * C``; event ``Laplace(scale_multiplier=b)``.
* :func:`report_noisy_max` -- argmax of ``values + Lap(scale)``; ``Delta / scale``-DP when one
  record moves every coordinate by at most ``Delta`` in the same direction (e.g. it changes one
  coordinate only), ``2 Delta / scale`` in general; record ``PureDP(report_noisy_max_epsilon(...))``.

The ``rng`` they take is a numpy ``Generator``, which is NOT cryptographically secure: an attacker
who learns its state (a seed, or enough of its outputs) can subtract the noise. They serve tests,
analyses and prototypes; privopt's own releases draw from :class:`privopt.rng.SecureSource`
(AES-256-CTR keyed from OS entropy; ``docs/privacy.md``), and so should a user's private release.
"""

from __future__ import annotations

import numpy as np

from privopt.errors import ConfigError
from privopt.validation import positive

__all__ = ["gaussian_noise", "laplace_noise", "report_noisy_max", "report_noisy_max_epsilon", "laplace_scale"]


def _rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def gaussian_noise(*, std: float, size, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. ``N(0, std^2)`` noise of shape ``size``.

    Privacy: ``std = z * C`` on a sum of per-record terms of L2 norm <= C is the event
    ``Gaussian(noise_multiplier=z)``.

    Example:
        >>> import numpy as np
        >>> gaussian_noise(std=2.0, size=3, rng=np.random.default_rng(0)).shape
        (3,)
    """
    return _rng(rng).normal(0.0, positive("std", std), size=size)


def laplace_noise(*, scale: float, size, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. Laplace noise with density ``exp(-|y|/scale) / (2 scale)`` of shape ``size``.

    Privacy: on a release whose records move it by at most ``Delta`` in L1 norm it is
    ``Delta / scale``-DP; with ``scale = b * C`` and ``Delta = C`` record ``Laplace(b)``.

    Example:
        >>> import numpy as np
        >>> laplace_noise(scale=1.0, size=(2, 2), rng=np.random.default_rng(0)).shape
        (2, 2)
    """
    return _rng(rng).laplace(0.0, positive("scale", scale), size=size)


def laplace_scale(*, sensitivity: float, epsilon: float) -> float:
    """Laplace scale giving ``epsilon``-DP for an L1 ``sensitivity``: ``sensitivity / epsilon``."""
    return positive("sensitivity", sensitivity) / positive("epsilon", epsilon)


def report_noisy_max(values, *, scale: float, rng: np.random.Generator) -> int:
    """Index of the largest ``values[i] + Lap(scale)`` (ties: the first).

    Privacy: see :func:`report_noisy_max_epsilon`; only the index is released, never the noisy
    values.

    Example:
        >>> import numpy as np
        >>> report_noisy_max([0.0, 100.0, 1.0], scale=0.1, rng=np.random.default_rng(0))
        1
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ConfigError(f"report_noisy_max needs a non-empty 1-D vector, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ConfigError("report_noisy_max values must be finite: some value is NaN or inf")  # never the values
    noisy = v + laplace_noise(scale=scale, size=v.shape, rng=rng)
    return int(np.argmax(noisy))


def report_noisy_max_epsilon(*, sensitivity: float, scale: float, monotone: bool = True) -> float:
    """Pure-DP epsilon of :func:`report_noisy_max` with Laplace ``scale``.

    Args:
        sensitivity: Largest change ``Delta`` of any single coordinate when one record changes.
        scale: The Laplace scale used.
        monotone: True if one record moves all coordinates in the same direction (in particular
            when it changes a single coordinate, as for per-group losses): ``Delta / scale``.
            Otherwise ``2 Delta / scale`` (Dwork & Roth 2014, Claim 3.9).
    """
    eps = positive("sensitivity", sensitivity) / positive("scale", scale)
    return eps if monotone else 2.0 * eps
