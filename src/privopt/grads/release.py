"""Noisy releases of clipped sums, each tied to its accounting event.

:class:`PrivateBatch` is the only way algorithms add privacy noise. It is opened for ONE sampled
batch with the mechanisms that batch will release; opening it records the step in the ledger
(the budget guard may refuse it, before any noise is drawn or anything released), and each
declared mechanism can then be used exactly once.

Example:
    >>> import torch
    >>> from privopt.privacy import PrivacyLedger, Poisson, Gaussian
    >>> ledger = PrivacyLedger(delta=1e-5)
    >>> from privopt.rng import TorchSource
    >>> batch = PrivateBatch(ledger, Poisson(0.01), {"grad": 1.1}, rng=TorchSource(seed=0))
    >>> noisy_mean = batch.gaussian("grad", torch.ones(3), clip=1.0, normalizer=100.0)
    >>> ledger.num_steps
    1
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from privopt.errors import ConfigError
from privopt.privacy.events import Gaussian, Sampling, Step
from privopt.rng import RandomSource, as_source

__all__ = ["PrivateBatch", "gaussian_noise_like"]


def gaussian_noise_like(t: torch.Tensor, *, std: float, rng: RandomSource) -> torch.Tensor:
    """Fresh N(0, std^2) noise with ``t``'s shape, drawn from the dedicated privacy-noise source."""
    return rng.normal(t.shape, dtype=t.dtype, device=t.device) * std


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
        if self._private:
            mechanisms = tuple(Gaussian(noise_multiplier=float(z), name=n) for n, z in self._noise.items())
            ledger.record(Step(sampling=sampling, mechanisms=mechanisms))

    def gaussian(self, name: str, clipped_sum: torch.Tensor, *, clip: float, normalizer: float) -> torch.Tensor:
        """Release ``(clipped_sum + N(0, (z*clip)^2 I)) / normalizer``.

        ``clipped_sum`` must be a sum of per-record terms each of L2 norm at most ``clip`` (its
        add/remove-one sensitivity is ``clip``); ``normalizer`` must be data-independent (the
        EXPECTED batch size under Poisson sampling, never the realised one).
        """
        if name not in self._noise:
            raise ConfigError(f"release {name!r} was not declared for this batch (declared: {sorted(self._noise)})")
        if name in self._used:
            raise ConfigError(f"release {name!r} already made from this batch; declare a new batch")
        if not clip > 0:
            raise ConfigError(f"clip threshold must be > 0, got {clip}")
        if not normalizer > 0:
            raise ConfigError(f"normalizer must be > 0, got {normalizer}")
        self._used.add(name)
        out = clipped_sum
        if self._private:
            out = out + gaussian_noise_like(out, std=self._noise[name] * clip, rng=self._rng)
        return out / normalizer
