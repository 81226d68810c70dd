"""privopt.rng: secret-by-default randomness; distributions, resumable state, insecure opt-in."""

import numpy as np
import pytest
import torch
from scipy import stats

from privopt.errors import ConfigError
from privopt.rng import SecureSource, TorchSource, as_source, make_sources


def test_secure_sources_differ_between_runs_and_resume_exactly():
    a, b = SecureSource(), SecureSource()
    assert not torch.equal(a.normal((8,)), b.normal((8,)))  # fresh OS-entropy keys
    a.uniform((5,))
    state = a.state_dict()
    expect = (a.normal((7, 3)), a.randperm(11), a.randint(13, (4,)), a.binomial(50, 0.02, 6))
    c = SecureSource()
    c.load_state_dict(state)
    got = (c.normal((7, 3)), c.randperm(11), c.randint(13, (4,)), c.binomial(50, 0.02, 6))
    for e, g in zip(expect, got):
        assert torch.equal(e, g)


def test_secure_normal_uniform_randint_have_the_right_distributions():
    src = SecureSource()
    z = src.normal((200_000,), dtype=torch.float64).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    u = src.uniform((200_000,)).numpy()
    assert u.min() >= 0 and u.max() < 1 and stats.kstest(u, "uniform").pvalue > 1e-4
    r = src.randint(7, (70_000,)).numpy()
    assert r.min() == 0 and r.max() == 6
    assert stats.chisquare(np.bincount(r, minlength=7)).pvalue > 1e-4
    c = src.binomial(1000, 0.01, 20_000).numpy()
    assert abs(c.mean() - 10) < 0.15 and abs(c.var() - 9.9) < 0.6
    assert sorted(src.randperm(1000).tolist()) == list(range(1000))


def test_seeded_source_is_reproducible_and_marked_insecure():
    s1, s2 = make_sources(insecure_seed=4), make_sources(insecure_seed=4)
    assert torch.equal(s1["noise"].normal((5,)), s2["noise"].normal((5,)))
    assert not s1["noise"].secure and make_sources()["noise"].secure
    # noise and sampling come from different streams
    assert not torch.equal(TorchSource(1).normal((5,)), TorchSource(2).normal((5,)))


def test_bad_inputs_fail_clearly():
    with pytest.raises(ConfigError, match="insecure_seed"):
        make_sources(insecure_seed=-1)
    with pytest.raises(ConfigError, match="RandomSource"):
        as_source(np.random.default_rng(0))
    with pytest.raises(ConfigError, match="secure source"):
        SecureSource().load_state_dict(TorchSource(0).state_dict())
