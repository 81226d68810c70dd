"""PLD composition of privopt's events, bit for bit ``PLDAccountant.compose``, in bounded time.

``PLDAccountant`` builds one privacy-loss distribution per leaf event and self-composes it ``count``
times. This module makes the same public dp_accounting calls, in the same order, with two changes
that leave every number unchanged (docs/accounting.md, "PLD or RDP"):

* each Poisson-subsampled Gaussian's distribution is cached per (noise, rate, grid): a run asks for
  the epsilon of a new count at every evaluation, and building it is the costly part;
* a distribution small enough to be stored sparsely (at most 1000 points) is converted to its dense
  form before a self-composition that dp_accounting would itself do densely. dp-accounting (up to
  0.6.0 at least) decides this by computing ``size ** count`` as an exact Python integer: at 10^7
  steps of a 977-point distribution that integer has 3·10^7 digits and took 45 s per call, the
  whole cost of the 47-90 s evaluations measured at 10^7 DP-SGD steps. The dense composition that
  follows is the same either way.

And one change that can: a self-composition whose output grid (dp_accounting's own Chernoff
truncation bounds, computed before the FFT) exceeds ``MAX_COMPOSED_POINTS`` raises
:class:`TooCostly`; the accountant then retries on a coarser grid (still a valid upper bound).
"""

from __future__ import annotations

import functools
import math

import dp_accounting as dpa
from dp_accounting.pld import common, pld_pmf

from privopt.privacy.translate import ADD

__all__ = ["MAX_COMPOSED_POINTS", "FastPLD", "TooCostly", "fast_pld", "self_compose", "subsampled_gaussian_pld"]

_PLD = dpa.pld.privacy_loss_distribution
# dp_accounting's threshold (pld_pmf._MAX_PMF_SPARSE_SIZE) between sparse and dense compositions.
_SPARSE_MAX = getattr(pld_pmf, "_MAX_PMF_SPARSE_SIZE", 1000)
# A one-point sparse distribution is self-composed by a Python loop of `count` compositions.
_SINGLE_POINT_LOOP_MAX = 10_000
# A dense self-composition costs an FFT over its output grid (about 2 CPU seconds at 2*10^6
# points, 24 s at 2*10^7 for 10^9 steps): above this many points the grid is coarsened instead.
MAX_COMPOSED_POINTS = 2_000_000
_TAIL_MASS = 1e-15  # PrivacyLossDistribution.self_compose's default truncation


class TooCostly(ArithmeticError):
    """A self-composition would exceed its point budget (raised before any FFT is computed)."""


def _goes_dense(pmf, count: int) -> bool:
    """Whether dp_accounting's ``SparsePLDPmf.self_compose(count)`` converts to dense, i.e.
    ``size ** count > _SPARSE_MAX``, decided without computing that integer."""
    if not isinstance(pmf, pld_pmf.SparsePLDPmf) or count <= 1:
        return False
    size = pmf.size
    if size == 1:
        return count > _SINGLE_POINT_LOOP_MAX
    return count > _SPARSE_MAX.bit_length() or size**count > _SPARSE_MAX


def _composed_points(pmf, count: int) -> int:
    """Grid points of ``pmf.self_compose(count)``, by dp_accounting's own truncation bounds."""
    if count <= 1 or (isinstance(pmf, pld_pmf.SparsePLDPmf) and not _goes_dense(pmf, count)):
        return 0  # at most _SPARSE_MAX points (or a one-point loop), no FFT
    dense = pmf.to_dense_pmf() if isinstance(pmf, pld_pmf.SparsePLDPmf) else pmf
    probs = getattr(dense, "_probs", None)
    if probs is None:
        return 0
    low, high = common.compute_self_convolve_bounds(probs, count, _TAIL_MASS)
    return high - low + 1


def self_compose(pld, count: int, *, max_points: int | None = None):
    """``pld.self_compose(count)``; a sparse distribution that dp_accounting would compose densely
    is converted first (the same conversion it makes, without its ``size ** count`` integer).

    Raises:
        TooCostly: the composed distribution would have more than ``max_points`` points.
    """
    remove, add = getattr(pld, "_pmf_remove", None), getattr(pld, "_pmf_add", None)
    if remove is None or add is None:
        return pld.self_compose(count)
    if max_points is not None:
        points = max(_composed_points(remove, count), _composed_points(add, count))
        if points > max_points:
            raise TooCostly(f"{points} grid points after {count} compositions (budget {max_points})")
    if not (_goes_dense(remove, count) or _goes_dense(add, count)):
        return pld.self_compose(count)
    dense_remove = remove.to_dense_pmf() if _goes_dense(remove, count) else remove
    if getattr(pld, "_symmetric", False):
        return _PLD.PrivacyLossDistribution(dense_remove).self_compose(count)
    dense_add = add.to_dense_pmf() if _goes_dense(add, count) else add
    return _PLD.PrivacyLossDistribution(dense_remove, dense_add).self_compose(count)


@functools.lru_cache(maxsize=256)
def subsampled_gaussian_pld(noise_multiplier: float, rate: float, interval: float):
    # The costly part of a PLD evaluation; the same step is evaluated again at every evaluation of
    # a run with a new count, on the same quantised grid.
    return _PLD.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        value_discretization_interval=interval,
        sampling_prob=rate,
        neighboring_relation=ADD,
    )


def _leaves(event: dpa.DpEvent, count: int, out: list) -> bool:
    """Flatten ``event`` into ``(leaf, count)`` pairs in the order PLDAccountant composes them;
    False if a leaf is of a kind (or a degenerate parameter) this module leaves to PLDAccountant."""
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _leaves(event.event, event.count * count, out)
    if isinstance(event, dpa.ComposedDpEvent):
        return all(_leaves(e, count, out) for e in event.events)
    if isinstance(event, dpa.PoissonSampledDpEvent):
        inner = event.event
        ok = isinstance(inner, (dpa.GaussianDpEvent, dpa.LaplaceDpEvent)) and event.sampling_probability > 0
        ok = ok and inner.noise_multiplier > 0
    elif isinstance(event, (dpa.GaussianDpEvent, dpa.LaplaceDpEvent)):
        ok = event.noise_multiplier > 0
    elif isinstance(event, dpa.dp_event.DiscreteLaplaceDpEvent):
        ok = event.noise_parameter > 0
    else:
        ok = False
    if ok:
        out.append((event, count))
    return ok


def _leaf_pld(event: dpa.DpEvent, count: int, interval: float, max_points: int | None):
    """The composed distribution of ``count`` runs of one leaf, by PLDAccountant's own calls."""
    if isinstance(event, dpa.GaussianDpEvent):
        return _PLD.from_gaussian_mechanism(
            standard_deviation=event.noise_multiplier / math.sqrt(count),
            value_discretization_interval=interval,
            neighboring_relation=ADD,
        )
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        pld = subsampled_gaussian_pld(event.event.noise_multiplier, event.sampling_probability, interval)
    elif isinstance(event, dpa.PoissonSampledDpEvent):
        pld = _PLD.from_laplace_mechanism(
            parameter=event.event.noise_multiplier,
            value_discretization_interval=interval,
            sampling_prob=event.sampling_probability,
        )
    elif isinstance(event, dpa.LaplaceDpEvent):
        pld = _PLD.from_laplace_mechanism(parameter=event.noise_multiplier, value_discretization_interval=interval)
    else:
        pld = _PLD.from_discrete_laplace_mechanism(
            parameter=event.noise_parameter, sensitivity=event.sensitivity, value_discretization_interval=interval
        )
    return self_compose(pld, count, max_points=max_points)


class FastPLD:
    """The PLD that ``PLDAccountant(ADD, interval).compose(event)`` builds, with its
    ``get_epsilon`` / ``get_delta``: the same numbers, built as the module docstring says.

    Raises:
        TooCostly: a leaf's self-composition would exceed ``max_points`` grid points (default
            ``MAX_COMPOSED_POINTS``, read at each call).
    """

    def __init__(self, leaves: list, interval: float, *, max_points: int | None = None):
        max_points = MAX_COMPOSED_POINTS if max_points is None else max_points
        pld = _PLD.identity(value_discretization_interval=interval)
        for event, count in leaves:
            pld = pld.compose(_leaf_pld(event, count, interval, max_points))
        self._pld = pld

    def get_epsilon(self, delta: float) -> float:
        return self._pld.get_epsilon_for_delta(delta)

    def get_delta(self, epsilon: float) -> float:
        return self._pld.get_delta_for_epsilon(epsilon)


def fast_pld(event: dpa.DpEvent, interval: float, *, max_points: int | None = None):
    """A :class:`FastPLD` for ``event``, or dp_accounting's ``PLDAccountant`` for events it does not
    handle (both answer ``get_epsilon`` and ``get_delta``).

    Raises:
        TooCostly: see :class:`FastPLD`.
    """
    leaves: list = []
    if _leaves(event, 1, leaves):
        return FastPLD(leaves, interval, max_points=max_points)
    acc = dpa.pld.PLDAccountant(neighboring_relation=ADD, value_discretization_interval=interval)
    acc.compose(event)
    return acc
