"""Argument checks shared by every layer: each failure names the argument and the bad value."""

from __future__ import annotations

import math
import numbers
from typing import Any

from privopt.errors import ConfigError

__all__ = ["positive", "positive_int", "optional_positive", "auto_or_positive", "unit_interval"]


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive(name: str, value: Any) -> float:
    """A finite real number > 0, as float.

    Example:
        >>> positive("lr", 0.5)
        0.5
        >>> positive("lr", 0)
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: lr must be a finite number > 0, got 0
    """
    if not (_is_real(value) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def positive_int(name: str, value: Any) -> int:
    """An integer >= 1."""
    if isinstance(value, bool) or not (isinstance(value, numbers.Integral) and value >= 1):
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def optional_positive(name: str, value: Any) -> float | None:
    """``None`` or a finite number > 0."""
    return None if value is None else positive(name, value)


def auto_or_positive(name: str, value: Any) -> str | float | None:
    """``None``, the string ``"auto"`` or a finite number > 0."""
    if value is None or value == "auto":
        return value
    return positive(name, value)


def unit_interval(name: str, value: Any, *, closed_low: bool = False) -> float:
    """A number in (0, 1] (or [0, 1] with ``closed_low``)."""
    ok = _is_real(value) and math.isfinite(value)
    if not ok or not ((value >= 0 if closed_low else value > 0) and value <= 1):
        interval = "[0, 1]" if closed_low else "(0, 1]"
        raise ConfigError(f"{name} must be in {interval}, got {value!r}")
    return float(value)
