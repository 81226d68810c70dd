"""Translate a :class:`~privopt.privacy.events.Step` into ``dp_accounting`` events.

The sensitivity of the run's neighbouring relation is folded into the events (a Gaussian's
``noise_multiplier`` becomes ``std / Δ`` with ``Δ = C`` under add/remove and ``2C`` under
replace-one), so each event is then composed under the dp_accounting relation its bound is stated
for, whatever the run's relation is. Each accountant gets the form it handles exactly:

* :func:`to_dp_event` -- the canonical description (what a reader of the run should see);
* :func:`rdp_parts` -- ``(event, relation)`` pairs for dp_accounting's ``RdpAccountant``;
* :func:`pld_event` -- one event for ``PLDAccountant`` under add/remove, or ``None`` when PLD cannot
  express the step (fixed-size sampling without replacement, tree aggregation).

Pure-DP releases are modelled by the worst case of all ε-DP mechanisms, binary randomized response
(Kairouz, Oh & Viswanath 2015): ``RandomizedResponseDpEvent`` for RDP, and for PLD the discrete
Laplace mechanism with sensitivity 1, whose privacy loss is exactly the same ±ε coin. See
docs/accounting.md, "Events and neighbouring relations".
"""

from __future__ import annotations

import math

import dp_accounting as dpa

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
    TreeAggregation,
    WithoutReplacement,
    sensitivity_factor,
)

__all__ = [
    "ADD",
    "REPLACE",
    "ZERO_OUT",
    "to_dp_event",
    "dp_relation_for",
    "rdp_parts",
    "pld_event",
    "pld_coin_epsilons",
]

ADD = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dpa.NeighboringRelation.REPLACE_ONE
# Tree aggregation's bound is stated for replacing one record's contribution by zero.
ZERO_OUT = dpa.NeighboringRelation.REPLACE_SPECIAL


def _rr_event(epsilon: float) -> dpa.DpEvent:
    # Binary randomized response with log-likelihood ratio epsilon: P(true bucket) = 1 - p/2 and
    # (2 - p) / p = e^eps. (LaplaceDpEvent(1/eps) would NOT be safe: Laplace's RDP is strictly
    # smaller than randomized response's at small orders.)
    # 2 / (1 + e^eps) written with e^-eps: no overflow for huge eps (a calibration search may probe
    # them); beyond eps ~ 745 it is 0, which dp_accounting charges as infinite epsilon.
    return dpa.RandomizedResponseDpEvent(
        noise_parameter=2.0 * math.exp(-epsilon) / (1.0 + math.exp(-epsilon)), num_buckets=2
    )


def _coin_event(epsilon: float) -> dpa.DpEvent:
    # Discrete Laplace with parameter eps and sensitivity 1 has privacy loss +eps with probability
    # e^eps / (1 + e^eps) and -eps otherwise: the randomized-response coin, under add/remove, with
    # a count that dp_accounting's PLDAccountant composes exactly (it ignores the count of a
    # self-composed RandomizedResponseDpEvent, at least up to 0.6.0).
    return dpa.dp_event.DiscreteLaplaceDpEvent(noise_parameter=epsilon, sensitivity=1)


def _amplified_pure(epsilon: float, rate: float) -> float:
    # Amplification by subsampling for pure DP (Balle, Barthe & Gaboardi 2018): Poisson(q) under
    # add/remove and fixed-size without replacement (rate b/n) under replace-one both give
    # log(1 + q (e^eps - 1)).
    return math.log1p(rate * math.expm1(epsilon))


def _pure_epsilon(m, factor: float) -> float:
    """Pure-DP epsilon of a Laplace (L1 sensitivity / scale) or PureDP release."""
    return factor / m.scale_multiplier if isinstance(m, Laplace) else m.epsilon


class _Shape:
    """One step, decomposed: the effective Gaussian, the other releases and the sampling."""

    def __init__(self, step: Step, neighbouring: str):
        if not isinstance(step, Step):
            raise ConfigError(f"expected a privopt.privacy.Step, got {type(step).__name__}: {step!r}")
        self.factor = sensitivity_factor(neighbouring)
        self.replace = neighbouring != ADD_REMOVE
        gauss = [m for m in step.mechanisms if isinstance(m, Gaussian)]
        # Gaussians with multipliers z_j on one batch ARE one Gaussian mechanism on the concatenated
        # vector (block j rescaled by 1/z_j), of multiplier z_eff = (sum_j z_j^-2)^-1/2.
        self.z = math.fsum(m.noise_multiplier**-2 for m in gauss) ** -0.5 / self.factor if gauss else None
        self.trees = [m for m in step.mechanisms if isinstance(m, TreeAggregation)]
        self.others = [m for m in step.mechanisms if isinstance(m, (Laplace, PureDP))]
        s = step.sampling
        self.full = isinstance(s, FullBatch) or s.rate == 1.0
        self.rate = s.rate
        self._check_sampling(step)
        # SingleRecord(n) is Poisson(1/n) under add/remove and without-replacement(n, 1) under replace-one.
        self.fixed_size = isinstance(s, WithoutReplacement) or (isinstance(s, SingleRecord) and self.replace)
        self.n = getattr(s, "n", None)
        self.batch = s.batch_size if isinstance(s, WithoutReplacement) else 1

    def _check_sampling(self, step: Step) -> None:
        s = step.sampling
        if self.full:
            return
        if isinstance(s, Poisson) and self.replace:
            raise ConfigError(
                "Poisson sampling is only supported with neighbouring='add_remove' (dp-accounting's "
                "subsampled-Gaussian RDP bound is for add/remove); use neighbouring='add_remove', or "
                "fixed-size WithoutReplacement batches under 'replace_one'"
            )
        if isinstance(s, WithoutReplacement) and not self.replace:
            raise ConfigError(
                "WithoutReplacement sampling is only supported with neighbouring='replace_one' "
                "(dp-accounting's without-replacement RDP bound is for replace-one); use Poisson "
                "sampling under 'add_remove' instead"
            )
        if self.z is not None and self.others:
            raise ConfigError(
                "Gaussian and Laplace/pure-DP releases on the same subsampled batch cannot be accounted "
                f"(no dp-accounting event supports it): {step}; account the step as FullBatch "
                "(no amplification, conservative) or release them on separate batches"
            )

    def sampled_laplace(self) -> bool:
        """A single Laplace release on a Poisson batch: exact in PLD."""
        return not self.full and not self.fixed_size and len(self.others) == 1 and isinstance(self.others[0], Laplace)

    def sampled_laplace_event(self) -> dpa.DpEvent:
        return dpa.PoissonSampledDpEvent(self.rate, dpa.LaplaceDpEvent(self.others[0].scale_multiplier / self.factor))

    def pure_epsilon(self) -> float:
        """The (amplified) pure-DP epsilon of all non-Gaussian releases of a subsampled step."""
        eps0 = math.fsum(_pure_epsilon(m, self.factor) for m in self.others)
        return eps0 if self.full else _amplified_pure(eps0, self.rate)

    def sampled(self, inner: dpa.DpEvent) -> dpa.DpEvent:
        if self.full:
            return inner
        if self.fixed_size:
            return dpa.SampledWithoutReplacementDpEvent(self.n, self.batch, inner)
        return dpa.PoissonSampledDpEvent(self.rate, inner)

    def tree_events(self) -> list[dpa.DpEvent]:
        return [
            dpa.SingleEpochTreeAggregationDpEvent(t.noise_multiplier / self.factor, list(t.steps)) for t in self.trees
        ]


def _composed(events: list[dpa.DpEvent]) -> dpa.DpEvent:
    return events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)


def to_dp_event(step: Step, *, neighbouring: str = ADD_REMOVE) -> dpa.DpEvent:
    """The ``dp_accounting`` event that describes one executed step.

    Sensitivity is folded into the event (Gaussian: ``z / f``, Laplace: ``scale / f`` with
    ``f = 1`` under add/remove and ``2`` under replace-one); compose it under
    ``dp_relation_for(event)``.

    Args:
        step: The step (one sampled batch and every release made on it).
        neighbouring: ``"add_remove"`` or ``"replace_one"``.

    Returns:
        A ``dp_accounting.DpEvent``. Pure-DP releases become a binary
        ``RandomizedResponseDpEvent`` (the worst case of all epsilon-DP mechanisms); subsampled
        steps with only Laplace/pure releases become the amplified pure-DP event (except Poisson +
        one Laplace, which stays a ``PoissonSampledDpEvent``).

    Raises:
        ConfigError: Poisson sampling under replace-one, Gaussian and non-Gaussian releases mixed
            on one subsampled batch, or an unknown neighbouring relation.

    Example:
        >>> from privopt.privacy import Gaussian, Poisson, Step, to_dp_event
        >>> to_dp_event(Step(Poisson(0.1), (Gaussian(3.0),)), neighbouring="add_remove")
        PoissonSampledDpEvent(sampling_probability=0.1, event=GaussianDpEvent(noise_multiplier=3.0))
    """
    shape = _Shape(step, neighbouring)
    if shape.sampled_laplace():
        return shape.sampled_laplace_event()
    events = [dpa.GaussianDpEvent(shape.z)] if shape.z is not None else []
    if shape.full:
        for m in shape.others:
            if isinstance(m, Laplace):
                events.append(dpa.LaplaceDpEvent(m.scale_multiplier / shape.factor))
            else:
                events.append(_rr_event(m.epsilon))
        return _composed(events + shape.tree_events())
    if shape.z is not None:
        return shape.sampled(events[0])
    return _rr_event(shape.pure_epsilon())


def _contains(event: dpa.DpEvent, kind: type) -> bool:
    if isinstance(event, kind):
        return True
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_contains(e, kind) for e in event.events)
    return isinstance(event, (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent)) and _contains(event.event, kind)


def dp_relation_for(event: dpa.DpEvent) -> dpa.NeighboringRelation:
    """dp_accounting relation under which to compose an event from :func:`to_dp_event`.

    ``REPLACE_ONE`` for without-replacement sampling and randomized response (their bounds are
    stated for it), ``REPLACE_SPECIAL`` for tree aggregation, ``ADD_OR_REMOVE_ONE`` otherwise
    (sensitivity is already folded into the noise parameters). An event that mixes them cannot
    be composed by one dp_accounting accountant; :func:`rdp_parts` splits it.
    """
    if _contains(event, dpa.SampledWithoutReplacementDpEvent) or _contains(event, dpa.RandomizedResponseDpEvent):
        return REPLACE
    if _contains(event, dpa.SingleEpochTreeAggregationDpEvent):
        return ZERO_OUT
    return ADD


def rdp_parts(step: Step, *, neighbouring: str = ADD_REMOVE) -> tuple[tuple[dpa.DpEvent, object], ...]:
    """The step as ``(event, relation)`` pairs whose RDP curves add up to the step's RDP.

    RDP has no bound for a subsampled Laplace, so a Laplace on a Poisson batch is charged as its
    amplified pure-DP guarantee (randomized response).
    """
    shape = _Shape(step, neighbouring)
    parts: list[tuple[dpa.DpEvent, object]] = []
    if shape.z is not None:
        event = shape.sampled(dpa.GaussianDpEvent(shape.z))
        parts.append((event, REPLACE if shape.fixed_size and not shape.full else ADD))
    if shape.full:
        for m in shape.others:
            if isinstance(m, Laplace):
                parts.append((dpa.LaplaceDpEvent(m.scale_multiplier / shape.factor), ADD))
            else:
                parts.append((_rr_event(m.epsilon), REPLACE))
        parts.extend((e, ZERO_OUT) for e in shape.tree_events())
    elif shape.others:
        parts.append((_rr_event(shape.pure_epsilon()), REPLACE))
    return tuple(parts)


def _coin_epsilons(shape: _Shape) -> list[float]:
    if shape.full:
        return [m.epsilon for m in shape.others if isinstance(m, PureDP)]
    return [] if shape.sampled_laplace() or not shape.others else [shape.pure_epsilon()]


def pld_coin_epsilons(step: Step, *, neighbouring: str = ADD_REMOVE) -> tuple[float, ...]:
    """Privacy losses of the pure-DP coins in :func:`pld_event` (a PLD grid dividing them is exact)."""
    return tuple(_coin_epsilons(_Shape(step, neighbouring)))


def pld_event(step: Step, *, neighbouring: str = ADD_REMOVE) -> dpa.DpEvent | None:
    """The step as one event for ``PLDAccountant`` under add/remove, or ``None`` if PLD cannot
    express it (fixed-size sampling without replacement, tree aggregation)."""
    shape = _Shape(step, neighbouring)
    if shape.trees or (shape.fixed_size and not shape.full):
        return None
    if shape.sampled_laplace():
        return shape.sampled_laplace_event()
    events = [shape.sampled(dpa.GaussianDpEvent(shape.z))] if shape.z is not None else []
    if shape.full:
        events += [
            dpa.LaplaceDpEvent(m.scale_multiplier / shape.factor) for m in shape.others if isinstance(m, Laplace)
        ]
    events += [_coin_event(eps) for eps in _coin_epsilons(shape)]
    return _composed(events)
