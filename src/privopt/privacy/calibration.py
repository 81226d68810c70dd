"""Noise calibration: find the smallest noise whose accounted epsilon meets a target (SPEC §8.1, §8.5).

An :class:`Inventory` lists the planned steps of a run. Each Gaussian family (named release) gets a
noise multiplier ``z_name = scale * ratio_name``; :func:`calibrate` binary-searches ``scale`` on a
log grid (epsilon is monotone decreasing in every ``z``) until ``epsilon(delta) <= target``.

Fixed mechanisms (a :class:`~privopt.privacy.events.Laplace` or
:class:`~privopt.privacy.events.PureDP` whose parameter is not calibrated) may appear in an
inventory too; they are accounted but not scaled.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import asdict, dataclass, field, replace

from privopt.errors import ConfigError
from privopt.privacy import accountant as _acc
from privopt.privacy.events import (
    ADD_REMOVE,
    REPLACE_ONE,
    FullBatch,
    Gaussian,
    Laplace,
    Poisson,
    PureDP,
    SingleRecord,
    Step,
    WithoutReplacement,
    check_neighbouring,
    step_from_dict,
)

__all__ = [
    "PlannedStep",
    "Inventory",
    "Calibration",
    "calibrate",
    "gaussian_noise_multiplier",
    "dp_sgd_noise",
]

# Search range and precision of the calibrated scale. 1e-5 relative precision is well below the
# 3-4 significant digits anybody reports, and costs ~17 bisections after bracketing.
_SCALE_MIN = 1e-4
_SCALE_MAX = 1e8
_REL_TOL = 1e-5
# PLD precision (interval / epsilon) of the first, rough search stage.
_COARSE_RELATIVE = 1e-2


def _check_ratio(name: str, ratio) -> float:
    if not _acc._is_real(ratio) or not (0.0 < float(ratio) < math.inf):
        raise ConfigError(f"noise ratio of family {name!r} must be a finite number > 0, got {ratio!r}")
    return float(ratio)


@dataclass(frozen=True)
class PlannedStep:
    """A step that will be executed ``count`` times.

    Args:
        sampling: How its batch is drawn (Poisson, WithoutReplacement, FullBatch, SingleRecord).
        mechanisms: Releases on that batch: ``("name", ratio)`` pairs for calibrated Gaussian
            families (``z_name = scale * ratio``), or fixed ``Laplace``/``PureDP``/``Gaussian``
            mechanism objects that are accounted but not calibrated.
        count: Planned (maximum) number of executions, an integer >= 0.
    """

    sampling: object
    mechanisms: tuple
    count: int

    def __post_init__(self):
        mechs = []
        for m in tuple(self.mechanisms):
            if isinstance(m, (Gaussian, Laplace, PureDP)):
                mechs.append(m)
                continue
            try:
                name, ratio = m
            except (TypeError, ValueError):
                raise ConfigError(f"planned mechanism must be ('name', ratio) or a Mechanism, got {m!r}") from None
            if not isinstance(name, str) or not name:
                raise ConfigError(f"planned mechanism name must be a non-empty string, got {name!r}")
            mechs.append((name, _check_ratio(name, ratio)))
        if not mechs:
            raise ConfigError("a planned step needs at least one mechanism")
        object.__setattr__(self, "mechanisms", tuple(mechs))
        if not isinstance(self.count, numbers.Integral) or isinstance(self.count, bool) or self.count < 0:
            raise ConfigError(f"planned step count must be an integer >= 0, got {self.count!r}")
        object.__setattr__(self, "count", int(self.count))
        if not isinstance(self.sampling, (Poisson, WithoutReplacement, FullBatch, SingleRecord)):
            raise ConfigError(
                f"unknown sampling {self.sampling!r}; use Poisson, WithoutReplacement, FullBatch or SingleRecord"
            )

    def to_dict(self) -> dict:
        mechs = [
            {"name": m[0], "ratio": m[1]} if isinstance(m, tuple) else {"fixed": asdict(m)} for m in self.mechanisms
        ]
        return {"sampling": asdict(self.sampling), "mechanisms": mechs, "count": self.count}

    @classmethod
    def from_dict(cls, d: dict) -> PlannedStep:
        fixed = [m["fixed"] for m in d["mechanisms"] if "fixed" in m]
        # Reuse the Step decoder for the sampling and the fixed mechanisms.
        probe = step_from_dict({"sampling": d["sampling"], "mechanisms": fixed or [asdict(Gaussian(1.0))]})
        decoded = iter(probe.mechanisms)
        mechs = [next(decoded) if "fixed" in m else (m["name"], m["ratio"]) for m in d["mechanisms"]]
        return cls(sampling=probe.sampling, mechanisms=tuple(mechs), count=d["count"])


@dataclass(frozen=True)
class Inventory:
    """The planned privacy-relevant steps of one run (SPEC §8.1 "mechanism inventory").

    A family name may appear in several planned steps (e.g. the same query on batches of two
    sizes); it then gets one noise multiplier, so its ratio must agree everywhere.

    Example:
        >>> from privopt.privacy import Inventory, PlannedStep, Poisson
        >>> inv = Inventory((PlannedStep(Poisson(0.1), (("grad", 1.0),), 512),))
        >>> inv.names
        ('grad',)
        >>> list(inv.steps_for({"grad": 3.0}).values())
        [512]
    """

    steps: tuple[PlannedStep, ...]

    def __post_init__(self):
        steps = tuple(self.steps)
        for s in steps:
            if not isinstance(s, PlannedStep):
                raise ConfigError(f"inventory entries must be PlannedStep, got {type(s).__name__}: {s!r}")
        object.__setattr__(self, "steps", steps)
        ratios: dict[str, float] = {}
        for s in steps:
            for m in s.mechanisms:
                if isinstance(m, tuple):
                    name, r = m
                    if name in ratios and not math.isclose(ratios[name], r, rel_tol=1e-12):
                        raise ConfigError(f"family {name!r} has inconsistent noise ratios {ratios[name]} and {r}")
                    ratios.setdefault(name, r)
        object.__setattr__(self, "_ratios", ratios)

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
            mechs = tuple(Gaussian(float(noise[m[0]]), name=m[0]) if isinstance(m, tuple) else m for m in s.mechanisms)
            step = Step(s.sampling, mechs)
            if s.count:
                out[step] = out.get(step, 0) + s.count
        return out

    def to_dict(self) -> dict:
        return {"steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, d: dict) -> Inventory:
        return cls(tuple(PlannedStep.from_dict(s) for s in d["steps"]))


@dataclass(frozen=True)
class Calibration:
    """Result of a calibration.

    Attributes:
        noise: Noise multiplier per family name (std on the sum / per-record bound).
        scale: The common scale (``noise[name] = scale * ratio[name]``).
        epsilon: Achieved epsilon at ``delta`` (<= the target).
        delta: The delta.
        accountant: ``"pld"`` or ``"rdp"``.
        target_epsilon: The requested epsilon.
        neighbouring: The neighbouring relation used.
    """

    noise: dict[str, float]
    scale: float
    epsilon: float
    delta: float
    accountant: str
    target_epsilon: float = math.nan
    neighbouring: str = ADD_REMOVE
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "noise": dict(self.noise),
            "scale": self.scale,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "target_epsilon": self.target_epsilon,
            "neighbouring": self.neighbouring,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }


def calibrate(
    inventory: Inventory,
    *,
    epsilon: float,
    delta: float,
    neighbouring: str = ADD_REMOVE,
    accountant: str = "auto",
    ratios: dict[str, float] | None = None,
) -> Calibration:
    """Smallest noise scale such that the planned run is ``(epsilon, delta)``-DP.

    Args:
        inventory: Planned steps.
        epsilon: Target epsilon (finite, > 0).
        delta: Target delta in (0, 1).
        neighbouring: ``"add_remove"`` or ``"replace_one"``.
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``.
        ratios: Optional per-family ratios overriding the inventory's (paper-faithful shares,
            SPEC §8.1 step 3); families not listed keep their inventory ratio.

    Returns:
        :class:`Calibration` with ``noise[name] = scale * ratio[name]`` and the achieved epsilon.
        Results are cached, so calling again with the same arguments is free.

    Raises:
        ConfigError: invalid arguments, no calibrated family, or an infeasible target (e.g. the
            fixed, uncalibrated mechanisms alone already exceed it).

    Example:
        >>> from privopt.privacy import Inventory, PlannedStep, Poisson, calibrate
        >>> inv = Inventory((PlannedStep(Poisson(0.1), (("grad", 1.0),), 512),))
        >>> round(calibrate(inv, epsilon=1.0, delta=1e-6).noise["grad"], 2)
        9.66
    """
    if not isinstance(inventory, Inventory):
        raise ConfigError(f"calibrate() needs an Inventory, got {type(inventory).__name__}")
    epsilon = _acc.check_epsilon(epsilon)
    delta = _acc.check_delta(delta)
    check_neighbouring(neighbouring)
    _acc._check_accountant(accountant)
    merged = inventory.ratios
    for name, r in (ratios or {}).items():
        if name not in merged:
            raise ConfigError(f"ratios names unknown family {name!r}; inventory families are {inventory.names}")
        merged[name] = _check_ratio(name, r)
    if not merged:
        raise ConfigError("the inventory has no calibrated (named) Gaussian family")
    key_ratios = tuple(sorted(merged.items()))
    cal = _calibrate_cached(inventory, epsilon, delta, neighbouring, accountant, key_ratios)
    # Copy the mutable parts so callers cannot corrupt the cached result.
    return replace(cal, noise=dict(cal.noise), extra=dict(cal.extra))


@functools.lru_cache(maxsize=256)
def _calibrate_cached(inventory, epsilon, delta, neighbouring, accountant, key_ratios) -> Calibration:
    ratios = dict(key_ratios)
    names = inventory.names
    kind = _acc._resolve(
        _acc.normalize_counts(inventory.steps_for(dict.fromkeys(names, 1.0))), neighbouring, accountant
    )

    def evaluator(relative: float):
        def eps_at(scale: float) -> _acc.EpsilonResult:
            counts = _acc.normalize_counts(inventory.steps_for({n: scale * r for n, r in ratios.items()}))
            return _acc._epsilon(counts, delta, neighbouring, kind, relative)

        return eps_at

    exact = evaluator(_acc._PLD_RELATIVE_INTERVAL)
    if kind == "pld":
        # Stage 1 on a coarse PLD grid (cheap), stage 2 refines with the exact evaluator inside a
        # +-2% bracket around it: ~12 accurate evaluations instead of ~25.
        rough, _ = _search(evaluator(_COARSE_RELATIVE), epsilon, delta, accountant, start=1.0, step=2.0, rel_tol=1e-3)
        scale, res = _search(exact, epsilon, delta, accountant, start=rough, step=1.02, rel_tol=_REL_TOL)
    else:
        scale, res = _search(exact, epsilon, delta, accountant, start=1.0, step=2.0, rel_tol=_REL_TOL)
    return _make(ratios, scale, res, epsilon, neighbouring)


def _search(eps_at, epsilon, delta, accountant, *, start: float, step: float, rel_tol: float):
    """Smallest scale (to ``rel_tol``) with ``eps_at(scale) <= epsilon``; returns (scale, result)."""
    # Bracket [lo, hi] with eps(lo) > target >= eps(hi), moving geometrically from `start`.
    hi = start
    res_hi = eps_at(hi)
    if res_hi.epsilon <= epsilon:
        lo = hi
        while True:
            lo = lo / step
            if lo < _SCALE_MIN:
                return hi, res_hi  # any noise works (e.g. nothing is ever released)
            res_lo = eps_at(lo)
            if res_lo.epsilon > epsilon:
                break
            hi, res_hi = lo, res_lo
    else:
        res_lo = res_hi
        while True:
            lo, hi = hi, hi * step
            if hi > _SCALE_MAX:
                raise ConfigError(
                    f"target epsilon={epsilon} at delta={delta} is infeasible: even noise scale {_SCALE_MAX:g} gives "
                    f"epsilon={eps_at(_SCALE_MAX).epsilon:.4g} ({accountant}); the fixed (uncalibrated) mechanisms or "
                    "the delta may be too strict -- raise epsilon/delta or add noise to the fixed releases"
                )
            res_lo, res_hi = res_hi, eps_at(hi)
            if res_hi.epsilon <= epsilon:
                break
    # Shrink the bracket. log(eps) is close to linear in log(scale), so interpolate there and probe
    # just either side of the guess: usually the bracket collapses to ~rel_tol in 2-4 evaluations.
    # Fall back to a geometric bisection step whenever a guess does not move both ends.
    interpolate = True
    while hi / lo > 1.0 + rel_tol:
        e_lo, e_hi = res_lo.epsilon, res_hi.epsilon
        if interpolate and 0 < e_hi < epsilon < e_lo < math.inf:
            t = math.log(e_lo / epsilon) / math.log(e_lo / e_hi)
            guess = lo * (hi / lo) ** t
            pad = 1.0 + rel_tol / 4.0
            probes = [min(guess * pad, hi / pad), max(guess / pad, lo * pad)]
        else:
            probes = [math.sqrt(lo * hi)]
        moved = set()
        for p in probes:
            if not lo < p < hi:
                continue
            res = eps_at(p)
            if res.epsilon <= epsilon:
                hi, res_hi = p, res
                moved.add("hi")
            else:
                lo, res_lo = p, res
                moved.add("lo")
        interpolate = len(probes) == 1 or moved == {"hi", "lo"}
    return hi, res_hi


def _make(ratios, scale, res, target, neighbouring) -> Calibration:
    return Calibration(
        noise={n: scale * r for n, r in ratios.items()},
        scale=scale,
        epsilon=res.epsilon,
        delta=res.delta,
        accountant=res.accountant,
        target_epsilon=target,
        neighbouring=neighbouring,
    )


def gaussian_noise_multiplier(*, epsilon: float, delta: float) -> float:
    """Smallest ``sigma / Delta`` making ONE non-subsampled Gaussian release ``(epsilon, delta)``-DP.

    Exact analytic Gaussian mechanism (Balle & Wang 2018, SPEC §8.5): no ``epsilon < 1``
    restriction, and well below the classical ``sqrt(2 ln(1.25/delta)) / epsilon``. ``Delta`` is
    the L2 sensitivity under the neighbouring relation you use.

    Example:
        >>> from privopt.privacy import gaussian_noise_multiplier
        >>> round(gaussian_noise_multiplier(epsilon=1.0, delta=1e-5), 3)
        3.731
    """
    from dp_accounting import gaussian_mechanism

    epsilon = _acc.check_epsilon(epsilon)
    delta = _acc.check_delta(delta)
    return float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta))


def dp_sgd_noise(
    *,
    dataset_size: int,
    batch_size: int,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: str = "auto",
    sampling: str = "poisson",
    neighbouring: str | None = None,
) -> Calibration:
    """Noise multiplier of DP-SGD: ``steps`` noisy sums of clipped gradients on sampled batches.

    Args:
        dataset_size: n.
        batch_size: Expected (Poisson) or exact (``"wor"``) batch size b <= n.
        steps: Number of noisy gradient steps.
        epsilon: Target epsilon.
        delta: Target delta.
        accountant: ``"auto"`` (PLD for Poisson, RDP for ``"wor"``), ``"pld"`` or ``"rdp"``.
        sampling: ``"poisson"`` (rate b/n, add/remove) or ``"wor"`` (fixed-size batches without
            replacement, replace-one; RDP only).
        neighbouring: Defaults to the relation the sampling scheme is analysed under.

    Returns:
        :class:`Calibration` with the single family ``"gradient"``.

    Example:
        >>> from privopt.privacy import dp_sgd_noise
        >>> cal = dp_sgd_noise(dataset_size=10_000, batch_size=1000, steps=512, epsilon=1.0, delta=1e-6)
        >>> round(cal.noise["gradient"], 2)
        9.66
    """
    for name, v in (("dataset_size", dataset_size), ("batch_size", batch_size), ("steps", steps)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if batch_size > dataset_size:
        raise ConfigError(f"batch_size={batch_size} exceeds dataset_size={dataset_size}")
    if sampling == "poisson":
        sampler = Poisson(batch_size / dataset_size)
        neighbouring = ADD_REMOVE if neighbouring is None else neighbouring
    elif sampling == "wor":
        sampler = WithoutReplacement(int(dataset_size), int(batch_size))
        neighbouring = REPLACE_ONE if neighbouring is None else neighbouring
    else:
        raise ConfigError(f"unknown sampling {sampling!r}; use 'poisson' or 'wor'")
    inv = Inventory((PlannedStep(sampler, (("gradient", 1.0),), int(steps)),))
    return calibrate(inv, epsilon=epsilon, delta=delta, neighbouring=neighbouring, accountant=accountant)
