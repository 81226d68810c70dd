"""Translate executed :class:`~privopt.privacy.events.Step` counts into an ``(epsilon, delta)`` guarantee.

Two accountants from Google's ``dp_accounting`` are used:

* **PLD** (privacy loss distributions, tight numerical composition) for everything it can express:
  non-subsampled and Poisson-subsampled Gaussian / Laplace releases and pure-DP releases.
* **RDP** (Renyi DP) for fixed-size sampling without replacement (``WithoutReplacement`` and
  ``SingleRecord`` under replace-one), which PLD in dp-accounting 0.6.0 does not support.

``accountant='auto'`` picks PLD unless some step needs RDP.

Conventions (SPEC §8.2). The events returned by :func:`to_dp_event` already carry the
sensitivity of the neighbouring relation (a Gaussian's ``noise_multiplier`` is ``std / Δ``), so they
are composed with dp-accounting's ``ADD_OR_REMOVE_ONE`` semantics, except
``SampledWithoutReplacementDpEvent`` whose RDP bound is stated for ``REPLACE_ONE``. This sidesteps
the 0.6.0 pitfall that PLD's ``REPLACE_ONE`` doubles a plain Gaussian's sensitivity while RDP's does
not. Poisson sampling is only supported under add/remove (that is where dp-accounting's RDP bound
holds), so ``Poisson`` under ``replace_one`` is rejected with a :class:`ConfigError`.

Per-(step, count) privacy-loss objects are cached, so a ledger or a calibration search that
re-evaluates mostly unchanged schedules stays fast even for ~10^5 steps.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from privopt.errors import ConfigError
from privopt.privacy.events import (
    ADD_REMOVE,
    FullBatch,
    Gaussian,
    Laplace,
    Poisson,
    PureDP,
    SingleRecord,
    Step,
    WithoutReplacement,
    check_neighbouring,
    sensitivity_factor,
)

__all__ = [
    "ACCOUNTANTS",
    "EpsilonResult",
    "to_dp_event",
    "epsilon_of",
    "delta_of",
    "normalize_counts",
    "check_delta",
    "check_epsilon",
    "dp_relation_for",
]

ACCOUNTANTS = ("auto", "pld", "rdp")

_ADD = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
_REPLACE = dpa.NeighboringRelation.REPLACE_ONE

# PLD discretisation. The pessimistic rounding error in epsilon grows with the interval, so the
# interval is chosen RELATIVE to the epsilon being computed: a coarse pass estimates epsilon, the
# fine pass uses ~1e-4 * epsilon (quantised to quarter decades so that nearby schedules share the
# same grid and the result is monotone in practice). This reproduces SPEC §8.11-style reference
# values to 4 significant digits while a 512-step run costs ~0.05 s and a 5*10^4-step run ~0.1 s.
_PLD_COARSE_INTERVAL = 1e-2
_PLD_RELATIVE_INTERVAL = 1e-4
_PLD_MIN_INTERVAL = 1e-6
_PLD_MAX_INTERVAL = 1e-3
# Cap on the composed PLD's support (points). Only binds for extreme schedules (e.g. sampling rate
# 5e-6 with z < 1 over 10^5 steps), where it trades a slightly looser -- still valid, pessimistic --
# epsilon for ~1 s instead of ~10 s per evaluation.
_PLD_MAX_POINTS = 300_000


class _NeedsRdp(Exception):
    """Internal: the event cannot be expressed as a PLD in dp-accounting 0.6.0."""


@dataclass(frozen=True)
class EpsilonResult:
    """The privacy guarantee of a set of executed steps.

    Attributes:
        epsilon: Smallest epsilon the accountant certifies at ``delta`` (``inf`` if none).
        delta: The delta it was computed for.
        accountant: ``"pld"`` or ``"rdp"`` -- the accountant actually used.
    """

    epsilon: float
    delta: float
    accountant: str

    def to_dict(self) -> dict:
        return {"epsilon": self.epsilon, "delta": self.delta, "accountant": self.accountant}


# ---------------------------------------------------------------- validation


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_delta(delta, *, name: str = "delta") -> float:
    """Validate ``delta`` in the open interval (0, 1) and return it as a float."""
    if not _is_real(delta) or not (0.0 < float(delta) < 1.0):  # also rejects NaN
        raise ConfigError(f"{name} must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon, *, name: str = "epsilon") -> float:
    """Validate a finite ``epsilon > 0`` and return it as a float."""
    if not _is_real(epsilon) or not (0.0 < float(epsilon) < math.inf):
        raise ConfigError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"unknown accountant {accountant!r}; use one of {ACCOUNTANTS}")
    return accountant


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
        if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < 0:
            raise ConfigError(f"step count must be an integer >= 0, got {count!r} for {step}")
        if count:
            out[step] = out.get(step, 0) + int(count)
    return out


# ---------------------------------------------------------------- Step -> DpEvent


def _pure_event(epsilon: float) -> dpa.DpEvent:
    # Binary randomized response with log-likelihood ratio epsilon is the worst case among all
    # epsilon-DP mechanisms (every epsilon-DP pair is a post-processing of it; Kairouz, Oh &
    # Viswanath 2015), so its PLD/RDP bound any PureDP release. (A LaplaceDpEvent(1/epsilon) would
    # NOT be safe: Laplace's RDP is strictly smaller than randomized response's at small orders.)
    # dp-accounting parametrises RR(k=2) by p with P(true bucket) = 1 - p/2: ratio (2-p)/p = e^eps.
    return dpa.RandomizedResponseDpEvent(noise_parameter=2.0 / (1.0 + math.exp(epsilon)), num_buckets=2)


def _amplified_pure(epsilon: float, rate: float) -> float:
    # Amplification by subsampling for pure DP (Balle, Barthe & Gaboardi 2018): Poisson(q) under
    # add/remove and fixed-size without replacement (rate b/n) under replace-one both give
    # log(1 + q (e^eps - 1)).
    return math.log1p(rate * math.expm1(epsilon))


def _mechanism_epsilon(m, factor: float) -> float:
    """Pure-DP epsilon of a non-Gaussian mechanism (Laplace: L1 sensitivity / scale)."""
    if isinstance(m, Laplace):
        return factor / m.scale_multiplier
    return m.epsilon


def _inner_event(mechanisms, factor: float) -> tuple[dpa.DpEvent, bool]:
    """The (not yet sampled) event of all releases on one batch; also says whether it is all-Gaussian."""
    gauss = [m for m in mechanisms if isinstance(m, Gaussian)]
    others = [m for m in mechanisms if not isinstance(m, Gaussian)]
    events: list[dpa.DpEvent] = []
    if gauss:
        # Releasing Gaussians with multipliers z_j on the same batch IS one Gaussian mechanism on
        # the concatenated vector with block j rescaled by 1/z_j: its sensitivity is
        # sqrt(sum_j (Δ/z_j)^2), i.e. one Gaussian with z_eff = (sum_j z_j^-2)^-1/2. Reducing to
        # it keeps Poisson-subsampled steps inside what the PLD accountant supports.
        z_eff = math.fsum(m.noise_multiplier**-2 for m in gauss) ** -0.5
        events.append(dpa.GaussianDpEvent(z_eff / factor))
    for m in others:
        if isinstance(m, Laplace):
            events.append(dpa.LaplaceDpEvent(m.scale_multiplier / factor))
        elif isinstance(m, PureDP):
            events.append(_pure_event(m.epsilon))
        else:  # pragma: no cover - the Mechanism union is closed
            raise ConfigError(f"unknown mechanism {m!r}")
    inner = events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)
    return inner, not others


def to_dp_event(step: Step, *, neighbouring: str = ADD_REMOVE) -> dpa.DpEvent:
    """Translate one executed step into the ``dp_accounting`` event that describes it.

    Sensitivity is folded into the event (Gaussian: ``z / f``, Laplace: ``scale / f`` with
    ``f = 1`` under add/remove and ``2`` under replace-one), so compose the result with a
    dp-accounting accountant built with ``neighboring_relation=dp_relation_for(event)``.

    Args:
        step: The step (one sampled batch and every release made on it).
        neighbouring: ``"add_remove"`` or ``"replace_one"``.

    Returns:
        A ``dp_accounting.DpEvent``. Pure-DP releases become a binary
        ``RandomizedResponseDpEvent`` (the worst case of all epsilon-DP mechanisms); subsampled
        steps with only Laplace/pure releases become the amplified pure-DP event (except Poisson +
        one Laplace, which PLD handles exactly).

    Raises:
        ConfigError: Poisson sampling under replace-one, Gaussian and non-Gaussian releases mixed
            on one subsampled batch, or an unknown neighbouring relation.

    Example:
        >>> from privopt.privacy import Gaussian, Poisson, Step, to_dp_event
        >>> to_dp_event(Step(Poisson(0.1), (Gaussian(3.0),)), neighbouring="add_remove")
        PoissonSampledDpEvent(sampling_probability=0.1, event=GaussianDpEvent(noise_multiplier=3.0))
    """
    if not isinstance(step, Step):
        raise ConfigError(f"expected a privopt.privacy.Step, got {type(step).__name__}: {step!r}")
    factor = sensitivity_factor(neighbouring)
    s = step.sampling
    inner, all_gaussian = _inner_event(step.mechanisms, factor)
    if isinstance(s, FullBatch) or s.rate == 1.0:
        return inner

    replace = neighbouring != ADD_REMOVE
    if isinstance(s, Poisson) and replace:
        raise ConfigError(
            "Poisson sampling is only supported with neighbouring='add_remove' (dp-accounting's "
            "subsampled-Gaussian RDP bound is for add/remove); use neighbouring='add_remove', or "
            "fixed-size WithoutReplacement batches under 'replace_one'"
        )
    if isinstance(s, WithoutReplacement) and not replace:
        raise ConfigError(
            "WithoutReplacement sampling is only supported with neighbouring='replace_one' "
            "(dp-accounting's without-replacement RDP bound is for replace-one); use Poisson "
            "sampling under 'add_remove' instead"
        )
    # SingleRecord(n) is Poisson(1/n) under add/remove and without-replacement(n, 1) under replace-one.
    fixed_size = isinstance(s, WithoutReplacement) or (isinstance(s, SingleRecord) and replace)
    batch = s.batch_size if isinstance(s, WithoutReplacement) else 1

    if all_gaussian:
        if fixed_size:
            return dpa.SampledWithoutReplacementDpEvent(s.n, batch, inner)
        return dpa.PoissonSampledDpEvent(s.rate, inner)

    if any(isinstance(m, Gaussian) for m in step.mechanisms):
        raise ConfigError(
            "Gaussian and Laplace/pure-DP releases on the same subsampled batch cannot be accounted "
            f"(no dp-accounting event supports it): {step}; account the step as FullBatch "
            "(no amplification, conservative) or release them on separate batches"
        )
    if not fixed_size and len(step.mechanisms) == 1 and isinstance(step.mechanisms[0], Laplace):
        return dpa.PoissonSampledDpEvent(s.rate, inner)  # exact in PLD; RDP amplifies (see below)
    eps0 = math.fsum(_mechanism_epsilon(m, factor) for m in step.mechanisms)
    return _pure_event(_amplified_pure(eps0, s.rate))


def _contains(event: dpa.DpEvent, kind: type) -> bool:
    if isinstance(event, kind):
        return True
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_contains(e, kind) for e in event.events)
    if isinstance(event, (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent, dpa.SampledWithoutReplacementDpEvent)):
        return _contains(event.event, kind)
    return False


def dp_relation_for(event: dpa.DpEvent) -> dpa.NeighboringRelation:
    """dp-accounting relation to compose an event from :func:`to_dp_event` with.

    ``REPLACE_ONE`` for without-replacement sampling or pure-DP (randomized-response) events, whose
    dp-accounting bounds are stated for it; ``ADD_OR_REMOVE_ONE`` otherwise (sensitivity is
    already folded into the noise parameters). An event mixing both cannot be composed by one
    dp-accounting accountant; :func:`epsilon_of` handles that case itself.
    """
    if _contains(event, dpa.SampledWithoutReplacementDpEvent) or _contains(event, dpa.RandomizedResponseDpEvent):
        return _REPLACE
    return _ADD


# ---------------------------------------------------------------- RDP


_ORDERS = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=float)


def _rdp_leaf(event: dpa.DpEvent, relation) -> np.ndarray:
    acc = rdp_lib.RdpAccountant(orders=_ORDERS, neighboring_relation=relation)
    if not acc.supports(event):  # pragma: no cover - guarded by _rdp_of
        raise ConfigError(f"RDP accountant cannot handle {event}")
    acc.compose(event)
    return np.asarray(acc.rdp, dtype=float)


def _rdp_of(event: dpa.DpEvent) -> np.ndarray:
    """RDP curve (at :data:`_ORDERS`) of one event, count 1."""
    if isinstance(event, dpa.ComposedDpEvent):
        return sum((_rdp_of(e) for e in event.events), np.zeros_like(_ORDERS))
    if isinstance(event, dpa.SelfComposedDpEvent):
        return event.count * _rdp_of(event.event)
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        return _rdp_leaf(event, _REPLACE)
    if isinstance(event, dpa.SampledWithoutReplacementDpEvent):
        return _rdp_leaf(event, _REPLACE)
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.LaplaceDpEvent):
        # RDP has no subsampled-Laplace bound; use the Laplace's pure-DP guarantee, amplified.
        eps0 = 1.0 / event.event.noise_multiplier
        return _rdp_leaf(_pure_event(_amplified_pure(eps0, event.sampling_probability)), _REPLACE)
    if isinstance(event, (dpa.GaussianDpEvent, dpa.LaplaceDpEvent, dpa.PoissonSampledDpEvent)):
        return _rdp_leaf(event, _ADD)
    raise ConfigError(f"the RDP accountant cannot handle {event}")  # pragma: no cover


@functools.lru_cache(maxsize=4096)
def _step_rdp(step: Step, neighbouring: str) -> np.ndarray:
    curve = _rdp_of(to_dp_event(step, neighbouring=neighbouring))
    curve.setflags(write=False)
    return curve


def _rdp_total(counts: dict[Step, int], neighbouring: str) -> np.ndarray:
    total = np.zeros_like(_ORDERS)
    for step, count in counts.items():
        total = total + count * _step_rdp(step, neighbouring)  # RDP adds up under composition
    return total


# ---------------------------------------------------------------- PLD


def _pld_of(event: dpa.DpEvent, count: int, interval: float):
    """PLD of ``event`` composed ``count`` times (all on the same discretisation grid)."""
    if isinstance(event, dpa.ComposedDpEvent):
        parts = [_pld_of(e, count, interval) for e in event.events]
        out = parts[0]
        for p in parts[1:]:
            out = out.compose(p)
        return out
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _pld_of(event.event, count * event.count, interval)
    if isinstance(event, dpa.GaussianDpEvent):
        # k non-subsampled Gaussians = one Gaussian with std z / sqrt(k): exact and cheap.
        return pld_lib.from_gaussian_mechanism(
            event.noise_multiplier / math.sqrt(count), value_discretization_interval=interval
        )
    if isinstance(event, dpa.LaplaceDpEvent):
        base = pld_lib.from_laplace_mechanism(event.noise_multiplier, value_discretization_interval=interval)
    elif isinstance(event, dpa.RandomizedResponseDpEvent):
        base = pld_lib.from_randomized_response(
            event.noise_parameter,
            event.num_buckets,
            value_discretization_interval=interval,
            neighboring_relation=_REPLACE,
        )
    elif isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        base = pld_lib.from_gaussian_mechanism(
            event.event.noise_multiplier,
            value_discretization_interval=interval,
            sampling_prob=event.sampling_probability,
        )
    elif isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.LaplaceDpEvent):
        base = pld_lib.from_laplace_mechanism(
            event.event.noise_multiplier,
            value_discretization_interval=interval,
            sampling_prob=event.sampling_probability,
        )
    else:
        raise _NeedsRdp(event)
    return base.self_compose(count) if count > 1 else base


@functools.lru_cache(maxsize=256)
def _step_base_pld(step: Step, neighbouring: str, interval: float):
    # Building a subsampled mechanism's PLD on a fine grid is the expensive part (~0.1-0.5 s);
    # a ledger re-evaluating growing counts reuses it and only redoes the (FFT) self-composition.
    return _pld_of(to_dp_event(step, neighbouring=neighbouring), 1, interval)


@functools.lru_cache(maxsize=1024)
def _step_pld(step: Step, neighbouring: str, count: int, interval: float):
    event = to_dp_event(step, neighbouring=neighbouring)
    if isinstance(event, dpa.GaussianDpEvent):
        return _pld_of(event, count, interval)  # closed form in the count, no composition needed
    base = _step_base_pld(step, neighbouring, interval)
    return base.self_compose(count) if count > 1 else base


def _pld_total(counts: dict[Step, int], neighbouring: str, interval: float):
    out = None
    for step, count in counts.items():
        p = _step_pld(step, neighbouring, count, interval)
        out = p if out is None else out.compose(p)
    return out


def _quantise(x: float, up: bool) -> float:
    # Quarter-decade grid, so nearby schedules share a grid and results are monotone in practice.
    k = 4.0 * math.log10(x)
    return 10.0 ** ((math.ceil(k) if up else math.floor(k)) / 4.0)


def _pmf_points(pld) -> int:
    # Support size of a PLD (dp-accounting keeps the two adjacency directions as separate pmfs).
    pmfs = {id(p): p for p in (getattr(pld, "_pmf_remove", None), getattr(pld, "_pmf_add", None)) if p is not None}
    return sum(int(getattr(p, "size", 0)) for p in pmfs.values())


def _fine_interval(epsilon_estimate: float, coarse_points: int = 0, relative: float = _PLD_RELATIVE_INTERVAL) -> float:
    """Discretisation for the accurate pass: ``relative * epsilon``, but never so fine that the
    composed PLD would exceed ~_PLD_MAX_POINTS points (cost grows linearly with them)."""
    if not math.isfinite(epsilon_estimate):
        return _PLD_MAX_INTERVAL
    interval = _quantise(max(epsilon_estimate, 1e-12) * relative, up=False)
    if coarse_points:
        interval = max(interval, _quantise(_PLD_COARSE_INTERVAL * coarse_points / _PLD_MAX_POINTS, up=True))
    return min(_PLD_MAX_INTERVAL, max(_PLD_MIN_INTERVAL, interval))


def _pld_supported(counts: dict[Step, int], neighbouring: str) -> bool:
    try:
        for step in counts:
            _pld_of(to_dp_event(step, neighbouring=neighbouring), 1, _PLD_COARSE_INTERVAL)
    except _NeedsRdp:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _pld_support_cached(steps: frozenset, neighbouring: str) -> bool:
    return _pld_supported(dict.fromkeys(steps, 1), neighbouring)


def _resolve(counts: dict[Step, int], neighbouring: str, accountant: str) -> str:
    accountant = _check_accountant(accountant)
    if accountant == "rdp":
        for step in counts:  # surface ConfigErrors (e.g. Poisson under replace-one) eagerly
            to_dp_event(step, neighbouring=neighbouring)
        return "rdp"
    supported = _pld_support_cached(frozenset(counts), neighbouring)
    if accountant == "pld" and not supported:
        raise ConfigError(
            "the PLD accountant cannot handle fixed-size sampling without replacement "
            "(WithoutReplacement, or SingleRecord under replace_one); use accountant='rdp' or 'auto'"
        )
    return "pld" if supported else "rdp"


# ---------------------------------------------------------------- public API


def epsilon_of(
    counts,
    *,
    delta: float,
    neighbouring: str = ADD_REMOVE,
    accountant: str = "auto",
) -> EpsilonResult:
    """Epsilon spent by executing each step ``count`` times (adaptively, in any order).

    Args:
        counts: ``{Step: count}`` or an iterable of ``(Step, count)`` pairs.
        delta: Target delta in (0, 1).
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``.
        accountant: ``"auto"`` (PLD unless a step needs RDP), ``"pld"`` or ``"rdp"``.

    Returns:
        :class:`EpsilonResult` (``epsilon`` is 0.0 for an empty schedule, ``inf`` if no finite
        epsilon reaches ``delta``).

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
    return _epsilon(counts, delta, neighbouring, kind, _PLD_RELATIVE_INTERVAL)


def _epsilon(counts: dict[Step, int], delta: float, neighbouring: str, kind: str, relative: float) -> EpsilonResult:
    """epsilon_of on validated input; ``relative`` sets the PLD precision (calibration searches
    coarsely first with a larger one)."""
    if not counts:
        return EpsilonResult(0.0, delta, kind)
    if kind == "rdp":
        eps, _ = rdp_lib.compute_epsilon(_ORDERS, _rdp_total(counts, neighbouring), delta)
        return EpsilonResult(float(eps), delta, "rdp")
    coarse_pld = _pld_total(counts, neighbouring, _PLD_COARSE_INTERVAL)
    coarse = coarse_pld.get_epsilon_for_delta(delta)
    interval = _fine_interval(coarse, _pmf_points(coarse_pld), relative)
    if interval >= _PLD_COARSE_INTERVAL:
        return EpsilonResult(float(coarse), delta, "pld")
    fine = _pld_total(counts, neighbouring, interval).get_epsilon_for_delta(delta)
    return EpsilonResult(float(fine), delta, "pld")


def delta_of(
    counts,
    *,
    epsilon: float,
    neighbouring: str = ADD_REMOVE,
    accountant: str = "auto",
) -> float:
    """Smallest delta such that the executed steps are ``(epsilon, delta)``-DP.

    Args:
        counts: ``{Step: count}`` or an iterable of ``(Step, count)`` pairs.
        epsilon: Finite epsilon > 0.
        neighbouring: ``"add_remove"`` (default) or ``"replace_one"``.
        accountant: ``"auto"``, ``"pld"`` or ``"rdp"``.

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
    if kind == "rdp":
        d, _ = rdp_lib.compute_delta(_ORDERS, _rdp_total(counts, neighbouring), epsilon)
        return float(d)
    pld = _pld_total(counts, neighbouring, _fine_interval(epsilon))
    return float(pld.get_delta_for_epsilon(epsilon))
