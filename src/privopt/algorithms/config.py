"""Frozen, validated hyper-parameter records of the algorithms.

Every algorithm has one :class:`AlgorithmConfig` subclass. Its fields are declared with
:func:`param`, which attaches the field's check (validation happens here, in one place, when the
config is built) and an optional *role* that tells experiments what the field means
(``"lr"``, ``"clip"``, ``"batch"``, ...) without matching names. A config serialises to a plain
dict for the run record (:meth:`AlgorithmConfig.to_dict`) and back (``cls(**d)``).

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Toy(AlgorithmConfig):
    ...     lr: float = param(0.1, positive, role="lr")
    ...     steps: int = param(10, positive_int)
    >>> Toy(lr=1).to_dict()
    {'lr': 1.0, 'steps': 10}
    >>> Toy.fields_with_role("lr")
    ('lr',)
    >>> Toy(steps=0)
    Traceback (most recent call last):
    ...
    privopt.errors.ConfigError: steps must be an integer >= 1, got 0
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any

from privopt.errors import ConfigError
from privopt.validation import auto_or_positive, optional_positive, positive, positive_int, unit_interval

__all__ = [
    "AlgorithmConfig",
    "ROLES",
    "param",
    "positive",
    "positive_int",
    "optional_positive",
    "auto_or_positive",
    "unit_interval",
    "flag",
    "optional_int",
    "finite_or_none",
    "non_negative",
    "momentum_value",
    "one_of",
    "mapping",
    "text",
]

# What a field means to an experiment protocol (see privopt.experiments.dro_protocol).
ROLES = (
    "lr",  # the step size on the model parameters
    "clip",  # a per-sample clip threshold of a refresh / plain gradient query
    "clip_cap",  # the cap of a step-proportional difference threshold (or its fixed value)
    "batch",  # a minibatch / correction batch size
    "refresh_batch",  # a SPIDER refresh batch size
    "phase",  # the SPIDER phase length q
    "epochs",  # the compute budget in epoch-equivalents
    "output",  # which iterate is returned ("random" / "last")
    "rho",  # the KL radius of KL-constrained DRO
    "lam0",  # the lower bound of the KL dual variable
    "penalty",  # the penalty λ of ψ-penalised DRO
    "weight_cap",  # the public cap on DRO weights (a record's weighted gradient is at most cap·clip)
    "gamma",  # the factor of a step-proportional difference threshold
    "lr_schedule",  # the decay schedule of the model step (privopt.algorithms.step_schedules)
    "lr_final",  # the model step's factor at the last planned iteration
)

Check = Callable[[str, Any], Any]


def param(default: Any, check: Check | None = None, *, role: str | None = None) -> Any:
    """A config field with its check (``check(name, value) -> normalised value``) and role."""
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    meta = {"check": check, "role": role}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# ----------------------------------------------------------------------------- checks
def optional_int(name: str, value: Any) -> int | None:
    """``None`` or an integer >= 1."""
    return None if value is None else positive_int(name, value)


def flag(name: str, value: Any) -> bool:
    """A boolean."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def finite_or_none(name: str, value: Any) -> float | None:
    """``None`` or a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def non_negative(name: str, value: Any) -> float:
    """A finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def momentum_value(name: str, value: Any) -> float:
    """A number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ConfigError(f"{name} must be in [0, 1), got {value}")
    return value


def one_of(*options: Any) -> Check:
    """A check accepting exactly ``options``."""

    def check(name: str, value: Any) -> Any:
        if value not in options:
            raise ConfigError(f"{name} must be one of {', '.join(repr(o) for o in options)}, got {value!r}")
        return value

    return check


def mapping(name: str, value: Any) -> dict:
    """``None`` (empty) or a mapping, copied."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a mapping, got {value!r}")
    return dict(value)


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


# ----------------------------------------------------------------------------- base class
@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """Base of every algorithm's hyper-parameters: frozen, checked field by field on creation,
    then by :meth:`check` for rules that relate several fields."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Cross-field rules (subclasses override; raise :class:`ConfigError`)."""

    def to_dict(self) -> dict[str, Any]:
        """Every hyper-parameter as a JSON-friendly dict (for run records)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> AlgorithmConfig:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def fields_with_role(cls, role: str) -> tuple[str, ...]:
        """Names of the fields declared with ``role`` (in declaration order)."""
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("role") == role)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> AlgorithmConfig:
        """Build from keyword parameters; unknown names fail with the list of valid ones."""
        unknown = sorted(set(params) - set(cls.field_names()))
        if unknown:
            raise ConfigError(f"unknown hyper-parameter(s) {unknown}; valid: {', '.join(cls.field_names())}")
        return cls(**params)
