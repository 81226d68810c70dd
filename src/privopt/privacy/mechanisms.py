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

The ``rng`` they take is a :class:`privopt.rng.SecureSource` (AES-256-CTR keyed from OS
entropy; ``docs/privacy.md``), the one to use for a private release: noise is computed in float64
from its 53-bit uniforms (Box–Muller for the Gaussian, a difference of two exponentials for the
Laplace). A numpy ``Generator`` is also accepted, for tests, analyses and prototypes: it is NOT
cryptographically secure (an attacker who learns its state, a seed or enough of its outputs, can
subtract the noise). Anything else (a seeded :class:`privopt.rng.TorchSource`, ``random``, a seed)
is refused. This module imports no torch: a ``SecureSource`` is recognised only once
:mod:`privopt.rng` has been imported, which creating one requires.

Example:
    >>> from privopt.rng import SecureSource
    >>> noisy_count = 130 + laplace_noise(scale=laplace_scale(sensitivity=1, epsilon=0.5), size=None,
    ...                                   rng=SecureSource())
    >>> isinstance(noisy_count, float)
    True
"""

from __future__ import annotations

import math
import sys

import numpy as np

from privopt.errors import ConfigError
from privopt.validation import positive

__all__ = ["gaussian_noise", "laplace_noise", "report_noisy_max", "report_noisy_max_epsilon", "laplace_scale"]


def _is_secure_source(rng) -> bool:
    # No import here (privopt.rng imports torch): a SecureSource exists only once its module is loaded.
    module = sys.modules.get("privopt.rng")
    return module is not None and isinstance(rng, module.SecureSource)


def _rng(rng):
    if isinstance(rng, np.random.Generator) or _is_secure_source(rng):
        return rng
    raise ConfigError(
        "rng must be a privopt.rng.SecureSource (secure: use it for private releases) or a "
        f"numpy.random.Generator (NOT secure: tests and prototypes), got {type(rng).__name__}"
    )


def _shape(size) -> tuple[int, ...]:
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ConfigError(f"size must be None, a non-negative int or a tuple of them, got {size!r}")
    return tuple(int(s) for s in shape)


def _uniforms(rng, size) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """float64 uniforms in ``[0, 1)`` from a SecureSource: ``2 * count`` of them, and the shape
    (``None`` for a scalar ``size=None``, as numpy's generators return a float then)."""
    shape = None if size is None else _shape(size)
    count = math.prod(shape or ())
    u = np.asarray(rng.uniform((2, count)), dtype=np.float64)
    return u, shape


def _shaped(values: np.ndarray, shape: tuple[int, ...] | None):
    return float(values[0]) if shape is None else values.reshape(shape)


def _secure_normal(rng, size):
    u, shape = _uniforms(rng, size)
    radius = np.sqrt(-2.0 * np.log1p(-u[0]))  # 1 - u in (0, 1]: the log is finite
    return _shaped(radius * np.cos(2.0 * math.pi * u[1]), shape)


def _secure_laplace(rng, size):
    u, shape = _uniforms(rng, size)
    e = -np.log1p(-u)  # two standard exponentials, finite for every u in [0, 1)
    return _shaped(e[0] - e[1], shape)


def gaussian_noise(*, std: float, size, rng) -> np.ndarray:
    """I.i.d. ``N(0, std^2)`` noise of shape ``size`` (float64; a float for ``size=None``).

    Privacy: ``std = z * C`` on a sum of per-record terms of L2 norm <= C is the event
    ``Gaussian(noise_multiplier=z)``. ``rng``: a :class:`privopt.rng.SecureSource` for a private
    release, or a numpy ``Generator`` (not secure; see the module docstring).

    Example:
        >>> from privopt.rng import SecureSource
        >>> gaussian_noise(std=2.0, size=3, rng=SecureSource()).shape
        (3,)
    """
    std = positive("std", std)
    if isinstance(_rng(rng), np.random.Generator):
        return rng.normal(0.0, std, size=size)
    return _secure_normal(rng, size) * std


def laplace_noise(*, scale: float, size, rng) -> np.ndarray:
    """I.i.d. Laplace noise with density ``exp(-|y|/scale) / (2 scale)`` of shape ``size`` (float64;
    a float for ``size=None``).

    Privacy: on a release whose records move it by at most ``Delta`` in L1 norm it is
    ``Delta / scale``-DP; with ``scale = b * C`` and ``Delta = C`` record ``Laplace(b)``. ``rng``: a
    :class:`privopt.rng.SecureSource` for a private release, or a numpy ``Generator`` (not secure).

    Example:
        >>> from privopt.rng import SecureSource
        >>> laplace_noise(scale=1.0, size=(2, 2), rng=SecureSource()).shape
        (2, 2)
    """
    scale = positive("scale", scale)
    if isinstance(_rng(rng), np.random.Generator):
        return rng.laplace(0.0, scale, size=size)
    return _secure_laplace(rng, size) * scale


def laplace_scale(*, sensitivity: float, epsilon: float) -> float:
    """Laplace scale giving ``epsilon``-DP for an L1 ``sensitivity``: ``sensitivity / epsilon``."""
    return positive("sensitivity", sensitivity) / positive("epsilon", epsilon)


def report_noisy_max(values, *, scale: float, rng) -> int:
    """Index of the largest ``values[i] + Lap(scale)`` (ties: the first).

    Privacy: see :func:`report_noisy_max_epsilon`; only the index is released, never the noisy
    values. ``rng``: a :class:`privopt.rng.SecureSource` (or a numpy ``Generator``, not secure).

    Example:
        >>> from privopt.rng import SecureSource
        >>> report_noisy_max([0.0, 100.0, 1.0], scale=0.1, rng=SecureSource())
        1
    """
    _rng(rng)  # a wrong rng fails before the values are read
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
