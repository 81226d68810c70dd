"""The ``(epsilon, delta)`` guarantee of executed :class:`~privopt.privacy.events.Step` counts.

A thin, cached layer over dp_accounting's public accountants:

* **RDP** (``RdpAccountant``): every step has an RDP curve (cached per step); curves add up under
  composition, and ``compute_epsilon`` / ``compute_delta`` convert the total. It expresses every
  privopt event and any delta, but is loose for large epsilons and long schedules of strong noise.
* **PLD** (``PLDAccountant``, privacy loss distributions): tight numerical composition of
  non-subsampled and Poisson-subsampled Gaussian, Laplace and pure-DP releases. It cannot express
  fixed-size sampling without replacement or tree aggregation, nor certify a delta below the tail
  mass it truncates (about 1e-15).

``accountant="auto"`` (the default) evaluates both where PLD applies and returns the smaller
epsilon: both are valid upper bounds, so their minimum is one too.

The PLD discretisation interval is chosen from the schedule (about 1e-4 of the epsilon, coarser
when the loss distribution would need more than ~10^6 points, and 10 or 100 times coarser when
dp_accounting's truncation bounds say the composition needs more than 2*10^6), so one call costs
at most a few seconds whatever the schedule; see docs/accounting.md, "PLD or RDP". The loss distribution of a
Poisson-subsampled Gaussian step is built once per (noise, rate, grid) and reused by later calls
(a run asks for the epsilon spent at every evaluation): the same operations, the same result.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import dp_accounting as dpa
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from privopt.errors import ConfigError
from privopt.privacy.cache import DiskCache
from privopt.privacy.checks import (
    ACCOUNTANTS,
    check_accountant,
    check_count,
    check_delta,
    check_epsilon,
)
from privopt.privacy.events import ADD_REMOVE, Step, check_neighbouring
from privopt.privacy.pld_compose import TooCostly
from privopt.privacy.pld_compose import fast_pld as _pld_accountant
from privopt.privacy.translate import dp_relation_for, pld_coin_epsilons, pld_event, rdp_parts, to_dp_event

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ORDERS",
    "EpsilonResult",
    "to_dp_event",
    "dp_relation_for",
    "epsilon_of",
    "delta_of",
    "rdp_curve",
    "pld_supported",
    "normalize_counts",
    "check_delta",
    "check_epsilon",
]

DEFAULT_ORDERS = tuple(float(a) for a in rdp_lib.DEFAULT_RDP_ORDERS)


class _QuietDpAccounting(logging.Filter):
    """Drops dp_accounting's own absl warnings (below ERROR), nothing else.

    Its RDP accountant logs one warning per Renyi order it skips (hundreds per calibration): not
    actionable for a user of privopt, and it floods the logs of any program that uses privopt as a
    library. Installed on the absl logger at import; the user's own absl logging is untouched.
    """

    _root = str(Path(dpa.__file__).resolve().parent)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return not str(Path(record.pathname).resolve()).startswith(self._root)


def _quiet_dp_accounting() -> None:
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _QuietDpAccounting) for f in absl.filters):
        absl.addFilter(_QuietDpAccounting())


_quiet_dp_accounting()

# PLD discretisation: ~1e-4 of epsilon reproduces dp-accounting's fine fixed grid to 4
# significant digits. Intervals are quantised to quarter decades so that nearby schedules share
# a grid (results are then monotone in practice). The composed loss distribution spans about
# _PLD_RANGE_FACTOR times the epsilon at _TAIL_DELTA (measured: 4-9x); the interval is coarsened
# so that it has at most _PLD_MAX_POINTS points (about 2 s on one core).
_PLD_RELATIVE = 1e-4
_PLD_MIN_INTERVAL = 1e-6
# dp-accounting's PLD construction overflows (exp of the interval) far above this.
_PLD_MAX_INTERVAL = 500.0
_PLD_RANGE_FACTOR = 10.0
_PLD_MAX_POINTS = 1_000_000
_TAIL_DELTA = 1e-15
# Refine a PLD evaluation on a finer grid only if the grid shrinks by at least half a decade.
_PLD_REFINE_GAIN = 10**0.5
# Grids tried, relative to the chosen one, when a composition exceeds MAX_COMPOSED_POINTS.
_PLD_COARSER = (1.0, 10.0, 100.0)


@dataclass(frozen=True)
class EpsilonResult:
    """The privacy guarantee of a set of executed steps.

    Attributes:
        epsilon: Smallest epsilon the accountant certifies at ``delta`` (``inf`` if none).
        delta: The delta it was computed for.
        accountant: ``"pld"`` or ``"rdp"`` -- the accountant whose bound this is.
        grid: The PLD discretisation interval that gave ``epsilon`` (``None`` unless PLD).
    """

    epsilon: float
    delta: float
    accountant: str
    grid: float | None = None

    def to_dict(self) -> dict:
        out = {"epsilon": self.epsilon, "delta": self.delta, "accountant": self.accountant}
        return out if self.grid is None else {**out, "pld_grid": self.grid}


def normalize_counts(counts) -> dict[Step, int]:
    """Turn ``{Step: count}`` or an iterable of ``(Step, count)`` pairs into a dict.

    Repeated steps are summed, zero counts dropped; insertion order is kept.

    Raises:
        ConfigError: a key is not a :class:`Step` or a count is not an integer >= 0.
    """
    items = counts.items() if isinstance(counts, Mapping) else counts
    if not isinstance(items, Iterable):
        raise ConfigError(f"counts must be a mapping Step -> int or pairs (Step, int), got {type(counts).__name__}")
    out: dict[Step, int] = {}
    for pair in items:
        try:
            step, count = pair
        except (TypeError, ValueError):
            raise ConfigError(f"counts entries must be (Step, count) pairs, got {pair!r}") from None
        if not isinstance(step, Step):
            raise ConfigError(f"counts keys must be privopt.privacy.Step, got {type(step).__name__}: {step!r}")
        count = check_count(count, name=f"step count of {step}")
        if count:
            out[step] = out.get(step, 0) + count
    return out


def _canonical(counts: dict[Step, int]) -> tuple[tuple[Step, int], ...]:
    # A fixed order (not hash order, which varies between processes) makes PLD composition, and
    # so every epsilon, bit-for-bit reproducible.
    return tuple(sorted(counts.items(), key=lambda kv: repr(kv[0])))


# ---------------------------------------------------------------- RDP


@functools.lru_cache(maxsize=8192)
def _step_rdp(step: Step, neighbouring: str, orders: tuple[float, ...]) -> np.ndarray:
    curve = np.zeros(len(orders))
    for event, relation in rdp_parts(step, neighbouring=neighbouring):
        acc = dpa.rdp.RdpAccountant(orders=list(orders), neighboring_relation=relation)
        acc.compose(event)
        curve += acc.rdp
    curve.setflags(write=False)
    return curve


def rdp_curve(counts, *, neighbouring: str = ADD_REMOVE, orders: Iterable[float] | None = None) -> np.ndarray:
    """Total RDP of the executed steps at each order (RDP adds up under composition).

    Args:
        counts: ``{Step: count}`` or an iterable of ``(Step, count)`` pairs.
        neighbouring: ``"add_remove"`` or ``"replace_one"``.
        orders: Renyi orders (> 1); dp_accounting's default orders if omitted.

    Example:
        >>> from privopt.privacy import FullBatch, Gaussian, Step, rdp_curve
        >>> rdp_curve({Step(FullBatch(), (Gaussian(2.0),)): 4}, orders=[2.0]).tolist()  # 4 * 2 / (2 * 2^2)
        [1.0]
    """
    check_neighbouring(neighbouring)
    orders = DEFAULT_ORDERS if orders is None else tuple(float(a) for a in orders)
    if not orders or any(not (a > 1.0 and math.isfinite(a)) for a in orders):
        raise ConfigError(f"RDP orders must be finite numbers > 1, got {orders}")
    total = np.zeros(len(orders))
    for step, count in _canonical(normalize_counts(counts)):
        total = total + count * _step_rdp(step, neighbouring, orders)
    return total


def _rdp_epsilon(curve: np.ndarray, delta: float) -> float:
    return float(rdp_lib.compute_epsilon(DEFAULT_ORDERS, curve, delta)[0])


# ---------------------------------------------------------------- PLD


@functools.lru_cache(maxsize=1024)
def _pld_supported(steps: tuple[Step, ...], neighbouring: str) -> bool:
    return all(pld_event(s, neighbouring=neighbouring) is not None for s in steps)


def pld_supported(counts, *, neighbouring: str = ADD_REMOVE) -> bool:
    """Whether the PLD accountant can express every step (no fixed-size sampling without
    replacement, no tree aggregation)."""
    steps = tuple(s for s, _ in _canonical(normalize_counts(counts)))
    return _pld_supported(steps, check_neighbouring(neighbouring))


def _pld_event(items: tuple[tuple[Step, int], ...], neighbouring: str) -> dpa.DpEvent:
    merged: dict[str, list] = {}  # steps that differ only in names are one event (keyed by repr: lists inside)
    for step, count in items:
        event = pld_event(step, neighbouring=neighbouring)
        merged.setdefault(repr(event), [event, 0])[1] += count
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(e, c) for e, c in merged.values()])


def _quantise(x: float, *, up: bool) -> float:
    k = 4.0 * math.log10(x)
    return 10.0 ** ((math.ceil(k) if up else math.floor(k)) / 4.0)


def _interval(epsilon: float, tail_epsilon: float) -> float:
    """Discretisation for a schedule whose epsilon is about ``epsilon`` and whose loss
    distribution reaches about ``tail_epsilon``; ``inf`` when PLD would be too costly or unusable."""
    if not (math.isfinite(tail_epsilon) and tail_epsilon > 0):
        return math.inf
    cost = _quantise(_PLD_RANGE_FACTOR * tail_epsilon / _PLD_MAX_POINTS, up=True)
    if cost > _PLD_MAX_INTERVAL:
        return math.inf
    precise = _quantise(_PLD_RELATIVE * epsilon, up=False) if math.isfinite(epsilon) and epsilon > 0 else 0.0
    return max(cost, min(precise, _PLD_MAX_INTERVAL), _PLD_MIN_INTERVAL)


def _snap(interval: float, coins: frozenset) -> float:
    """A pure-DP coin's losses +-eps0 land exactly on the grid when it divides eps0; otherwise
    pessimistic rounding adds up to one interval per composition. With one distinct coin, shrink
    the interval (by less than half) to divide it."""
    if len(coins) != 1:
        return interval
    (eps0,) = coins
    return eps0 / math.ceil(eps0 / interval - 1e-9) if eps0 >= interval else interval


def _pld_bounded(event, interval: float, coins: frozenset):
    """``(accountant, grid)`` on ``interval``, or on a grid 10 or 100 times coarser when the
    composition would need more than MAX_COMPOSED_POINTS points (a long schedule: 10^8 steps and
    more). Any grid gives a valid (pessimistic) upper bound; the rule depends on the schedule only.

    Raises:
        TooCostly: even the coarsest of these grids is too costly.
    """
    for factor in _PLD_COARSER:
        grid = _snap(min(factor * interval, _PLD_MAX_INTERVAL), coins)
        try:
            return _pld_accountant(event, grid), grid
        except TooCostly:
            if grid >= _PLD_MAX_INTERVAL or factor == _PLD_COARSER[-1]:
                raise
    raise AssertionError("unreachable")


def _pld_run(event, interval: float, delta: float, rdp_tail: float, coins: frozenset, coarsen: float = 1.0):
    """``(accountant, grid)`` for the composed event; refined once on a finer grid if the first pass
    shows that the epsilon is much smaller than the RDP estimate the grid was chosen from (unless
    the first grid was already coarsened for cost)."""
    acc, grid = _pld_bounded(event, interval, coins)
    if grid > _snap(interval, coins):
        return acc, grid
    tail = float(acc.get_epsilon(_TAIL_DELTA))
    finer = coarsen * _interval(float(acc.get_epsilon(delta)), tail if math.isfinite(tail) else rdp_tail)
    if finer * _PLD_REFINE_GAIN <= interval:
        fine = _snap(finer, coins)
        with contextlib.suppress(TooCostly):  # keep the first answer if the finer grid costs too much
            acc, grid = _pld_accountant(event, fine), fine
    return acc, grid


def _coins(items, neighbouring: str) -> frozenset:
    return frozenset(e for s, _ in items for e in pld_coin_epsilons(s, neighbouring=neighbouring))


# ---------------------------------------------------------------- cached core


# PLD results persist across runs (RDP ones cost milliseconds): docs/accounting.md, "Caching".
_DISK = DiskCache("epsilon")


@functools.lru_cache(maxsize=1024)
def _epsilon_cached(items, delta: float, neighbouring: str, accountant: str) -> EpsilonResult:
    if accountant == "rdp" or not items:
        return _epsilon_computed(items, delta, neighbouring, accountant)
    key = {"items": repr(items), "delta": delta, "neighbouring": neighbouring, "accountant": accountant}
    hit = _DISK.get(key)
    if isinstance(hit, dict) and hit.get("accountant") in ("pld", "rdp") and isinstance(hit.get("epsilon"), float):
        grid = hit.get("grid") if hit["accountant"] == "pld" and isinstance(hit.get("grid"), float) else None
        return EpsilonResult(hit["epsilon"], delta, hit["accountant"], grid)
    res = _epsilon_computed(items, delta, neighbouring, accountant)
    _DISK.put(key, {"epsilon": res.epsilon, "accountant": res.accountant, "grid": res.grid})
    return res


def _epsilon_computed(items, delta: float, neighbouring: str, accountant: str, coarsen: float = 1.0) -> EpsilonResult:
    if not items:
        return EpsilonResult(0.0, delta, "rdp" if accountant == "rdp" else "pld")
    curve = sum((c * _step_rdp(s, neighbouring, DEFAULT_ORDERS) for s, c in items), np.zeros(len(DEFAULT_ORDERS)))
    rdp = EpsilonResult(_rdp_epsilon(curve, delta), delta, "rdp")
    if accountant == "rdp":
        return rdp
    rdp_tail = _rdp_epsilon(curve, _TAIL_DELTA)
    interval = _interval(rdp.epsilon, rdp_tail)
    if coarsen != 1.0 and math.isfinite(interval):
        interval = min(coarsen * interval, _PLD_MAX_INTERVAL)
    pld = EpsilonResult(math.inf, delta, "pld")
    # A numerically extreme schedule can make PLD fail: RDP's answer stands then.
    with contextlib.suppress(ArithmeticError, MemoryError):
        if math.isfinite(interval):
            coins = _coins(items, neighbouring)
            acc, grid = _pld_run(_pld_event(items, neighbouring), interval, delta, rdp_tail, coins, coarsen)
            pld = EpsilonResult(float(acc.get_epsilon(delta)), delta, "pld", grid)
    if accountant == "pld" or pld.epsilon <= rdp.epsilon:
        return pld
    return rdp


def _resolve(counts: dict[Step, int], neighbouring: str, accountant: str) -> str:
    """Validate every step for the accountant; ``auto`` becomes ``rdp`` when PLD cannot apply."""
    check_accountant(accountant)
    for step in counts:  # surface ConfigErrors (e.g. Poisson under replace-one) eagerly
        rdp_parts(step, neighbouring=neighbouring)
    if accountant == "rdp":
        return "rdp"
    supported = _pld_supported(tuple(s for s, _ in _canonical(counts)), neighbouring)
    if accountant == "pld" and not supported:
        raise ConfigError(
            "the PLD accountant cannot handle fixed-size sampling without replacement (WithoutReplacement, "
            "or SingleRecord under replace_one) or tree aggregation; use accountant='rdp' or 'auto'"
        )
    return accountant if supported else "rdp"


# ---------------------------------------------------------------- public API


def epsilon_of(counts, *, delta: float, neighbouring: str = ADD_REMOVE, accountant: str = "auto") -> EpsilonResult:
    """Epsilon spent by executing each step ``count`` times (in any order).

    The order and the choice of each step may depend on earlier releases only if the counts
    are fixed in advance (a plan); for a data-dependent number of steps use a
    :class:`~privopt.privacy.RdpFilter` (docs/accounting.md, "Adaptive composition").

    Args:
        counts: ``{Step: count}`` or an iterable of ``(Step, count)`` pairs.
        delta: Target delta in (0, 1).
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``.
        accountant: ``"auto"`` (the smaller of PLD and RDP), ``"pld"`` or ``"rdp"``.

    Returns:
        :class:`EpsilonResult` (``epsilon`` is 0.0 for an empty schedule, ``inf`` if no finite
        epsilon reaches ``delta``). Results are cached.

    Raises:
        ConfigError: invalid delta, neighbouring, accountant, counts, or an unsupported step.

    Example:
        >>> from privopt.privacy import Gaussian, Poisson, Step, epsilon_of
        >>> step = Step(Poisson(0.1), (Gaussian(3.0),))
        >>> round(epsilon_of({step: 512}, delta=1e-6).epsilon, 2)
        3.77
    """
    delta = check_delta(delta)
    check_neighbouring(neighbouring)
    counts = normalize_counts(counts)
    kind = _resolve(counts, neighbouring, accountant)
    return _epsilon_cached(_canonical(counts), delta, neighbouring, kind)


def coarse_epsilon_of(counts, *, delta: float, neighbouring: str, accountant: str, coarsen: float) -> EpsilonResult:
    """:func:`epsilon_of` on a PLD grid ``coarsen`` times coarser (about ``coarsen`` times cheaper):
    an approximation to steer a search, never a guarantee (calibration certifies its answer with
    :func:`epsilon_of`)."""
    counts = normalize_counts(counts)
    kind = _resolve(counts, neighbouring, accountant)
    return _coarse_cached(_canonical(counts), check_delta(delta), neighbouring, kind, float(coarsen))


@functools.lru_cache(maxsize=256)
def _coarse_cached(items, delta: float, neighbouring: str, accountant: str, coarsen: float) -> EpsilonResult:
    return _epsilon_computed(items, delta, neighbouring, accountant, coarsen)


def delta_of(counts, *, epsilon: float, neighbouring: str = ADD_REMOVE, accountant: str = "auto") -> float:
    """Smallest delta such that the executed steps are ``(epsilon, delta)``-DP.

    Args:
        counts: ``{Step: count}`` or an iterable of ``(Step, count)`` pairs.
        epsilon: Finite epsilon > 0.
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``.
        accountant: ``"auto"`` (the smaller of PLD and RDP), ``"pld"`` or ``"rdp"``.

    Example:
        >>> from privopt.privacy import FullBatch, Gaussian, Step, delta_of
        >>> delta_of({Step(FullBatch(), (Gaussian(3.731),)): 1}, epsilon=1.0) < 1.01e-5
        True
    """
    epsilon = check_epsilon(epsilon)
    check_neighbouring(neighbouring)
    counts = normalize_counts(counts)
    kind = _resolve(counts, neighbouring, accountant)
    if not counts:
        return 0.0
    items = _canonical(counts)
    curve = rdp_curve(counts, neighbouring=neighbouring)
    rdp = float(rdp_lib.compute_delta(DEFAULT_ORDERS, curve, epsilon)[0])
    if kind == "rdp":
        return rdp
    interval = _interval(epsilon, _rdp_epsilon(curve, _TAIL_DELTA))
    pld = 1.0
    # A numerically extreme schedule can make PLD fail: RDP's answer stands then.
    with contextlib.suppress(ArithmeticError, MemoryError):
        if math.isfinite(interval):
            acc = _pld_accountant(_pld_event(items, neighbouring), _snap(interval, _coins(items, neighbouring)))
            pld = float(acc.get_delta(epsilon))
    return pld if kind == "pld" else min(pld, rdp)
