"""Noisy releases of bounded sums, each tied to its accounting event.

:class:`PrivateBatch` is the only way algorithms add privacy noise. It is opened for ONE sampled
batch with the mechanisms that batch will release; opening it records the step in the ledger
(the budget guard may refuse it, before any noise is drawn or anything released), and each
declared mechanism can then be used exactly once. The noise is scaled by the per-record bound
the released sum carries (:class:`~privopt.grads.sums.BoundedSum`, or an engine ``ClippedSum``):
the caller never restates the sensitivity.

Hooks for empirical privacy audits:

* :func:`observe_releases` registers a callback that receives every release
  (:class:`ReleaseEvent`: name, released noisy tensor, noise std, per-record bound, sampling)
  while the context is open — for white-box audits that score the released gradients.
* :func:`insecure_scale_noise_for_testing` multiplies every drawn privacy noise by a factor
  (e.g. 0.1) to simulate a broken mechanism that an audit must catch. It exists for tests of the
  audit only: no config key or CLI option reaches it, it warns, and a run made under it is not
  private.

Example:
    >>> import torch
    >>> from privopt.grads.sums import BoundedSum
    >>> from privopt.privacy import PrivacyLedger, Poisson
    >>> from privopt.rng import TorchSource
    >>> ledger = PrivacyLedger(delta=1e-5)
    >>> batch = PrivateBatch(ledger, Poisson(0.01), {"grad": 1.1}, rng=TorchSource(seed=0))
    >>> seen = []
    >>> with observe_releases(seen.append):
    ...     noisy_mean = batch.gaussian("grad", BoundedSum(torch.ones(3), bound=1.0), normalizer=100.0)
    >>> ledger.num_steps, seen[0].name, seen[0].noise_std
    (1, 'grad', 1.1)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from privopt.errors import ConfigError, PrivoptRuntimeWarning
from privopt.grads.sums import as_bounded
from privopt.privacy.events import Gaussian, Sampling, Step
from privopt.rng import RandomSource, as_source

__all__ = [
    "PrivateBatch",
    "ReleaseEvent",
    "gaussian_noise_like",
    "draw_gaussian_noise",
    "draw_laplace_noise",
    "observe_releases",
    "notify_release",
    "releases_observed",
    "insecure_scale_noise_for_testing",
]


@dataclass(frozen=True)
class ReleaseEvent:
    """One noisy release, as seen by a release observer.

    Attributes:
        name: the release family (e.g. ``"grad"``, ``"x-diff"``).
        value: the released tensor (noisy sum divided by ``normalizer``; a copy).
        noise_std: std of the Gaussian noise added to the SUM (0 for a non-private batch).
        bound: per-record L2 bound of the sum (its add/remove-one sensitivity).
        sampling: how the batch was drawn (``Poisson(rate)``, ``FullBatch()``, ...).
        normalizer: what the noisy sum was divided by.
    """

    name: str
    value: torch.Tensor
    noise_std: float
    bound: float
    sampling: Sampling
    normalizer: float


_OBSERVERS: contextvars.ContextVar[tuple[Callable[[ReleaseEvent], None], ...]] = contextvars.ContextVar(
    "privopt_release_observers", default=()
)
_NOISE_SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("privopt_insecure_noise_scale", default=1.0)


@contextlib.contextmanager
def observe_releases(callback: Callable[[ReleaseEvent], None]) -> Iterator[None]:
    """Call ``callback(event)`` for every release made while the context is open (nestable)."""
    if not callable(callback):
        raise ConfigError(f"release observer must be callable, got {callback!r}")
    token = _OBSERVERS.set(_OBSERVERS.get() + (callback,))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


def notify_release(event: ReleaseEvent) -> None:
    """Hand ``event`` to the registered observers (used by releases made outside PrivateBatch)."""
    for cb in _OBSERVERS.get():
        cb(event)


def releases_observed() -> bool:
    """Whether a release observer is registered (a caller that releases in bulk skips building
    events nobody reads)."""
    return bool(_OBSERVERS.get())


@contextlib.contextmanager
def insecure_scale_noise_for_testing(factor: float) -> Iterator[None]:
    """TEST-ONLY: multiply every privacy noise drawn inside the context by ``factor``.

    Simulates a broken mechanism (e.g. ``factor=0.1``) so an empirical privacy audit can be shown
    to catch it. Nothing in configs or the command line reaches this function; the ledger still
    reports the epsilon of the intended noise, which is exactly the lie an audit must detect.
    """
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 0):
        raise ConfigError(f"noise scale must be a finite number >= 0, got {factor!r}")
    warnings.warn(
        f"privacy noise scaled by {factor:g} for testing: releases made now are NOT private", PrivoptRuntimeWarning, 2
    )
    token = _NOISE_SCALE.set(float(factor))
    try:
        yield
    finally:
        _NOISE_SCALE.reset(token)


def draw_gaussian_noise(
    shape, *, std: float, rng: RandomSource, dtype: torch.dtype = torch.float32, device=None
) -> torch.Tensor:
    """N(0, std²) noise of ``shape`` from the dedicated privacy-noise source (every privacy noise
    in privopt is drawn here)."""
    noise = rng.normal(shape, dtype=dtype, device=device).mul_(std)  # a fresh tensor: scaled in place
    scale = _NOISE_SCALE.get()
    return noise if scale == 1.0 else noise * scale


def draw_laplace_noise(
    shape, *, scale: float, rng: RandomSource, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    """Laplace noise (density ``exp(-|y|/scale) / (2 scale)``) of ``shape`` from the privacy-noise
    source, as the difference of two standard exponentials (``-log1p(-u)`` is finite for every
    uniform ``u`` in ``[0, 1)``). Under the test-only noise switch it is scaled like every noise."""
    u = rng.uniform((2, *tuple(int(s) for s in ((shape,) if isinstance(shape, int) else shape))))
    e = -torch.log1p(-u.to(torch.float64))
    noise = ((e[0] - e[1]) * float(scale)).to(dtype=dtype, device=device or "cpu")
    factor = _NOISE_SCALE.get()
    return noise if factor == 1.0 else noise * factor


def gaussian_noise_like(t: torch.Tensor, *, std: float, rng: RandomSource) -> torch.Tensor:
    """Fresh N(0, std^2) noise with ``t``'s shape, drawn from the dedicated privacy-noise source."""
    return draw_gaussian_noise(t.shape, std=std, rng=rng, dtype=t.dtype, device=t.device)


class PrivateBatch:
    """The releases made from one sampled batch (one composed, sampled accounting event).

    Args:
        ledger: the run's privacy ledger, or ``None`` for a non-private reference run (then no
            noise is added and nothing is recorded).
        sampling: how the batch was drawn (``Poisson(rate)``, ``FullBatch()``, ...).
        noise: noise multiplier (std / per-record bound) of each Gaussian release, by name.
        rng: dedicated privacy-noise source (:mod:`privopt.rng`; a ``torch.Generator`` is
            wrapped, insecure).
    """

    def __init__(
        self,
        ledger,
        sampling: Sampling,
        noise: Mapping[str, float],
        *,
        rng,
    ):
        if not noise:
            raise ConfigError("a private batch must declare at least one release")
        self._noise = dict(noise)
        self._used: set[str] = set()
        self._rng = as_source(rng) if rng is not None else None
        self._private = ledger is not None
        self.sampling = sampling
        if self._private:
            mechanisms = tuple(Gaussian(noise_multiplier=float(z), name=n) for n, z in self._noise.items())
            ledger.record(Step(sampling=sampling, mechanisms=mechanisms))

    def gaussian(self, name: str, stat, *, normalizer: float) -> torch.Tensor:
        """Release ``(value + N(0, (z·bound)^2 I)) / normalizer`` of a bounded sum.

        ``stat`` is a :class:`~privopt.grads.sums.BoundedSum` (or an engine ``ClippedSum``): its
        per-record bound is the add/remove-one sensitivity the noise is scaled with.
        ``normalizer`` must be data-independent (the EXPECTED batch size under Poisson sampling,
        never the realised one).
        """
        if name not in self._noise:
            raise ConfigError(f"release {name!r} was not declared for this batch (declared: {sorted(self._noise)})")
        if name in self._used:
            raise ConfigError(f"release {name!r} already made from this batch; declare a new batch")
        if not (isinstance(normalizer, (int, float)) and 0 < normalizer < math.inf):
            raise ConfigError(f"normalizer must be a finite number > 0, got {normalizer!r}")
        stat = as_bounded(stat)
        if self._private and not math.isfinite(stat.bound):
            raise ConfigError(f"release {name!r}: a private release needs a finite per-record bound, got {stat.bound}")
        self._used.add(name)
        out, std = stat.value, 0.0
        if self._private:
            std = self._noise[name] * stat.bound
            # The noise is a fresh tensor: sum and normalisation in place, no [d] temporaries
            # (noise + value is value + noise bit for bit).
            out = gaussian_noise_like(out, std=std, rng=self._rng).add_(out).div_(normalizer)
        else:
            out = out / normalizer
        if _OBSERVERS.get():
            notify_release(ReleaseEvent(name, out.detach().clone(), std, stat.bound, self.sampling, float(normalizer)))
        return out
