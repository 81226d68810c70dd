"""NoiseAhead: privacy noise drawn in a background thread is the wrapped source's own stream."""

from __future__ import annotations

import pytest
import torch

from privopt.errors import ConfigError
from privopt.grads.ahead import NoiseAhead
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import BoundedSum
from privopt.privacy import Poisson, PrivacyLedger
from privopt.rng import SecureSource, TorchSource

# Every kind of request, in an order that switches shapes and interleaves non-normal draws.
CALLS = [
    ("normal", ((5,),)),
    ("normal", ((5,),)),
    ("normal", ((2, 3),)),
    ("uniform", ((4,),)),
    ("normal", ((2, 3),)),
    ("normal", ((2, 3),)),
    ("randint", (7, (3,))),
    ("randperm", (6,)),
    ("binomial", (10, 0.3, 4)),
    ("normal", ((5,),)),
    ("normal", ((5,),)),
]


def _replay(src, calls=CALLS):
    return [getattr(src, name)(*args) for name, args in calls]


@pytest.mark.parametrize("make", [lambda: TorchSource(seed=3), lambda: SecureSource(key=bytes(range(32)))])
def test_values_and_order_are_the_wrapped_sources(make):
    ahead, plain = NoiseAhead(make()), make()
    try:
        for got, want in zip(_replay(ahead), _replay(plain)):
            assert got.dtype == want.dtype and torch.equal(got, want)
    finally:
        ahead.close()


def test_dtype_is_part_of_the_pending_draw():
    ahead, plain = NoiseAhead(TorchSource(seed=1)), TorchSource(seed=1)
    got = [ahead.normal((4,)), ahead.normal((4,), dtype=torch.float64), ahead.normal((4,))]
    want = [plain.normal((4,)), plain.normal((4,), dtype=torch.float64), plain.normal((4,))]
    assert [g.dtype for g in got] == [torch.float32, torch.float64, torch.float32]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    ahead.close()


def test_checkpoint_state_excludes_the_pending_draw():
    """A checkpoint taken while a draw is pending resumes exactly where the run stood: the pending
    values are neither skipped nor used twice."""
    ahead, plain = NoiseAhead(TorchSource(seed=5)), TorchSource(seed=5)
    ahead.normal((8,))
    plain.normal((8,))
    state = ahead.state_dict()
    resumed = NoiseAhead(TorchSource(seed=99))
    resumed.load_state_dict(state)
    for _ in range(3):
        want = plain.normal((8,))
        assert torch.equal(ahead.normal((8,)), want)
    # the resumed wrapper replays the same stream from the checkpoint
    replay = TorchSource(seed=5)
    replay.normal((8,))
    assert all(torch.equal(resumed.normal((8,)), replay.normal((8,))) for _ in range(3))
    ahead.close()
    resumed.close()


def test_secure_checkpoint_round_trip_and_secrecy_flag():
    ahead = NoiseAhead(SecureSource())
    assert ahead.secure and not NoiseAhead(TorchSource(seed=0)).secure
    ahead.normal((16,))
    state = ahead.state_dict()
    nxt = ahead.normal((16,))
    again = NoiseAhead(SecureSource())
    again.load_state_dict(state)
    assert torch.equal(again.normal((16,)), nxt)  # the pending draw is re-drawn, not skipped
    ahead.close()
    again.close()


def test_private_batch_release_is_unchanged_by_drawing_ahead():
    """A noisy release through PrivateBatch adds the same noise with and without NoiseAhead."""
    stat = BoundedSum(torch.arange(6, dtype=torch.float32), bound=2.0)
    outs = []
    for rng in (NoiseAhead(TorchSource(seed=11)), TorchSource(seed=11)):
        ledger = PrivacyLedger(delta=1e-5)
        outs.append(
            [
                PrivateBatch(ledger, Poisson(0.1), {"grad": 1.3}, rng=rng).gaussian("grad", stat, normalizer=4.0)
                for _ in range(3)
            ]
        )
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_rejects_what_is_not_a_random_source():
    with pytest.raises(ConfigError, match="RandomSource"):
        NoiseAhead(torch.Generator())
    with pytest.raises(ConfigError, match="RandomSource"):
        NoiseAhead(NoiseAhead(TorchSource(seed=0)))


def test_normals_have_the_declared_distribution():
    """Moments of many draws made ahead (a statistical check with a generous margin)."""
    ahead = NoiseAhead(TorchSource(seed=2))
    z = torch.cat([ahead.normal((10_000,)) for _ in range(20)])
    ahead.close()
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1.0) < 0.01


def test_runs_draw_noise_ahead_with_the_seeded_stream():
    """``privopt train``'s noise source is wrapped, and a seeded run's noise is unchanged by it."""
    from privopt.rng import make_sources
    from privopt.training import run_sources

    wrapped, plain = run_sources(7)["noise"], make_sources(insecure_seed=7)["noise"]
    assert isinstance(wrapped, NoiseAhead) and not wrapped.secure
    assert all(torch.equal(wrapped.normal((9,)), plain.normal((9,))) for _ in range(3))
    assert run_sources(None)["noise"].secure
    wrapped.close()


def _torch_openmp_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp" and "torch" in i["filepath"]]


def test_the_noise_thread_uses_the_callers_torch_thread_count():
    # torch.set_num_threads holds per thread: a fresh thread ran its draws on one OpenMP thread per
    # core, and two one-thread runs on two cores spun on each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if not _torch_openmp_threads():
            pytest.skip("this torch build has no OpenMP runtime to inspect")
        ahead = NoiseAhead(TorchSource(seed=0))
        ahead.normal((4,))  # starts the background thread and a draw ahead
        assert ahead._pool.submit(_torch_openmp_threads).result() == [1]
        ahead.close()
    finally:
        torch.set_num_threads(before)


def test_synchronous_and_ahead_checkpoints_resume_each_other():
    """A run checkpointed in a worker that draws synchronously resumes with noise drawn ahead (and
    back) without skipping or repeating noise: both checkpoint the wrapped source's own state."""
    from privopt.grads.ahead import run_noise_source, set_draw_ahead

    plain = TorchSource(seed=4)
    try:
        set_draw_ahead(enabled=False)
        sync = run_noise_source(TorchSource(seed=4))
    finally:
        set_draw_ahead(enabled=True)
    assert type(sync) is TorchSource
    expect = [plain.normal((5,)) for _ in range(4)]
    sync.normal((5,))
    ahead = run_noise_source(TorchSource(seed=0))
    ahead.load_state_dict(sync.state_dict())
    assert torch.equal(ahead.normal((5,)), expect[1])
    back = TorchSource(seed=0)
    back.load_state_dict(ahead.state_dict())  # taken with the next draw pending
    assert torch.equal(back.normal((5,)), expect[2]) and torch.equal(ahead.normal((5,)), expect[2])
    ahead.close()
    with pytest.raises(ConfigError, match="True or False"):
        set_draw_ahead(enabled=1)
