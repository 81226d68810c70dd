"""Validation of privacy parameters, shared by the accountant, calibration, ledger and filter.

Every check raises :class:`~privopt.errors.ConfigError` naming the offending value, so a bad
``--delta`` or config key fails before any work starts.
"""

from __future__ import annotations

import math
import numbers

from privopt.errors import ConfigError

__all__ = [
    "ACCOUNTANTS",
    "is_real",
    "check_delta",
    "check_epsilon",
    "check_accountant",
    "check_count",
    "check_ratio",
    "check_delta_for_size",
]

ACCOUNTANTS = ("auto", "pld", "rdp")


def is_real(x) -> bool:
    """True for int/float-like numbers (not bools, not strings)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_delta(delta, *, name: str = "delta") -> float:
    """Validate ``delta`` in the open interval (0, 1) and return it as a float."""
    if not is_real(delta) or not (0.0 < float(delta) < 1.0):  # also rejects NaN
        raise ConfigError(f"{name} must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon, *, name: str = "epsilon") -> float:
    """Validate a finite ``epsilon > 0`` and return it as a float."""
    if not is_real(epsilon) or not (0.0 < float(epsilon) < math.inf):
        raise ConfigError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def check_accountant(accountant) -> str:
    """Validate an accountant name: ``"auto"``, ``"pld"`` or ``"rdp"``."""
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"unknown accountant {accountant!r}; use one of {ACCOUNTANTS}")
    return accountant


def check_count(count, *, name: str = "count", minimum: int = 0) -> int:
    """Validate an integer ``>= minimum`` (bools and floats are rejected) and return it."""
    if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {count!r}")
    return int(count)


def check_ratio(name: str, ratio) -> float:
    """Validate the noise ratio of a calibrated family: a finite number > 0."""
    if not is_real(ratio) or not (0.0 < float(ratio) < math.inf):
        raise ConfigError(f"noise ratio of family {name!r} must be a finite number > 0, got {ratio!r}")
    return float(ratio)


def check_delta_for_size(
    delta,
    *,
    dataset_size: int,
    allow_large: bool = False,
    name: str = "delta",
    override: str = "allow_large=True, CLI --allow-large-delta",
) -> float:
    """Refuse ``delta >= 1/n`` unless explicitly allowed.

    A mechanism that publishes one uniformly chosen record in full is ``(0, 1/n)``-DP, so a
    delta of ``1/n`` or more permits releasing records outright; meaningful guarantees use
    ``delta`` well below ``1/n`` (a common choice is ``1/n^1.1``). See docs/accounting.md.

    Args:
        delta: The run's delta in (0, 1).
        dataset_size: Number of records n (>= 1).
        allow_large: Accept ``delta >= 1/n`` anyway (e.g. to reproduce a paper's setting).
        name: How the caller calls delta (e.g. ``"privacy.delta"`` in a run config).
        override: How the caller's user allows a large delta (quoted in the error).

    Returns:
        ``delta`` as a float.

    Raises:
        ConfigError: invalid arguments, or ``delta >= 1/n`` without ``allow_large``.

    Example:
        >>> check_delta_for_size(1e-5, dataset_size=60_000)
        1e-05
        >>> check_delta_for_size(0.5, dataset_size=60_000)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: delta=0.5 is not below 1/n = 1.667e-05 (n = 60000): ...
    """
    delta = check_delta(delta, name=name)
    n = check_count(dataset_size, name="dataset_size", minimum=1)
    if delta >= 1.0 / n and not allow_large:
        raise ConfigError(
            f"{name}={delta:g} is not below 1/n = {1.0 / n:.4g} (n = {n}): with such a delta a mechanism "
            f"may publish a whole record; use delta well below 1/n (e.g. {n**-1.1:.2g} = 1/n^1.1), "
            f"or allow it explicitly ({override})"
        )
    return delta
