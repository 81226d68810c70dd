"""Batch samplers whose sampling scheme is explicit (never inferred from a loader's length).

Each sampler draws index tensors from its own :class:`privopt.rng.RandomSource` (secret by
default; a plain ``torch.Generator`` is accepted and wrapped) and exposes ``.sampling``,
the :mod:`privopt.privacy.events` description the accountant needs.

Example:
    >>> import torch
    >>> s = PoissonSampler(n=1000, rate=0.05, rng=torch.Generator().manual_seed(0))
    >>> s.sampling
    Poisson(rate=0.05, kind='poisson')
    >>> s.expected_batch_size
    50.0
"""

from __future__ import annotations

import torch

from privopt.errors import ConfigError
from privopt.privacy.events import FullBatch, Poisson, WithoutReplacement
from privopt.rng import as_source

__all__ = ["PoissonSampler", "WithoutReplacementSampler", "DisjointPartition"]


def _check_n(n: int) -> int:
    if not (isinstance(n, int) and n >= 1):
        raise ConfigError(f"dataset size must be an integer >= 1, got {n!r}")
    return n


class PoissonSampler:
    """Includes each of ``n`` records independently with probability ``rate``.

    Batches have random size (possibly 0); normalise sums by :attr:`expected_batch_size`.
    """

    def __init__(self, *, n: int, rate: float, rng):
        self.n = _check_n(n)
        self.sampling = Poisson(rate=float(rate))
        self.rng = as_source(rng)

    @property
    def rate(self) -> float:
        return self.sampling.rate

    @property
    def expected_batch_size(self) -> float:
        return self.rate * self.n

    def sample(self) -> torch.Tensor:
        if self.rate >= 1.0:
            return torch.arange(self.n)
        return torch.nonzero(self.rng.uniform(self.n) < self.rate).squeeze(1)


class WithoutReplacementSampler:
    """A fixed-size batch of ``batch_size`` distinct records (replace-one adjacency in accounting)."""

    def __init__(self, *, n: int, batch_size: int, rng):
        self.n = _check_n(n)
        self.sampling = WithoutReplacement(n=n, batch_size=batch_size)
        self.batch_size = batch_size
        self.rng = as_source(rng)

    def sample(self) -> torch.Tensor:
        return self.rng.randperm(self.n)[: self.batch_size]


class DisjointPartition:
    """Single-pass disjoint batches: each record is used at most once (parallel composition).

    Raises :class:`ConfigError` when asked for more records than remain, instead of reusing any.
    """

    def __init__(self, *, n: int, rng):
        self.n = _check_n(n)
        self._order = as_source(rng).randperm(n)
        self._next = 0
        self.sampling = FullBatch()  # each disjoint part is released once, un-amplified

    @property
    def remaining(self) -> int:
        return self.n - self._next

    def take(self, size: int) -> torch.Tensor:
        if size > self.remaining:
            raise ConfigError(f"disjoint partition exhausted: asked for {size} records, {self.remaining} remain")
        idx = self._order[self._next : self._next + size]
        self._next += size
        return idx

    def state_dict(self) -> dict:
        return {"order": self._order, "next": self._next}

    def load_state_dict(self, state: dict) -> None:
        self._order, self._next = state["order"], int(state["next"])


def single_record_draws(*, n: int, steps: int, neighbouring: str, rng) -> tuple[torch.Tensor, torch.Tensor]:
    """Record indices for ``steps`` queries at rate 1/n (``SingleRecord(n)`` in the accountant).

    Returns ``(indices, counts)``: step ``t`` uses ``indices[sum(counts[:t]) : sum(counts[:t+1])]``.
    The realised sampling must be the one the accountant assumes:

    * ``replace_one``: exactly one uniformly drawn record per step (without replacement, b = 1);
    * ``add_remove``: Poisson sampling with rate 1/n — each record independently, so a step holds
      0, 1, 2, ... records (Binomial(n, 1/n)); a uniform draw of exactly one record would NOT be
      Poisson-subsampled and the Poisson(1/n) accounting would not apply to it.
    """
    _check_n(n)
    rng = as_source(rng)
    if neighbouring == "replace_one":
        return rng.randint(n, (steps,)), torch.ones(steps, dtype=torch.int64)
    if neighbouring != "add_remove":
        raise ConfigError(f"unknown neighbouring relation {neighbouring!r}")
    counts = rng.binomial(n, 1.0 / n, steps)
    idx = rng.randint(n, (int(counts.sum()),))
    # Given its size c, a Poisson sample is a uniform c-subset: redraw the rare repeated indices.
    offsets = torch.cumsum(counts, 0) - counts
    for t in torch.nonzero(counts >= 2).squeeze(1).tolist():
        a, c = int(offsets[t]), int(counts[t])
        while len(set(idx[a : a + c].tolist())) < c:
            idx[a : a + c] = rng.randint(n, (c,))
    return idx, counts
