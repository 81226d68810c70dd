"""Planned releases of a run: which steps will execute how often, and which noise is calibrated.

An :class:`Inventory` lists :class:`PlannedStep` objects. Each calibrated *family* (a named
release) gets the noise multiplier ``z_name = scale * ratio_name``, where
:func:`~privopt.privacy.calibrate` finds the scale; fixed mechanisms are accounted but not scaled.
See docs/accounting.md, "Calibration".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from privopt.errors import ConfigError
from privopt.privacy.checks import check_count, check_ratio
from privopt.privacy.events import (
    FullBatch,
    Gaussian,
    Laplace,
    Poisson,
    PureDP,
    SingleRecord,
    Step,
    TreeAggregation,
    WithoutReplacement,
    step_from_dict,
)

__all__ = [
    "TreeShape",
    "LaplaceShape",
    "NoisyMaxShape",
    "PlannedStep",
    "Inventory",
    "tree_family",
    "laplace_family",
    "noisy_max_family",
    "COMPOSITIONS",
]

_FIXED = (Gaussian, Laplace, PureDP, TreeAggregation)
# How the planned steps compose, i.e. which ledger certifies them: "plan" (a fixed schedule),
# "filter" (adaptively chosen steps, RDP filter), "parallel" (passes over disjoint parts).
COMPOSITIONS = ("plan", "filter", "parallel")


@dataclass(frozen=True)
class TreeShape:
    """Marks a calibrated family as tree aggregation with ``steps`` leaves per tree (see
    :class:`~privopt.privacy.TreeAggregation`); use it as ``("name", ratio, TreeShape(steps))``."""

    steps: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "steps", TreeAggregation(1.0, steps=self.steps).steps)


@dataclass(frozen=True)
class LaplaceShape:
    """Marks a calibrated family as Laplace noise: its multiplier ``b`` is the Laplace scale per
    unit of the release's per-record L1 bound (:class:`~privopt.privacy.Laplace`)."""


@dataclass(frozen=True)
class NoisyMaxShape:
    """Marks a calibrated family as report-noisy-max with Laplace scale ``b·Δ`` over values one
    record moves by at most ``Δ`` in one direction: an ``1/b``-DP release (:class:`~privopt.privacy.PureDP`)."""


def laplace_family(name: str, *, ratio: float = 1.0) -> tuple:
    """A calibrated Laplace family (its scale multiplier is ``scale · ratio``).

    Example:
        >>> from privopt.privacy import FullBatch, Inventory, PlannedStep, laplace_family
        >>> inv = Inventory((PlannedStep(FullBatch(), (laplace_family("losses"),), 10),))
        >>> list(inv.steps_for({"losses": 50.0}))[0].mechanisms
        (Laplace(scale_multiplier=50.0, name='losses', kind='laplace'),)
    """
    return (name, ratio, LaplaceShape())


def noisy_max_family(name: str, *, ratio: float = 1.0) -> tuple:
    """A calibrated report-noisy-max family: multiplier ``b`` is charged as ``PureDP(1/b)``.

    Example:
        >>> from privopt.privacy import FullBatch, Inventory, PlannedStep, noisy_max_family
        >>> inv = Inventory((PlannedStep(FullBatch(), (noisy_max_family("pick"),), 10),))
        >>> list(inv.steps_for({"pick": 4.0}))[0].mechanisms
        (PureDP(epsilon=0.25, name='pick', kind='pure'),)
    """
    return (name, ratio, NoisyMaxShape())


_SHAPES = (TreeShape, LaplaceShape, NoisyMaxShape)


def tree_family(name: str, *, steps, ratio: float = 1.0) -> tuple:
    """A calibrated tree-aggregation family for a :class:`PlannedStep` (DP-FTRL's noisy prefix sums).

    Example:
        >>> from privopt.privacy import FullBatch, Inventory, PlannedStep, tree_family
        >>> inv = Inventory((PlannedStep(FullBatch(), (tree_family("ftrl", steps=1000),), 1),))
        >>> list(inv.steps_for({"ftrl": 4.0}))[0].mechanisms
        (TreeAggregation(noise_multiplier=4.0, steps=(1000,), name='ftrl', kind='tree'),)
    """
    return (name, ratio, TreeShape(steps))


def _family(m) -> tuple:
    """Validate a calibrated-family entry: ``(name, ratio)`` or ``(name, ratio, TreeShape)``."""
    try:
        name, ratio, *shape = m
    except (TypeError, ValueError):
        raise ConfigError(f"planned mechanism must be ('name', ratio) or a Mechanism, got {m!r}") from None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"planned mechanism name must be a non-empty string, got {name!r}")
    if len(shape) > 1 or (shape and not isinstance(shape[0], _SHAPES)):
        raise ConfigError(f"a calibrated family is ('name', ratio) or ('name', ratio, <shape>), got {m!r}")
    return (name, check_ratio(name, ratio), *shape)


@dataclass(frozen=True)
class PlannedStep:
    """A step that will be executed ``count`` times.

    Args:
        sampling: How its batch is drawn (Poisson, WithoutReplacement, FullBatch, SingleRecord).
        mechanisms: Releases on that batch: ``("name", ratio)`` pairs for calibrated Gaussian
            families (``z_name = scale * ratio``), :func:`tree_family`, :func:`laplace_family` or
            :func:`noisy_max_family` entries for calibrated tree aggregation, Laplace or
            report-noisy-max releases, or fixed mechanism objects that are accounted but not calibrated.
        count: Planned (maximum) number of executions, an integer >= 0.
    """

    sampling: object
    mechanisms: tuple
    count: int

    def __post_init__(self):
        mechs = tuple(m if isinstance(m, _FIXED) else _family(m) for m in tuple(self.mechanisms))
        if not mechs:
            raise ConfigError("a planned step needs at least one mechanism")
        object.__setattr__(self, "mechanisms", mechs)
        object.__setattr__(self, "count", check_count(self.count, name="planned step count"))
        if not isinstance(self.sampling, (Poisson, WithoutReplacement, FullBatch, SingleRecord)):
            raise ConfigError(
                f"unknown sampling {self.sampling!r}; use Poisson, WithoutReplacement, FullBatch or SingleRecord"
            )
        trees = any(isinstance(m, TreeAggregation) or (isinstance(m, tuple) and _shape(m) is TreeShape) for m in mechs)
        if trees and not isinstance(self.sampling, FullBatch):
            raise ConfigError(f"tree aggregation covers a whole pass; plan it with FullBatch(), got {self.sampling!r}")

    def to_dict(self) -> dict:
        def entry(m) -> dict:
            if not isinstance(m, tuple):
                return {"fixed": asdict(m)}
            out = {"name": m[0], "ratio": m[1]}
            kind = _shape(m)
            if kind is TreeShape:
                return {**out, "tree_steps": list(m[2].steps)}
            return {**out, "kind": _KIND_NAMES[kind]} if kind is not None else out

        mechanisms = [entry(m) for m in self.mechanisms]
        return {"sampling": asdict(self.sampling), "mechanisms": mechanisms, "count": self.count}

    @classmethod
    def from_dict(cls, d: dict) -> PlannedStep:
        fixed = [m["fixed"] for m in d["mechanisms"] if "fixed" in m]
        # Reuse the Step decoder for the sampling and the fixed mechanisms.
        probe = step_from_dict({"sampling": d["sampling"], "mechanisms": fixed or [asdict(Gaussian(1.0))]})
        decoded = iter(probe.mechanisms)
        mechs = []
        for m in d["mechanisms"]:
            if "fixed" in m:
                mechs.append(next(decoded))
            elif "tree_steps" in m:
                mechs.append((m["name"], m["ratio"], TreeShape(tuple(m["tree_steps"]))))
            elif "kind" in m:
                mechs.append((m["name"], m["ratio"], _KINDS[m["kind"]]()))
            else:
                mechs.append((m["name"], m["ratio"]))
        return cls(sampling=probe.sampling, mechanisms=tuple(mechs), count=d["count"])


_KIND_NAMES = {LaplaceShape: "laplace", NoisyMaxShape: "noisy_max"}
_KINDS = {v: k for k, v in _KIND_NAMES.items()}


def _shape(m: tuple):
    return type(m[2]) if len(m) > 2 else None


def _instantiate(m, noise: dict[str, float]):
    if not isinstance(m, tuple):
        return m
    z, kind = float(noise[m[0]]), _shape(m)
    if kind is TreeShape:
        return TreeAggregation(z, steps=m[2].steps, name=m[0])
    if kind is LaplaceShape:
        return Laplace(z, name=m[0])
    if kind is NoisyMaxShape:
        return PureDP(1.0 / z, name=m[0])
    return Gaussian(z, name=m[0])


@dataclass(frozen=True)
class Inventory:
    """The planned privacy-relevant steps of one run (docs/accounting.md, "Calibration").

    ``composition`` says how the planned steps compose and so which ledger certifies a run:
    ``"plan"`` (default; a fixed schedule, :class:`~privopt.privacy.PrivacyLedger`), ``"filter"``
    (the steps are chosen adaptively; the planned schedule is nominal and fixes an RDP filter's
    order) or ``"parallel"`` (one planned step = one pass over disjoint parts, each record in at
    most one release per pass; :class:`~privopt.privacy.ParallelLedger`).

    A family name may appear in several planned steps (e.g. the same query on batches of two
    sizes); it then gets one noise multiplier, so its ratio (and kind) must agree everywhere.

    Example:
        >>> from privopt.privacy import Inventory, PlannedStep, Poisson
        >>> inv = Inventory((PlannedStep(Poisson(0.1), (("grad", 1.0),), 512),))
        >>> inv.names
        ('grad',)
        >>> list(inv.steps_for({"grad": 3.0}).values())
        [512]
    """

    steps: tuple[PlannedStep, ...]
    composition: str = "plan"

    def __post_init__(self):
        if self.composition not in COMPOSITIONS:
            raise ConfigError(f"unknown composition {self.composition!r}; use one of {COMPOSITIONS}")
        steps = tuple(self.steps)
        for s in steps:
            if not isinstance(s, PlannedStep):
                raise ConfigError(f"inventory entries must be PlannedStep, got {type(s).__name__}: {s!r}")
        object.__setattr__(self, "steps", steps)
        families: dict[str, tuple] = {}
        for s in steps:
            for m in s.mechanisms:
                if not isinstance(m, tuple):
                    continue
                seen = families.setdefault(m[0], m)
                if not math.isclose(seen[1], m[1], rel_tol=1e-12):
                    raise ConfigError(f"family {m[0]!r} has inconsistent noise ratios {seen[1]} and {m[1]}")
                if seen[2:] != m[2:]:
                    raise ConfigError(f"family {m[0]!r} is declared with two shapes: {seen} and {m}")
        object.__setattr__(self, "_ratios", {name: m[1] for name, m in families.items()})

    @property
    def names(self) -> tuple[str, ...]:
        """Calibrated family names, in first-appearance order."""
        return tuple(self._ratios)

    @property
    def ratios(self) -> dict[str, float]:
        """The inventory's noise ratio per family."""
        return dict(self._ratios)

    def steps_for(self, noise: dict[str, float]) -> dict[Step, int]:
        """The executed-steps mapping if every family ``name`` uses multiplier ``noise[name]``."""
        missing = [n for n in self.names if n not in noise]
        if missing:
            raise ConfigError(f"no noise multiplier given for families {missing}")
        out: dict[Step, int] = {}
        for s in self.steps:
            if s.count:
                step = Step(s.sampling, tuple(_instantiate(m, noise) for m in s.mechanisms))
                out[step] = out.get(step, 0) + s.count
        return out

    def to_dict(self) -> dict:
        out: dict = {"steps": [s.to_dict() for s in self.steps]}
        if self.composition != "plan":
            out["composition"] = self.composition
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Inventory:
        return cls(tuple(PlannedStep.from_dict(s) for s in d["steps"]), composition=d.get("composition", "plan"))
