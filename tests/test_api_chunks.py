"""make_private(max_physical_batch_size=...): the clipped sum of one Poisson batch in chunks.

Same batch, one noise draw, one ledger charge; only the summation order (and the memory) changes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import privopt
from privopt.errors import ConfigError
from privopt.grads import get_engine

N = 600


def toy(n=N, d=5):
    x = torch.rand(n, d, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0.5).long()


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 8), nn.ReLU(), nn.Linear(8, 2)
    )


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 2))


def private(model, *, engine_name="auto", dataset=None, **over):
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=3, engine=engine_name)
    args = dict(batch_size=200, epochs=1, epsilon=4.0, delta=1e-4, max_grad_norm=1.0, dataset=dataset or toy())
    args.update(over)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return engine, *engine.make_private(module=model, optimizer=optimizer, **args)


def train(model, *, steps=2, **over):
    """``steps`` steps of the usual loop (with the user's backward); the sizes of the batches."""
    engine, model, optimizer, loader = private(model, **over)
    sizes = []
    for _, (xb, yb) in zip(range(steps), loader):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
        sizes.append(len(yb))
    return engine, model, sizes


@pytest.fixture
def spy(monkeypatch):
    """Records the number of records of every ``clipped_sum`` call of the engines."""
    calls = []
    for name in ("ghost", "vmap"):
        cls = type(get_engine(name))
        original = cls.clipped_sum

        def recorded(self, model, loss_fn, inputs, targets, *args, _original=original, **kwargs):
            calls.append(int(inputs.shape[0]))
            return _original(self, model, loss_fn, inputs, targets, *args, **kwargs)

        monkeypatch.setattr(cls, "clipped_sum", recorded)
    return calls


def images(n=N):
    x = torch.rand(n, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    return x, (x[:, 0, 0, 0] > 0.5).long()


@pytest.mark.parametrize("engine_name", ["ghost", "vmap"])
@pytest.mark.parametrize(("build", "data"), [(mlp, toy), (cnn, images)])
def test_chunked_steps_equal_the_unchunked_ones(engine_name, build, data):
    whole_engine, whole, sizes = train(build(), engine_name=engine_name, dataset=data())
    chunk_engine, chunked, chunk_sizes = train(
        build(), engine_name=engine_name, dataset=data(), max_physical_batch_size=37
    )
    assert sizes == chunk_sizes and min(sizes) > 2 * 37  # same batches, each in several chunks
    for a, b, init in zip(whole.parameters(), chunked.parameters(), build().parameters()):
        assert not torch.allclose(a, init)  # the steps moved the parameters
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same noise: only float order differs
    assert chunk_engine.get_epsilon() == whole_engine.get_epsilon()


def test_a_chunk_at_least_the_batch_is_bit_identical_to_no_chunk():
    _, whole, sizes = train(mlp())
    _, chunked, _ = train(mlp(), max_physical_batch_size=N)
    assert max(sizes) < N
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), chunked.parameters()))


@pytest.mark.parametrize("engine_name", ["ghost", "vmap"])
def test_the_engine_never_sees_more_than_a_chunk(spy, engine_name):
    engine, _, optimizer, loader = private(mlp(), engine_name=engine_name, max_physical_batch_size=50)
    spy.clear()  # make_private's own two-record check
    xb, _ = next(iter(loader))
    optimizer.step()
    assert len(xb) > 150 and max(spy) <= 50
    assert sum(spy) == len(xb) and len(spy) == -(-len(xb) // 50)
    assert engine.accountant.num_steps == engine.steps_taken == 1  # one logical step, one charge
    assert "max_physical_batch_size=50" in repr(optimizer)


def test_without_chunks_the_engine_sees_the_whole_batch(spy):
    _, _, optimizer, loader = private(mlp())
    spy.clear()
    xb, _ = next(iter(loader))
    optimizer.step()
    assert spy == [len(xb)] and "max_physical_batch_size" not in repr(optimizer)


def test_one_ledger_charge_and_one_noise_draw_per_logical_step(monkeypatch):
    from privopt.grads import release

    draws = []
    original = release.draw_gaussian_noise

    def counted(*args, **kwargs):
        draws.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(release, "draw_gaussian_noise", counted)
    engine, _, sizes = train(mlp(), steps=3, max_physical_batch_size=16)
    d = sum(p.numel() for p in mlp().parameters())
    assert min(sizes) > 16 * 5
    assert engine.accountant.num_steps == engine.steps_taken == 3
    assert [tuple(s) for s in draws] == [(d,)] * 3


def test_an_empty_batch_with_chunks_releases_pure_noise(spy):
    engine, model, optimizer, loader = private(mlp(), batch_size=1, max_physical_batch_size=8)
    spy.clear()
    before = [p.detach().clone() for p in model.parameters()]
    next(xb for xb, _ in loader if len(xb) == 0)  # skipped batches cost nothing
    optimizer.step()
    assert spy == [] and engine.steps_taken == 1
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("bad", [0, -1, 2.0, 1.5, True, "64", float("nan")])
def test_max_physical_batch_size_must_be_none_or_a_positive_int(bad):
    model = mlp()
    with pytest.raises(ConfigError, match=r"max_physical_batch_size \(None or a positive int\).*got"):
        private(model, max_physical_batch_size=bad)
    private(model, max_physical_batch_size=None)  # nothing was claimed by the refused call


def test_max_physical_batch_size_is_keyword_only():
    engine = privopt.PrivacyEngine()
    with pytest.raises(TypeError):
        engine.make_private(mlp(), 1)


def test_chunks_are_not_accumulation_and_accumulation_stays_refused():
    engine, model, optimizer, loader = private(mlp(), max_physical_batch_size=20)
    batches = iter(loader)
    for _ in range(2):  # the loop with chunks: the engine's chunked passes are not the user's backward
        xb, yb = next(batches)
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    assert engine.steps_taken == 2
    nn.functional.cross_entropy(model(xb), yb).backward()  # pending gradient of the last batch
    xb, yb = next(batches)
    with pytest.raises(ConfigError, match="gradient accumulation.*max_physical_batch_size="):
        nn.functional.cross_entropy(model(xb), yb).backward()
    assert engine.accountant.num_steps == 2
