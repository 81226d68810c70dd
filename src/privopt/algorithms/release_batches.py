"""The batches a release plan's queries are made on: the whole dataset, Poisson subsamples, one
record (docs/algorithms/README.md). Each says what the accountant sees (``sampling``), the
normaliser of its sums and how to draw it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from privopt.errors import ConfigError
from privopt.privacy import FullBatch, Poisson, SingleRecord
from privopt.sampling import PoissonSampler

__all__ = ["BatchPlan", "FullSampler", "PoissonBatch", "SingleRecordBatch"]


class FullSampler:
    """Every record, every time (a batch whose nominal size reaches n)."""

    def __init__(self, *, n: int):
        self.n = n
        self.sampling = FullBatch()
        self.expected_batch_size = float(n)

    def sample(self) -> torch.Tensor:
        return torch.arange(self.n)


@dataclass(frozen=True)
class BatchPlan:
    """A nominal batch size resolved against the dataset size.

    ``size >= n`` means the full dataset (``FullBatch``, no amplification, normaliser n);
    otherwise Poisson sampling with rate ``size/n`` and normaliser ``size`` (the expected size).
    """

    size: int
    n: int

    @property
    def full(self) -> bool:
        return self.size >= self.n

    @property
    def sampling(self):
        return FullBatch() if self.full else Poisson(self.size / self.n)

    @property
    def normalizer(self) -> float:
        return float(min(self.size, self.n))

    def sampler(self, rng):
        if self.full:
            return FullSampler(n=self.n)
        return PoissonSampler(n=self.n, rate=self.size / self.n, rng=rng)


@dataclass(frozen=True)
class PoissonBatch:
    """DP-SGD's batch: Poisson sampling at rate ``size/n`` (``size > n`` is an error), normaliser
    ``size``; a rate of 1 is still accounted as Poisson sampling."""

    size: int
    n: int

    def __post_init__(self):
        if self.size > self.n:
            raise ConfigError(f"batch_size {self.size} exceeds the training set size {self.n}")

    @property
    def sampling(self):
        return Poisson(self.size / self.n)

    @property
    def normalizer(self) -> int:
        return self.size

    def sampler(self, rng):
        return PoissonSampler(n=self.n, rate=self.size / self.n, rng=rng)


@dataclass(frozen=True)
class SingleRecordBatch:
    """One record drawn uniformly per release (rate 1/n; ``SingleRecord(n)`` in the accountant).
    The algorithm draws the records itself (:func:`privopt.sampling.single_record_draws`), in
    vectorised blocks; the plan only declares the sampling."""

    n: int

    @property
    def sampling(self):
        return SingleRecord(self.n)

    @property
    def normalizer(self) -> float:
        return 1.0

    def sampler(self, rng):
        raise ConfigError("single-record releases are drawn by the algorithm's own vectorised loop")


# ----------------------------------------------------------------------------- sensitivities
