"""Samplers: explicit rates, reproducibility, and single-pass disjointness."""

import numpy as np
import pytest
import torch

from privopt.errors import ConfigError
from privopt.privacy.events import FullBatch, Poisson, WithoutReplacement
from privopt.sampling import DisjointPartition, PoissonSampler, WithoutReplacementSampler


def test_poisson_sampler_rate_and_reproducibility():
    s = PoissonSampler(n=1000, rate=0.05, rng=torch.Generator().manual_seed(0))
    sizes = [len(s.sample()) for _ in range(400)]
    assert abs(np.mean(sizes) - 50) < 1.5  # sd of the mean ~0.34
    assert s.expected_batch_size == 50 and s.sampling == Poisson(0.05)
    a = PoissonSampler(n=50, rate=0.3, rng=torch.Generator().manual_seed(7)).sample()
    b = PoissonSampler(n=50, rate=0.3, rng=torch.Generator().manual_seed(7)).sample()
    assert torch.equal(a, b) and a.dtype == torch.int64
    tiny = PoissonSampler(n=10, rate=1e-4, rng=torch.Generator().manual_seed(0))
    assert any(len(tiny.sample()) == 0 for _ in range(20))
    with pytest.raises(ConfigError, match="rate"):
        PoissonSampler(n=10, rate=0.0, rng=torch.Generator())


def test_without_replacement_sampler():
    s = WithoutReplacementSampler(n=20, batch_size=8, rng=torch.Generator().manual_seed(1))
    batches = [s.sample() for _ in range(30)]
    assert all(len(b) == 8 and len(set(b.tolist())) == 8 and int(b.max()) < 20 for b in batches)
    assert len({tuple(sorted(b.tolist())) for b in batches}) > 1
    assert s.sampling == WithoutReplacement(20, 8)
    with pytest.raises(ConfigError, match="batch size"):
        WithoutReplacementSampler(n=5, batch_size=6, rng=torch.Generator())


def test_disjoint_partition_never_reuses_a_record():
    p = DisjointPartition(n=103, rng=torch.Generator().manual_seed(2))
    batches = [p.take(10) for _ in range(10)]
    assert p.remaining == 3 and p.sampling == FullBatch()
    flat = torch.cat(batches).tolist()
    assert len(flat) == len(set(flat)) == 100
    with pytest.raises(ConfigError, match="exhausted"):
        p.take(4)
    state = p.state_dict()
    q = DisjointPartition(n=103, rng=torch.Generator().manual_seed(99))
    q.load_state_dict(state)
    assert torch.equal(q.take(3), p.take(3))


def test_single_record_draws_match_the_accounted_sampling():
    from privopt.sampling import single_record_draws

    g = torch.Generator().manual_seed(5)
    idx, counts = single_record_draws(n=50, steps=4000, neighbouring="add_remove", rng=g)
    # Poisson(1/n): Binomial(n, 1/n) records per step, mean 1, some empty and some with several
    assert abs(counts.float().mean().item() - 1.0) < 0.05
    assert (counts == 0).any() and (counts >= 2).any()
    assert int(counts.sum()) == len(idx)
    pos = 0
    for c in counts.tolist():
        assert len(set(idx[pos : pos + c].tolist())) == c  # a Poisson sample has no repeats
        pos += c
    idx1, counts1 = single_record_draws(n=50, steps=100, neighbouring="replace_one", rng=g)
    assert (counts1 == 1).all() and len(idx1) == 100 and int(idx1.max()) < 50
    with pytest.raises(ConfigError, match="neighbouring"):
        single_record_draws(n=5, steps=1, neighbouring="bogus", rng=g)
