"""Per-iteration reuse of a batch's rows and losses changes no released value, only the work."""

import pytest
import torch

import privopt.algorithms.dro_common as dro_common
from dro_helpers import FULL_RS, make_ctx
from privopt.algorithms import get_algorithm
from privopt.algorithms.batch_memo import BatchMemo


def test_rows_are_reused_for_the_same_batch_object_only():
    memo, x, y = BatchMemo(), torch.randn(6, 3), torch.arange(6)
    idx = torch.tensor([1, 4])
    xb, yb = memo.rows(idx, x, y)
    assert torch.equal(xb, x[idx]) and torch.equal(yb, y[idx])
    assert memo.rows(idx, x, y)[0] is xb
    other = torch.tensor([1, 4])  # equal values, another batch: gathered again
    assert memo.rows(other, x, y)[0] is not xb


def test_losses_go_stale_when_the_point_moves():
    torch.manual_seed(0)
    memo, model, idx = BatchMemo(), torch.nn.Linear(3, 2), torch.tensor([0, 1])
    memo.store_losses(idx, model, None, torch.ones(2))
    assert torch.equal(memo.losses(idx, model, None), torch.ones(2))
    assert memo.losses(torch.tensor([0, 1]), model, None) is None  # another batch
    flat = torch.zeros(8)
    assert memo.losses(idx, model, flat) is None  # another point
    with torch.no_grad():
        model.bias.add_(0.5)  # an in-place update
    assert memo.losses(idx, model, None) is None
    memo.store_losses(idx, model, None, torch.ones(2))
    model.weight.data = torch.zeros(2, 3)  # a replaced tensor
    assert memo.losses(idx, model, None) is None
    memo.store_losses(idx, model, flat, torch.full((2,), 3.0))
    assert torch.equal(memo.losses(idx, model, flat), torch.full((2,), 3.0))
    flat.add_(1.0)  # the flat point moved in place
    assert memo.losses(idx, model, flat) is None


def _run(name, steps, monkeypatch, *, memo: bool, **params):
    if not memo:
        monkeypatch.setattr(BatchMemo, "losses", lambda self, idx, model, flat: None)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ctx = make_ctx(model, noise={"*": 1.0})
    algo = get_algorithm(name, **params)
    algo.setup(ctx)
    logs = [algo.step(t) for t in range(steps)]
    monkeypatch.undo()
    return logs, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize(
    "name, params",
    [
        ("dp-recursive-spider", dict(FULL_RS, q=1, chunk_size=32)),
        ("dp-recursive-spider", dict(FULL_RS, q=3, chunk_size=32)),
        ("dp-double-spider", dict(q=2, chunk_size=32)),
        ("dp-sgda", dict(chunk_size=32)),
    ],
)
def test_reuse_changes_no_released_value(name, params, monkeypatch):
    with_memo = _run(name, 4, monkeypatch, memo=True, **params)
    without = _run(name, 4, monkeypatch, memo=False, **params)
    assert with_memo[0] == without[0]
    assert torch.equal(with_memo[1], without[1])


def _counting_recursive_spider(monkeypatch, **params):
    """(Recursive-SPIDER set up on the standard problem, the list its ``batch_losses`` calls append to)."""
    calls = []
    real = dro_common.batch_losses
    monkeypatch.setattr(dro_common, "batch_losses", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    algo = get_algorithm("dp-recursive-spider", **dict(FULL_RS, **params))
    algo.setup(make_ctx(torch.nn.Linear(4, 2), noise={"*": 1.0}))
    return algo, calls


def test_recursive_spider_refresh_computes_its_losses_once(monkeypatch):
    algo, calls = _counting_recursive_spider(monkeypatch, q=1)
    algo.step(0)
    # v's one-pass weighted query already has the batch's losses at (x_t, λ_t): s and u reuse them
    assert calls == []


def test_recursive_spider_correction_reuses_both_points_losses(monkeypatch):
    algo, calls = _counting_recursive_spider(monkeypatch, q=3)
    algo.step(0)
    calls.clear()
    algo.step(1)  # a correction: v-diff and u-diff share a batch, the STORM s update has its own
    assert set(algo._last_thresholds) == {"v-diff", "u-diff"}  # both corrections were made
    # u-diff reads v-diff's losses at x_t and x_{t-1}; only s (another batch) computes its two points
    assert len(calls) == 2
