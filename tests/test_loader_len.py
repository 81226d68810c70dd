"""``len()`` of the private loader of ``make_private``: the batches of the next pass (what the next
``for`` over it yields), also after the budget guard refused a step or a pass was left early."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import privopt
from privopt.errors import PrivacyBudgetExceeded

# These tests draw whole passes without step() on purpose (they count batches): not a forgotten step.
pytestmark = pytest.mark.filterwarnings("ignore:a whole pass over the private loader")


def _private(*, epochs=1.0, n=400, batch_size=40):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 5, generator=g)
    y = (x[:, 0] > 0.5).long()
    model = nn.Linear(5, 2)
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=0)
    _, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), dataset=(x, y),
        batch_size=batch_size, epochs=epochs, epsilon=2.0, delta=1e-4, max_grad_norm=1.0,
    )  # fmt: skip
    return engine, optimizer, loader


def _pass(loader, optimizer) -> int:
    """One ``for`` over the loader with a step per batch; the batches it yielded."""
    count = 0
    for _ in loader:
        count += 1
        optimizer.step()
    return count


def test_len_is_the_next_pass_and_stays_so_after_the_budget_guard_refuses():
    engine, optimizer, loader = _private(epochs=1)
    assert len(loader) == engine.planned_steps == 10
    assert _pass(loader, optimizer) == 10 and len(loader) == 10  # beyond the plan: passes of 10 again
    with pytest.raises(PrivacyBudgetExceeded):
        _pass(loader, optimizer)  # the first step beyond the target is refused
    refused_at = engine.steps_taken
    # The refused batch's pass is over: len() is the next pass, not its remainder plus the next one.
    assert len(loader) == 10
    drawn = sum(1 for _ in loader)
    assert drawn == 10 and len(loader) == 10  # len() == what the next `for` yields
    with pytest.raises(PrivacyBudgetExceeded):  # still refused: a refused step changed nothing
        next(iter(loader))
        optimizer.step()
    assert engine.steps_taken == refused_at and engine.get_epsilon() <= 2.0


def test_len_matches_every_pass_of_a_fractional_plan_and_beyond():
    engine, optimizer, loader = _private(epochs=2.5)
    sizes = []
    for _ in range(3):
        expected = len(loader)
        sizes.append(_pass(loader, optimizer))
        assert sizes[-1] == expected
    assert sizes == [10, 10, 5] and engine.steps_taken == engine.planned_steps == 25
    assert len(loader) == 10  # after the plan: an epoch of the plan's rhythm, not 30 - 25 + ...


def test_a_pass_left_early_ends_and_len_does_not_count_its_rest():
    _, optimizer, loader = _private(epochs=2)
    it = iter(loader)
    assert len(loader) == 10  # a pass under way: len() already counts the next one
    for _ in range(3):
        next(it)
        optimizer.step()
    assert len(loader) == 10
    assert _pass(loader, optimizer) == 10  # the next pass is whole, not 7 + 10
    assert list(it) == []  # the earlier iterator yields nothing more once a later pass started
    assert len(loader) == 10 and len(list(loader)) == 10


def test_len_reads_no_batch_size():
    _, optimizer, loader = _private(epochs=0.05, batch_size=1)  # q = 1/400: mostly empty batches
    assert len(loader) == 20
    assert _pass(loader, optimizer) == 20
    assert len(loader) == 400  # beyond the plan: one epoch is n / batch_size batches
