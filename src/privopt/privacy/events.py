"""Declarative descriptions of noisy releases, and their translation to ``dp_accounting`` events.

A *step* is everything released from ONE sampled batch: its :class:`Sampling` and the tuple of
mechanisms applied to that batch. Several releases on the same batch are one sampled composed
event (never independent steps). Steps are frozen and hashable so a ledger can count repeats.

Noise is always parametrised by the per-record contribution bound ``C`` of the released sum
(the clip threshold): ``noise_multiplier = std / C``. The neighbouring relation then fixes the
L2 sensitivity (``C`` under add/remove-one, ``2C`` under replace-one), and
:func:`privopt.privacy.translate.to_dp_event` passes ``std / sensitivity`` to dp_accounting (it never
relies on dp_accounting's REPLACE_ONE handling of plain Gaussians); see docs/accounting.md,
"Events and neighbouring relations".
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Union

from privopt.errors import ConfigError
from privopt.privacy.checks import is_real as _real

ADD_REMOVE = "add_remove"
REPLACE_ONE = "replace_one"
NEIGHBOURING = (ADD_REMOVE, REPLACE_ONE)

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "NEIGHBOURING",
    "Poisson",
    "WithoutReplacement",
    "FullBatch",
    "SingleRecord",
    "Gaussian",
    "Laplace",
    "PureDP",
    "TreeAggregation",
    "Step",
    "Sampling",
    "Mechanism",
    "check_neighbouring",
    "sensitivity_factor",
    "step_from_dict",
]


def check_neighbouring(neighbouring: str) -> str:
    if neighbouring not in NEIGHBOURING:
        raise ConfigError(f"unknown neighbouring relation {neighbouring!r}; use one of {NEIGHBOURING}")
    return neighbouring


def sensitivity_factor(neighbouring: str) -> float:
    """L2 sensitivity of a sum of C-bounded per-record terms, in units of C."""
    return 1.0 if check_neighbouring(neighbouring) == ADD_REMOVE else 2.0


# ---------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Poisson:
    """Each record independently with probability ``rate``; sums are divided by the EXPECTED size."""

    rate: float
    kind: str = "poisson"

    def __post_init__(self):
        if not _real(self.rate) or not 0 < self.rate <= 1:
            raise ConfigError(f"Poisson sampling rate must be a number in (0, 1], got {self.rate!r}")


@dataclass(frozen=True)
class WithoutReplacement:
    """A fixed-size batch of ``batch_size`` records drawn without replacement from ``n``."""

    n: int
    batch_size: int
    kind: str = "without_replacement"

    def __post_init__(self):
        if not (0 < self.batch_size <= self.n):
            raise ConfigError(f"batch size must be in [1, n={self.n}], got {self.batch_size}")

    @property
    def rate(self) -> float:
        return self.batch_size / self.n


@dataclass(frozen=True)
class FullBatch:
    """Every record is used (no amplification)."""

    kind: str = "full"
    rate: float = 1.0


@dataclass(frozen=True)
class SingleRecord:
    """One record drawn uniformly from ``n`` (rate 1/n): Poisson(1/n) under add/remove,
    without-replacement(n, 1) under replace-one."""

    n: int
    kind: str = "single"

    def __post_init__(self):
        if self.n < 1:
            raise ConfigError(f"dataset size must be >= 1, got {self.n}")

    @property
    def rate(self) -> float:
        return 1.0 / self.n


Sampling = Union[Poisson, WithoutReplacement, FullBatch, SingleRecord]

# ---------------------------------------------------------------- mechanisms


@dataclass(frozen=True)
class Gaussian:
    """Gaussian noise of std ``noise_multiplier * C`` on a sum whose records contribute at most C."""

    noise_multiplier: float
    name: str = ""
    kind: str = "gaussian"

    def __post_init__(self):
        z = self.noise_multiplier
        if not (_real(z) and z > 0 and math.isfinite(z)):
            raise ConfigError(f"Gaussian noise multiplier must be finite and > 0, got {z!r}")


@dataclass(frozen=True)
class Laplace:
    """Laplace noise of scale ``scale_multiplier * C`` (per coordinate) on an L1-bounded release:
    records contribute at most C in L1 norm."""

    scale_multiplier: float
    name: str = ""
    kind: str = "laplace"

    def __post_init__(self):
        if not (self.scale_multiplier > 0 and math.isfinite(self.scale_multiplier)):
            raise ConfigError(f"Laplace scale multiplier must be finite and > 0, got {self.scale_multiplier}")


@dataclass(frozen=True)
class PureDP:
    """A mechanism known to be ``epsilon``-DP under the run's neighbouring relation
    (e.g. report-noisy-max: Laplace(tau) on a vector one record moves by <= Delta is Delta/tau-DP)."""

    epsilon: float
    name: str = ""
    kind: str = "pure"

    def __post_init__(self):
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ConfigError(f"pure-DP epsilon must be finite and > 0, got {self.epsilon}")


@dataclass(frozen=True)
class TreeAggregation:
    """Tree aggregation of a stream (DP-FTRL): every node of a binary tree over the stream's
    prefix sums gets Gaussian noise of std ``noise_multiplier * C``; each record contributes at
    most C (L2) to one leaf, so it touches ``ceil(log2(T + 1))`` nodes of a tree of T leaves.

    ``steps`` is the number of leaves of each tree of ONE pass over the data; several entries
    mean the tree was restarted, and no record may occur in two trees of the pass (it is
    dp_accounting's ``SingleEpochTreeAggregationDpEvent``). Account one pass as one execution of
    ``Step(FullBatch(), (TreeAggregation(...),))``; E passes as E executions.

    Example:
        >>> TreeAggregation(2.0, steps=1000).steps
        (1000,)
    """

    noise_multiplier: float
    steps: tuple[int, ...] = (1,)
    name: str = ""
    kind: str = "tree"

    def __post_init__(self):
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ConfigError(f"tree noise multiplier must be finite and > 0, got {self.noise_multiplier}")
        steps = (self.steps,) if isinstance(self.steps, numbers.Integral) else self.steps
        steps = tuple(steps) if isinstance(steps, (tuple, list)) else ()
        if not steps or any(not isinstance(t, numbers.Integral) or isinstance(t, bool) or t < 1 for t in steps):
            raise ConfigError(f"tree steps must be integers >= 1 (leaves per tree), got {self.steps!r}")
        object.__setattr__(self, "steps", tuple(int(t) for t in steps))


Mechanism = Union[Gaussian, Laplace, PureDP, TreeAggregation]
_MECHANISM_TYPES = (Gaussian, Laplace, PureDP, TreeAggregation)


@dataclass(frozen=True)
class Step:
    """All releases computed on one sampled batch."""

    sampling: Sampling
    mechanisms: tuple[Mechanism, ...]

    def __post_init__(self):
        if not isinstance(self.sampling, (Poisson, WithoutReplacement, FullBatch, SingleRecord)):
            raise ConfigError(
                f"unknown sampling {self.sampling!r}; use Poisson, WithoutReplacement, FullBatch or SingleRecord"
            )
        try:
            mechanisms = tuple(self.mechanisms)
        except TypeError:
            raise ConfigError(f"step mechanisms must be a tuple of mechanisms, got {self.mechanisms!r}") from None
        if not mechanisms:
            raise ConfigError("a step must release at least one mechanism")
        for m in mechanisms:
            if not isinstance(m, _MECHANISM_TYPES):
                raise ConfigError(f"unknown mechanism {m!r}; use Gaussian, Laplace, PureDP or TreeAggregation")
        if any(isinstance(m, TreeAggregation) for m in mechanisms) and not isinstance(self.sampling, FullBatch):
            raise ConfigError(
                "a TreeAggregation release covers a whole pass over the stream; account it with FullBatch() "
                f"sampling, got {self.sampling!r}"
            )
        object.__setattr__(self, "mechanisms", mechanisms)

    @property
    def names(self) -> tuple[str, ...]:
        """Name of each release (its kind when unnamed), in order."""
        return tuple(m.name or m.kind for m in self.mechanisms)

    def to_dict(self) -> dict:
        return {"sampling": asdict(self.sampling), "mechanisms": [asdict(m) for m in self.mechanisms]}


_SAMPLINGS = {"poisson": Poisson, "without_replacement": WithoutReplacement, "full": FullBatch, "single": SingleRecord}
_MECHANISMS = {"gaussian": Gaussian, "laplace": Laplace, "pure": PureDP, "tree": TreeAggregation}


def step_from_dict(d: dict) -> Step:
    """Inverse of :meth:`Step.to_dict` (used when a ledger is restored from a checkpoint)."""
    try:
        s = dict(d["sampling"])
        sampling = _SAMPLINGS[s.pop("kind")](**s)
        mechs = []
        for m in d["mechanisms"]:
            m = dict(m)
            mechs.append(_MECHANISMS[m.pop("kind")](**m))
    except (KeyError, TypeError) as e:
        raise ConfigError(f"malformed step record {d!r}: {e}") from None
    return Step(sampling=sampling, mechanisms=tuple(mechs))
