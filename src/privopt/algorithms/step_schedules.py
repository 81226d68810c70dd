"""Step-size schedules: the factor by which an algorithm multiplies its base step at iteration t.

A schedule is named by a string (a config field, validated by :func:`schedule_name`) and shaped by
one number, ``final``: the factor reached at the last planned iteration. Because the shape is
stated relative to the planned length ``total``, a setting chosen on a short run (a tuning trial)
keeps its meaning on a longer one. Schedules are post-processing of public quantities (the
iteration counter and the planned length), so they cost no privacy. See
``docs/algorithms/dro.md`` ("Step-size schedule").

* ``"constant"``: 1 at every step (``final`` is ignored).
* ``"inverse-sqrt"``: ``1/√(1 + t/t0)``, with ``t0`` chosen so the factor is ``final`` at ``t = total``.
* ``"cosine"``: ``final + (1 − final)·(1 + cos(π·t/total))/2``, from 1 down to ``final``.

Example:
    >>> round(step_factor("cosine", t=50, total=100, final=0.5), 3)
    0.75
    >>> round(step_factor("inverse-sqrt", t=100, total=100, final=0.25), 3)
    0.25
    >>> step_factor("constant", t=7, total=100, final=0.1)
    1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from privopt.algorithms.config import AlgorithmConfig, param, unit_interval
from privopt.errors import ConfigError

__all__ = ["STEP_SCHEDULES", "ScheduledStepConfig", "schedule_name", "step_factor"]

STEP_SCHEDULES = ("constant", "inverse-sqrt", "cosine")


def schedule_name(name: str, value: Any) -> str:
    """Config check: one of :data:`STEP_SCHEDULES`."""
    if value not in STEP_SCHEDULES:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, STEP_SCHEDULES))}, got {value!r}")
    return value


def step_factor(schedule: str, *, t: int, total: int, final: float) -> float:
    """The factor of the base step at iteration ``t`` (0-based) of a run planned for ``total`` steps.

    Args:
        schedule: one of :data:`STEP_SCHEDULES`.
        t: the iteration (steps past ``total`` keep the final factor).
        total: the planned number of iterations (>= 1).
        final: the factor at ``t = total``, in (0, 1].

    Raises:
        ConfigError: an unknown schedule, ``total < 1`` or ``final`` outside (0, 1].
    """
    schedule_name("schedule", schedule)
    if total < 1:
        raise ConfigError(f"a step schedule needs total >= 1 planned steps, got {total}")
    if not 0.0 < final <= 1.0:
        raise ConfigError(f"the final step factor must be in (0, 1], got {final}")
    if schedule == "constant" or final == 1.0:
        return 1.0
    frac = min(max(t, 0), total) / total
    if schedule == "cosine":
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * frac))
    # 1/√(1 + t/t0) = final at t = total  ⇔  total/t0 = 1/final² − 1.
    return 1.0 / math.sqrt(1.0 + frac * (1.0 / final**2 - 1.0))


@dataclass(frozen=True)
class ScheduledStepConfig(AlgorithmConfig):
    """The model-step schedule every gradient-step algorithm shares (DP-SGD, the DRO methods).

    Attributes:
        lr_schedule: how the step on the model parameters (``lr``, and any largest move such as
            ``lr_norm``) decays over the planned iterations: ``"constant"``, ``"inverse-sqrt"`` or
            ``"cosine"``. With a constant step the last iterate keeps moving by a step's length
            (under DP noise: a random bias of its decision threshold); a decay lets it settle.
        lr_final: the step's factor at the last planned iteration, in (0, 1] (ignored by
            ``"constant"``).

    Example:
        >>> ScheduledStepConfig(lr_schedule="cosine", lr_final=0.1).lr_factor(t=10, total=10)
        0.1
        >>> ScheduledStepConfig().lr_factor(t=3, total=10)
        1.0
    """

    lr_schedule: str = param("constant", schedule_name, role="lr_schedule")
    lr_final: float = param(1.0, unit_interval, role="lr_final")

    def lr_factor(self, *, t: int, total: int) -> float:
        """The factor of the base step at iteration ``t`` of ``total`` planned iterations."""
        return step_factor(self.lr_schedule, t=t, total=total, final=self.lr_final)
