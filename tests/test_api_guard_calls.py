"""The DP optimizer's per-step check covers what runs when the model is called, not only its layers
and parameters: a ``forward`` replaced on a layer or its class, and a hook registered or removed
after ``make_private``, are refused at ``step()`` before anything is charged."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import privopt
from privopt.api.guards import ModelFingerprint
from privopt.errors import ModelError


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(5, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _private(model):
    x = torch.rand(400, 5, generator=torch.Generator().manual_seed(0))
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    args = dict(
        batch_size=40, epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=1.0, dataset=(x, (x[:, 0] > 0.5).long())
    )
    return engine, *engine.make_private(module=model, optimizer=optimizer, **args)


def _step(model, optimizer, batches):
    xb, yb = next(batches)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    optimizer.step()


def _refused(engine, model, optimizer, batches, match: str) -> None:
    spent = engine.steps_taken
    with pytest.raises(ModelError, match=match):
        _step(model, optimizer, batches)
    assert engine.steps_taken == spent  # nothing charged


def test_a_forward_replaced_on_a_layer_is_refused_at_step():
    engine, model, optimizer, loader = _private(Net())
    batches = iter(loader)
    _step(model, optimizer, batches)  # the DP optimizer's own hook is not a change
    real = model.fc1.forward
    model.fc1.forward = lambda x: 2 * real(x)
    _refused(engine, model, optimizer, batches, r"changed after make_private: the forward of layer 'fc1' was replaced")
    del model.fc1.forward  # put back: the loop goes on
    _step(model, optimizer, batches)
    assert engine.steps_taken == 2


def test_a_forward_replaced_on_the_class_is_refused(monkeypatch):
    engine, model, optimizer, loader = _private(Net())
    batches = iter(loader)
    monkeypatch.setattr(Net, "forward", lambda self, x: self.fc2(torch.tanh(self.fc1(x))))
    _refused(engine, model, optimizer, batches, r"the forward of the model's class was replaced")


@pytest.mark.parametrize(
    ("register", "said"),
    [
        (
            lambda m: m.register_forward_hook(lambda mod, args, out: out * 2),
            "a forward hook was registered on the model",
        ),
        (
            lambda m: m.fc2.register_forward_pre_hook(lambda mod, args: None),
            "a forward pre-hook was registered on layer 'fc2'",
        ),
        (
            lambda m: m.fc1.register_full_backward_hook(lambda mod, gi, go: None),
            "a backward hook was registered on layer 'fc1'",
        ),
    ],
    ids=["forward", "forward-pre", "backward"],
)
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_a_hook_registered_after_make_private_is_refused(register, said):
    engine, model, optimizer, loader = _private(Net())
    batches = iter(loader)
    handle = register(model)
    _refused(engine, model, optimizer, batches, said)
    handle.remove()
    _step(model, optimizer, batches)
    assert engine.steps_taken == 1


def test_a_hook_registered_before_make_private_is_kept():
    model = Net()
    model.fc1.register_forward_hook(lambda mod, args, out: out)
    engine, model, optimizer, loader = _private(model)
    _step(model, optimizer, iter(loader))
    assert engine.steps_taken == 1


def test_removing_the_optimizers_own_hook_is_a_change_too():
    engine, model, optimizer, loader = _private(Net())
    optimizer._hook.remove()  # it guards against gradient accumulation
    _refused(engine, model, optimizer, iter(loader), "a forward hook was removed from the model")


def test_a_hook_on_every_module_is_refused():
    engine, model, optimizer, loader = _private(Net())
    handle = torch_module.register_module_forward_hook(lambda mod, args, out: out)
    try:
        _refused(engine, model, optimizer, iter(loader), r"a hook on every module was registered or removed")
    finally:
        handle.remove()


def test_the_check_reads_no_tensor():
    """Attribute reads only, O(layers + parameters): a model on the meta device (its tensors hold
    no values to read) is checked as any other."""
    with torch.device("meta"):
        model = Net()
    fingerprint = ModelFingerprint(model)
    fingerprint.check(model)
    model.fc2.register_forward_hook(lambda mod, a, out: out)
    with pytest.raises(ModelError, match="a forward hook was registered on layer 'fc2'"):
        fingerprint.check(model)
