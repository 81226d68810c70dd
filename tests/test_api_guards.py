"""Misuse guards of privopt.PrivacyEngine: gradient accumulation, failures inside a step, a model
changed after make_private, and a second make_private on a model or optimizer already private."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import privopt
from privopt.errors import ConfigError, ModelError, PrivacyBudgetExceeded


def toy(n=400, d=5):
    x = torch.rand(n, d, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0.5).long()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))


def private(model, *, optimizer=None, engine_name="auto", **over):
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=1, engine=engine_name)
    args = dict(batch_size=40, epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=1.0, dataset=toy())
    args.update(over)
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.5)
    return engine, *engine.make_private(module=model, optimizer=optimizer, **args)


def backward(model, xb, yb):
    nn.functional.cross_entropy(model(xb), yb).backward()


# ---------------------------------------------------------------- 1. gradient accumulation


@pytest.mark.parametrize("engine_name", ["auto", "vmap"])
def test_backward_on_a_second_batch_before_step_is_refused_in_that_backward(engine_name):
    engine, model, optimizer, loader = private(mlp(), engine_name=engine_name)
    batches = iter(loader)
    xb, yb = next(batches)
    backward(model, xb, yb)
    backward(model, xb, yb)  # a second loss on the same batch is no accumulation over batches
    xb, yb = next(batches)
    with pytest.raises(ConfigError, match="gradient accumulation over several batches is not supported.*batch_size="):
        backward(model, xb, yb)
    assert engine.accountant.num_steps == 0 and engine.steps_taken == 0
    optimizer.zero_grad()  # ends the earlier batch's gradient: the loop goes on
    backward(model, xb, yb)
    optimizer.step()
    xb, yb = next(batches)
    loss = optimizer.step(closure=lambda: nn.functional.cross_entropy(model(xb), yb).backward())
    assert engine.steps_taken == engine.accountant.num_steps == 2 and loss is None


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 2)

    def forward(self, x):
        return {"logits": self.a(x)}


def test_accumulation_is_refused_for_a_model_with_several_outputs():
    def criterion(out, target):
        return nn.functional.cross_entropy(out["logits"], target, reduction="none")

    _, model, _, loader = private(DictOut(), criterion=criterion)
    batches = iter(loader)
    for k in range(2):
        xb, yb = next(batches)
        loss = criterion(model(xb), yb).mean()
        if k == 0:
            loss.backward()
    with pytest.raises(ConfigError, match="gradient accumulation"):
        loss.backward()


def test_a_skipped_step_whose_gradient_was_cleared_is_no_accumulation():
    engine, model, optimizer, loader = private(mlp())
    batches = iter(loader)
    backward(model, *next(batches))
    model.zero_grad()  # the module's own zero_grad (grads set to None) also clears the earlier batch
    backward(model, *next(batches))
    with torch.no_grad():
        model(toy()[0])  # evaluation passes never count
    optimizer.step()
    backward(model, *next(batches))  # step() ended the previous batch's gradient
    optimizer.step()
    assert engine.steps_taken == engine.accountant.num_steps == 2


def test_the_private_model_can_be_copied_and_pickled_without_the_optimizer():
    engine, model, optimizer, loader = private(mlp())
    clone = pickle.loads(pickle.dumps(copy.deepcopy(model)))
    xb, yb = next(iter(loader))
    backward(clone, xb, yb)  # the copy's hooks are inert: no guard, no reference to the optimizer
    backward(model, xb, yb)
    optimizer.step()
    assert engine.steps_taken == 1


# ---------------------------------------------------------------- 2. a failure inside a step


class FlakySGD(torch.optim.SGD):
    fail = False

    def step(self, closure=None):
        if self.fail:
            raise RuntimeError("injected optimizer failure")
        return super().step(closure)


def test_a_step_failing_after_its_charge_is_counted_and_its_batch_used_up():
    model = mlp()
    optimizer = FlakySGD(model.parameters(), lr=0.5)
    engine, model, dp_optimizer, loader = private(model, optimizer=optimizer)
    batches = iter(loader)
    next(batches)
    optimizer.fail = True
    with pytest.raises(RuntimeError, match="injected optimizer failure"):
        dp_optimizer.step()
    assert engine.steps_taken == engine.accountant.num_steps == 1
    optimizer.fail = False
    with pytest.raises(ConfigError, match="needs a new batch"):  # the charged batch is not released twice
        dp_optimizer.step()
    next(batches)
    dp_optimizer.step()
    assert engine.steps_taken == engine.accountant.num_steps == 2


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_step_failing_in_the_gradient_computation_is_counted_as_charged(error):
    armed = []

    def criterion(out, target):
        if armed:
            raise error("injected criterion failure")
        return nn.functional.cross_entropy(out, target, reduction="none")

    engine, _, optimizer, loader = private(mlp(), criterion=criterion)
    next(iter(loader))
    armed.append(True)
    with pytest.raises(error, match="injected criterion failure"):
        optimizer.step()
    assert engine.steps_taken == engine.accountant.num_steps == 1


def test_a_step_refused_by_the_budget_guard_is_neither_charged_nor_counted():
    engine, _, optimizer, loader = private(mlp(), batch_size=200, epochs=1)
    for _ in range(20):
        next(iter(loader))
        try:
            optimizer.step()
        except PrivacyBudgetExceeded:
            break
    else:
        pytest.fail("the budget guard never refused a step")
    assert engine.steps_taken == engine.accountant.num_steps == engine.planned_steps


# ---------------------------------------------------------------- 3. a model changed after make_private


def _reshape(model):
    model[2].weight.data = torch.zeros(3, 4)


def _extra_parameter(model):
    model[0].scale = nn.Parameter(torch.ones(4))


CHANGES = {
    "BatchNorm appended": (lambda m: m.append(nn.BatchNorm1d(2)), r"layer '3' added; parameter '3.weight' added"),
    "Linear replaced": (lambda m: m.__setitem__(2, nn.Linear(4, 2)), r"parameter '2.weight' was replaced"),
    "layer type changed": (lambda m: m.__setitem__(1, nn.Tanh()), r"layer '1' is now Tanh \(was ReLU\)"),
    "weight reshaped": (_reshape, r"parameter '2.weight' changed shape \[2, 4\] -> \[3, 4\]"),
    "trainable parameter added": (_extra_parameter, r"parameter '0.scale' added"),
    "layer removed": (lambda m: m.pop(2), r"layer '2' removed; parameter '2.weight' removed"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_model_changed_after_make_private_is_refused_before_the_step_is_charged(change):
    engine, model, optimizer, loader = private(mlp())
    modify, message = CHANGES[change]
    modify(model)
    before = [p.detach().clone() for p in model.parameters()]
    next(iter(loader))
    with pytest.raises(ModelError, match="the model changed after make_private: " + message):
        optimizer.step()
    assert engine.accountant.num_steps == engine.steps_taken == 0
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 2)
        self.again = self.a  # one layer reachable under two names

    def forward(self, x):
        return self.again(x) + self.a(x)


def test_mode_switches_freezing_and_tied_layers_are_no_change():
    engine, model, optimizer, loader = private(Tied())
    model.eval()
    model.train()
    model.a.bias.requires_grad_(False)
    next(iter(loader))
    optimizer.step()
    assert engine.steps_taken == 1


# ---------------------------------------------------------------- 4. make_private twice


def test_a_second_engine_on_a_private_model_or_optimizer_is_refused():
    engine, model, optimizer, _ = private(mlp())
    with pytest.raises(ConfigError, match=r"parameter '0.weight' belongs to a model already made private"):
        private(model)
    with pytest.raises(ConfigError, match="parameter '0.0.weight' belongs to a model already made private"):
        private(nn.Sequential(model))  # a wrapper around it
    with pytest.raises(ConfigError, match="this optimizer was already made private .*epsilon="):
        private(model, optimizer=optimizer.original_optimizer)
    with pytest.raises(ConfigError, match="DPOptimizer returned by make_private"):
        private(model, optimizer=optimizer)
    with pytest.raises(ConfigError, match="already made a training private"):
        engine.make_private(module=mlp(), optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1), dataset=toy(),
                            batch_size=40, epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=1.0)  # fmt: skip
    second, *_ = private(copy.deepcopy(model))  # an explicit copy is a new model
    assert second.steps_taken == 0


def test_a_refused_make_private_does_not_mark_the_model():
    model = mlp()
    with pytest.raises(ConfigError):
        private(model, epsilon=-1.0)
    engine, *_ = private(model)
    assert engine.planned_steps == 10


def test_fit_and_make_private_refuse_a_model_the_other_made_private():
    from privopt.data import Dataset

    x, y = toy(500)
    data = Dataset.from_tensors(x[:400], y[:400], x_test=x[400:], y_test=y[400:], num_classes=2)
    fit = dict(dataset=data, epsilon=1.0, delta=1e-4, accountant="rdp", insecure_seed=0, epochs=1, batch_size=100)
    _, model, *_ = private(mlp())
    with pytest.raises(ConfigError, match="belongs to a model already made private .*PrivacyEngine"):
        privopt.fit(model=model, **fit)
    model = mlp()
    with pytest.raises(ConfigError, match="delta"):
        privopt.fit(model=model, **{**fit, "delta": 0.5})  # refused before training: not marked
    record = privopt.fit(model=model, **fit)
    with pytest.raises(ConfigError, match=r"already made private \(by privopt.fit, which spent epsilon="):
        private(model)
    with pytest.raises(ConfigError, match="already made private"):
        privopt.fit(model=model, **fit)
    assert record["status"] == "finished"


def test_a_fit_that_fails_after_training_began_marks_the_model_whatever_the_error(monkeypatch):
    from privopt.algorithms.dpsgd import DPSGD
    from privopt.data import Dataset
    from privopt.errors import ModelError

    x, y = toy(500)
    data = Dataset.from_tensors(x[:400], y[:400], x_test=x[400:], y_test=y[400:], num_classes=2)
    fit = dict(dataset=data, epsilon=1.0, delta=1e-4, accountant="rdp", insecure_seed=0, epochs=1, batch_size=100)
    real_step = DPSGD.step

    def fails_late(self, t):
        if t == 2:
            raise ModelError("a privopt error type, raised after two private updates")
        return real_step(self, t)

    monkeypatch.setattr(DPSGD, "step", fails_late)
    model = mlp()
    with pytest.raises(ModelError):
        privopt.fit(model=model, **fit)
    with pytest.raises(ConfigError, match="failed or was interrupted after training began"):
        private(model)
