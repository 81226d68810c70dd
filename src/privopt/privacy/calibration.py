"""Noise calibration: the smallest noise whose accounted epsilon meets a target.

:func:`calibrate` scales every calibrated family of an :class:`~privopt.privacy.Inventory`
(``z_name = scale * ratio_name``) and searches the scale in stages:

1. with the RDP accountant, which is fast for any schedule and any delta: a valid answer;
2. with the requested accountant on a coarser PLD grid, starting from the RDP answer: a guide to
   where the crossing is and how steeply epsilon falls there (never an answer);
3. with the requested accountant (``auto``: the smaller of PLD and RDP), starting from the guide,
   until the time budget runs out.

Complete results are also kept on disk across runs (:mod:`privopt.privacy.cache`) and certified
again by the accountant when read back.

The answer is the smallest scale found whose epsilon is within target, so a search cut short by
the time budget still returns a safe (if slightly larger) noise. See docs/accounting.md,
"Calibration".
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from privopt.errors import ConfigError
from privopt.privacy.accountant import coarse_epsilon_of, epsilon_of, pld_supported
from privopt.privacy.cache import DiskCache
from privopt.privacy.checks import check_accountant, check_count, check_delta, check_epsilon, check_ratio
from privopt.privacy.events import ADD_REMOVE, REPLACE_ONE, Poisson, WithoutReplacement, check_neighbouring
from privopt.privacy.inventory import Inventory, PlannedStep
from privopt.privacy.search import EPSILON_TOL, CalibrationProgress, NoFeasibleScale, ScaleSearch, SearchTimeout

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "Calibration",
    "CalibrationProgress",
    "calibrate",
    "gaussian_noise_multiplier",
    "dp_sgd_inventory",
    "dp_sgd_noise",
]

# Seconds a calibration may search before it returns the best noise found so far.
DEFAULT_TIME_LIMIT = 60.0
# Relative precision of the calibrated scale: far below the 3-4 significant digits anybody reports.
_REL_TOL = 1e-5
# Schedules of this many executions or more are searched with the PLD accountant until epsilon is
# within 0.1% of the target (each evaluation costs seconds there, and the PLD's own discretisation
# error is larger than that); smaller ones until it is within 1e-5.
_LONG_SCHEDULE = 100_000
_LONG_SCHEDULE_TOL = 1e-3
# The exact search is steered by a first search on a PLD grid this many times coarser (about as
# many times cheaper per evaluation), so that only two or three exact evaluations remain.
_COARSEN = 10.0
_COARSE_TOL = 1e-4
# The guide is used when the exact epsilon at its scale is within this (log) distance of the coarse one.
_GUIDE_AGREEMENT = 0.1
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256
# Complete calibrations persist across runs (docs/accounting.md, "Caching").
_DISK = DiskCache("calibration")


@dataclass(frozen=True)
class Calibration:
    """Result of a calibration.

    Attributes:
        noise: Noise multiplier per family name (std on the sum / per-record bound).
        scale: The common scale (``noise[name] = scale * ratio[name]``).
        epsilon: Achieved epsilon at ``delta`` (<= the target).
        delta: The delta.
        accountant: ``"pld"`` or ``"rdp"``: the accountant whose bound certifies ``epsilon``.
        target_epsilon: The requested epsilon.
        neighbouring: The neighbouring relation used.
        extra: ``{"complete": False, ...}`` when the time budget cut the search short (the
            noise is then valid but may be larger than necessary); empty otherwise.
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


def _merged_ratios(inventory: Inventory, ratios) -> dict[str, float]:
    merged = inventory.ratios
    for name, r in (ratios or {}).items():
        if name not in merged:
            raise ConfigError(f"ratios names unknown family {name!r}; inventory families are {inventory.names}")
        merged[name] = check_ratio(name, r)
    if not merged:
        raise ConfigError("the inventory has no calibrated (named) family")
    return merged


def calibrate(
    inventory: Inventory,
    *,
    epsilon: float,
    delta: float,
    neighbouring: str = ADD_REMOVE,
    accountant: str = "auto",
    ratios: dict[str, float] | None = None,
    time_limit: float | None = None,
    progress: Callable[[CalibrationProgress], None] | None = None,
) -> Calibration:
    """Smallest noise scale such that the planned run is ``(epsilon, delta)``-DP.

    Args:
        inventory: Planned steps.
        epsilon: Target epsilon (finite, > 0).
        delta: Target delta in (0, 1).
        neighbouring: ``"add_remove"`` or ``"replace_one"``.
        accountant: ``"auto"`` (the smaller of PLD and RDP at each scale), ``"pld"`` or ``"rdp"``.
        ratios: Optional per-family ratios overriding the inventory's (paper-faithful shares);
            families not listed keep their inventory ratio.
        time_limit: Seconds the search may take (default :data:`DEFAULT_TIME_LIMIT`); when it
            runs out the best noise found so far is returned, marked ``extra["complete"] = False``.
        progress: Called with a :class:`CalibrationProgress` after every accountant evaluation.

    Returns:
        :class:`Calibration` with ``noise[name] = scale * ratio[name]`` and the achieved epsilon,
        which :func:`~privopt.privacy.epsilon_of` reproduces for ``inventory.steps_for(noise)``.
        Complete results are cached, so calling again with the same arguments is free.

    Raises:
        ConfigError: invalid arguments, no calibrated family, an infeasible target (e.g. the
            fixed, uncalibrated mechanisms alone already exceed it), or no answer in time.

    Example:
        >>> from privopt.privacy import Inventory, PlannedStep, Poisson, calibrate
        >>> inv = Inventory((PlannedStep(Poisson(0.1), (("grad", 1.0),), 512),))
        >>> round(calibrate(inv, epsilon=1.0, delta=1e-6).noise["grad"], 2)
        9.66
    """
    if not isinstance(inventory, Inventory):
        raise ConfigError(f"calibrate() needs an Inventory, got {type(inventory).__name__}")
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    check_neighbouring(neighbouring)
    check_accountant(accountant)
    merged = _merged_ratios(inventory, ratios)
    limit = DEFAULT_TIME_LIMIT if time_limit is None else check_epsilon(time_limit, name="time_limit")
    key = (inventory, epsilon, delta, neighbouring, accountant, tuple(sorted(merged.items())))
    cal = _CACHE.get(key) or _stored_or_run(key, merged, limit, progress)
    # Copy the mutable parts so callers cannot corrupt the cached result.
    return replace(cal, noise=dict(cal.noise), extra=dict(cal.extra))


def _stored_or_run(key: tuple, ratios: dict[str, float], limit: float, progress) -> Calibration:
    """The calibration from the disk cache, else computed (and stored when complete)."""
    inventory, epsilon, delta, neighbouring, accountant, _ = key
    disk_key = {"inventory": repr(inventory), "target": key[1:5], "ratios": [list(kv) for kv in key[5]]}
    cal = _from_disk(_DISK.get(disk_key), inventory, ratios, key)
    if cal is None:
        cal = _Calibrator(inventory, ratios, epsilon, delta, neighbouring, limit, progress).run(accountant)
        if not cal.extra:
            _DISK.put(disk_key, cal.to_dict())
    if not cal.extra:
        _CACHE[key] = cal
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return cal


def _from_disk(entry, inventory: Inventory, ratios: dict[str, float], key: tuple) -> Calibration | None:
    """A stored calibration, if it is one for these inputs and the accountant certifies it again now."""
    _, epsilon, delta, neighbouring, accountant, _ = key
    try:
        cal = Calibration(**entry)
        same = (cal.target_epsilon, cal.delta, cal.neighbouring) == (epsilon, delta, neighbouring)
        if not same or cal.extra or cal.noise != {n: cal.scale * r for n, r in ratios.items()}:
            return None
        # The check costs one accountant call, itself cached on disk: a stored noise is never trusted blindly.
        steps = inventory.steps_for(cal.noise)
        again = epsilon_of(steps, delta=delta, neighbouring=neighbouring, accountant=accountant)
    except (TypeError, ValueError, ConfigError):
        return None
    return cal if cal.epsilon <= epsilon and again.epsilon <= epsilon else None


class _Calibrator:
    """One calibration: the two search stages over a shared clock."""

    def __init__(self, inventory, ratios, epsilon, delta, neighbouring, time_limit, progress):
        self.inventory, self.ratios = inventory, ratios
        self.epsilon, self.delta, self.neighbouring = epsilon, delta, neighbouring
        now = time.monotonic()
        self.clock = {"started": now, "deadline": now + time_limit, "evaluations": 0, "progress": progress}

    def _search(self, accountant: str, *, coarsen: float = 1.0, slope: float = -1.0, stage: str = "") -> ScaleSearch:
        kw = dict(delta=self.delta, neighbouring=self.neighbouring, accountant=accountant)

        def eps_at(scale: float):
            counts = self.inventory.steps_for({n: scale * r for n, r in self.ratios.items()})
            return epsilon_of(counts, **kw) if coarsen == 1.0 else coarse_epsilon_of(counts, coarsen=coarsen, **kw)

        long = accountant != "rdp" and sum(s.count for s in self.inventory.steps) >= _LONG_SCHEDULE
        tol = _LONG_SCHEDULE_TOL if long else EPSILON_TOL
        if coarsen != 1.0:  # a guide: as close as its own grid error
            tol = max(tol, _COARSE_TOL)
        stage = stage or (accountant if coarsen == 1.0 else f"{accountant}, coarse grid")
        return ScaleSearch(eps_at, self.epsilon, stage=stage, clock=self.clock, epsilon_tol=tol, slope=slope)

    def _coarse(self, accountant: str, start: float) -> tuple[float, float, float] | None:
        """Where the crossing is (scale, slope of log eps there, eps) by the PLD on a coarse grid:
        a guide only, every answer comes from the exact accountant. None if no scale meets the target."""
        search = self._search(accountant, coarsen=_COARSEN)
        try:
            search.run(start, rel_tol=_REL_TOL)
        except NoFeasibleScale:
            return None
        except SearchTimeout:
            pass
        if search.best is None:
            return None
        scale, res = search.best
        return scale, search.slope_near(scale), res.epsilon

    def _exact(self, accountant: str, start: float):
        """The exact search, from the coarse guide when the exact epsilon there agrees with it, else
        (a schedule at the edge of what the PLD's grid can express) from ``start`` as if unguided."""
        guide = self._coarse(accountant, start)
        if guide is not None:
            search = self._search(accountant, slope=guide[1])
            try:
                agrees = abs(math.log(search.evaluate(math.log(guide[0])).epsilon / guide[2])) < _GUIDE_AGREEMENT
            except SearchTimeout:
                return search.best, False
            except (ValueError, ZeroDivisionError):  # inf or 0 epsilon: the grids disagree
                agrees = False
            if agrees:
                return self._stage(search, guide[0])
        return self._stage(self._search(accountant), start)

    def run(self, accountant: str) -> Calibration:
        probe = self.inventory.steps_for(dict.fromkeys(self.ratios, 1.0))
        supported = pld_supported(probe, neighbouring=self.neighbouring)
        if accountant == "pld" and not supported:
            epsilon_of(probe, delta=self.delta, neighbouring=self.neighbouring, accountant="pld")  # explains why
        # The fast RDP search first: auto's answer when it is the smaller; only a starting point of
        # pld's search, so its progress is labelled as pld's.
        first, complete = self._stage(self._search("rdp", stage="pld, rdp start" if accountant == "pld" else ""), 1.0)
        if accountant == "rdp" or (accountant == "auto" and not supported):
            return self._result(first, accountant, complete)
        best, complete = self._exact(accountant, 1.0 if first is None else first[0])
        if accountant == "auto" and first is not None and (best is None or first[0] < best[0]):
            best = first  # auto's epsilon is never above RDP's, so the RDP answer stays valid
        return self._result(best, accountant, complete)

    def _stage(self, search: ScaleSearch, start: float):
        """Run one search; returns (best or None, whether it completed)."""
        try:
            return search.run(start, rel_tol=_REL_TOL), True
        except NoFeasibleScale:
            return search.best, True
        except SearchTimeout:
            return search.best, False

    def _timed_out(self) -> bool:
        return time.monotonic() > self.clock["deadline"]

    def _result(self, best, accountant: str, complete: bool = True) -> Calibration:
        if best is None:
            self._fail(accountant)
        scale, res = best
        return Calibration(
            noise={n: scale * r for n, r in self.ratios.items()},
            scale=scale,
            epsilon=res.epsilon,
            delta=res.delta,
            accountant=res.accountant,
            target_epsilon=self.epsilon,
            neighbouring=self.neighbouring,
            extra={} if complete else {"complete": False, "evaluations": self.clock["evaluations"]},
        )

    def _fail(self, accountant: str):
        if self._timed_out():
            raise ConfigError(
                f"calibration found no noise meeting epsilon={self.epsilon} at delta={self.delta} within its time "
                "limit; raise time_limit (CLI --time-limit) or use accountant='rdp'"
            )
        probe = self.inventory.steps_for(dict.fromkeys(self.ratios, 1e8))
        worst = epsilon_of(probe, delta=self.delta, neighbouring=self.neighbouring, accountant=accountant).epsilon
        hint = ""
        if worst == math.inf:
            hint = " (the PLD accountant cannot certify a delta below ~1e-15; use 'auto' or 'rdp')"
        raise ConfigError(
            f"target epsilon={self.epsilon} at delta={self.delta} is infeasible: even noise scale 1e+08 gives "
            f"epsilon={worst:.4g} ({accountant}){hint}; the fixed (uncalibrated) mechanisms or the delta may be "
            "too strict -- raise epsilon/delta or add noise to the fixed releases"
        )


def gaussian_noise_multiplier(*, epsilon: float, delta: float) -> float:
    """Smallest ``sigma / Delta`` making ONE non-subsampled Gaussian release ``(epsilon, delta)``-DP.

    Exact analytic Gaussian mechanism (Balle & Wang 2018; docs/accounting.md, "Calibration"):
    no ``epsilon < 1`` restriction, and well below the classical ``sqrt(2 ln(1.25/delta)) / epsilon``.
    ``Delta`` is the L2 sensitivity under the neighbouring relation you use.

    Example:
        >>> from privopt.privacy import gaussian_noise_multiplier
        >>> round(gaussian_noise_multiplier(epsilon=1.0, delta=1e-5), 3)
        3.731
    """
    from dp_accounting.pld import accountant, common

    guarantee = common.DifferentialPrivacyParameters(check_epsilon(epsilon), check_delta(delta))
    return float(accountant.get_smallest_gaussian_noise(guarantee))


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
    time_limit: float | None = None,
    progress: Callable[[CalibrationProgress], None] | None = None,
) -> Calibration:
    """Noise multiplier of DP-SGD: ``steps`` noisy sums of clipped gradients on sampled batches.

    Args:
        dataset_size: n.
        batch_size: Expected (Poisson) or exact (``"wor"``) batch size b <= n.
        steps: Number of noisy gradient steps.
        epsilon: Target epsilon.
        delta: Target delta.
        accountant: ``"auto"`` (the smaller of PLD and RDP; RDP for ``"wor"``), ``"pld"`` or ``"rdp"``.
        sampling: ``"poisson"`` (rate b/n, add/remove) or ``"wor"`` (fixed-size batches without
            replacement, replace-one; RDP only).
        neighbouring: Defaults to the relation the sampling scheme is analysed under.
        time_limit: Search time budget in seconds (see :func:`calibrate`).
        progress: Progress callback (see :func:`calibrate`).

    Returns:
        :class:`Calibration` with the single family ``"gradient"``.

    Example:
        >>> from privopt.privacy import dp_sgd_noise
        >>> cal = dp_sgd_noise(dataset_size=10_000, batch_size=1000, steps=512, epsilon=1.0, delta=1e-6)
        >>> round(cal.noise["gradient"], 2)
        9.66
    """
    inv, default_relation = dp_sgd_inventory(
        dataset_size=dataset_size, batch_size=batch_size, steps=steps, sampling=sampling
    )
    return calibrate(
        inv,
        epsilon=epsilon,
        delta=delta,
        neighbouring=default_relation if neighbouring is None else neighbouring,
        accountant=accountant,
        time_limit=time_limit,
        progress=progress,
    )


def dp_sgd_inventory(*, dataset_size: int, batch_size: int, steps: int, sampling: str = "poisson"):
    """The plan of DP-SGD (one calibrated family ``"gradient"``) and the relation its sampling is analysed under.

    Returns:
        ``(Inventory, neighbouring)``: Poisson sampling at rate b/n under add/remove, or fixed-size
        batches without replacement (``"wor"``) under replace-one.

    Raises:
        ConfigError: a size that is not an integer >= 1, b > n, or an unknown sampling.
    """
    n = check_count(dataset_size, name="dataset_size", minimum=1)
    b = check_count(batch_size, name="batch_size", minimum=1)
    steps = check_count(steps, name="steps", minimum=1)
    if b > n:
        raise ConfigError(f"batch_size={b} exceeds dataset_size={n}")
    if sampling == "poisson":
        sampler, relation = Poisson(b / n), ADD_REMOVE
    elif sampling == "wor":
        sampler, relation = WithoutReplacement(n, b), REPLACE_ONE
    else:
        raise ConfigError(f"unknown sampling {sampling!r}; use 'poisson' or 'wor'")
    return Inventory((PlannedStep(sampler, (("gradient", 1.0),), steps),)), relation
