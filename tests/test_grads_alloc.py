"""The allocator policy of privopt's own runs: applied once, never over the user's, never by an engine query."""

import pytest

from privopt.grads import alloc


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(alloc, "_state", {})
    for k in (*alloc._POLICY_ENV, "PRIVOPT_RETAIN_FREED_MEMORY"):
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr(alloc, "_mallopt", lambda: calls.append(1) or True)
    return calls


@pytest.mark.parametrize("var", [*alloc._POLICY_ENV, "PRIVOPT_RETAIN_FREED_MEMORY"])
def test_an_explicit_allocator_policy_is_left_alone(fresh, monkeypatch, var):
    monkeypatch.setenv(var, "0")
    assert alloc.retain_freed_memory() is False
    assert fresh == []


def test_policy_is_applied_once_per_process(fresh, monkeypatch):
    monkeypatch.setattr(alloc.sys, "platform", "linux")
    assert alloc.retain_freed_memory() is True
    assert alloc.retain_freed_memory() is True
    assert fresh == [1]


def test_other_platforms_are_left_alone(fresh, monkeypatch):
    monkeypatch.setattr(alloc.sys, "platform", "darwin")
    assert alloc.retain_freed_memory() is False
    assert fresh == []


def test_an_engine_query_leaves_the_allocator_alone_and_the_bench_applies_it(fresh, monkeypatch):
    import torch
    from torch import nn

    from privopt.bench import run_bench
    from privopt.grads import get_engine

    monkeypatch.setattr(alloc.sys, "platform", "linux")
    model = nn.Linear(3, 2)
    loss = lambda o, t: nn.functional.cross_entropy(o, t, reduction="none")
    get_engine("ghost").clipped_sum(model, loss, torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), clip=1.0)
    assert fresh == []  # a user's own loop keeps its process's allocator policy
    run_bench(models=("tiny",), batch_sizes=(4,), repeats=1, progress=False, methods=("dp-sgd",), memory=False)
    assert fresh == [1]
