"""Audit of privopt.PrivacyEngine: what the optimizer may update, empty batches, early target checks,
and per-example clipping on the API path (frozen, unused parameters, several param groups)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import privopt
from privopt.errors import ConfigError, ModelError
from privopt.grads.release import insecure_scale_noise_for_testing, observe_releases


def toy(n=400, d=5):
    x = torch.rand(n, d, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0.5).long()


def private(model, *, optimizer=None, data=None, **over):
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=1)
    args = dict(batch_size=40, epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=1.0)
    args.update(over)
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.5)
    return engine, *engine.make_private(module=model, optimizer=optimizer, dataset=data or toy(), **args)


def test_a_parameter_added_to_the_optimizer_later_never_gets_a_non_private_update():
    engine, model, optimizer, loader = private(nn.Linear(5, 2))
    head = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="not a parameter of the module"):
        optimizer.add_param_group({"params": head.parameters()})
    optimizer.original_optimizer.param_groups.append({**optimizer.defaults, "params": list(head.parameters())})
    xb, yb = next(iter(loader))
    nn.functional.cross_entropy(head(model(xb)), yb).backward()  # a non-private gradient on the head
    before = head.weight.detach().clone()
    with pytest.raises(ConfigError, match="not a parameter of the module"):
        optimizer.step()
    assert torch.equal(head.weight, before) and engine.accountant.num_steps == 0, "refused before anything"
    optimizer.original_optimizer.param_groups.pop()
    optimizer.step()  # the batch was not consumed by the refused step
    assert engine.steps_taken == engine.accountant.num_steps == 1


def test_a_parameter_frozen_after_make_private_is_not_updated_by_its_backward_gradient():
    engine, model, optimizer, loader = private(nn.Linear(5, 2))
    xb, yb = next(iter(loader))
    nn.functional.cross_entropy(model(xb), yb).backward()
    model.bias.requires_grad_(False)  # its .grad still holds the non-private gradient
    bias, weight = model.bias.detach().clone(), model.weight.detach().clone()
    optimizer.step()
    assert torch.equal(model.bias, bias) and model.bias.grad is None
    assert not torch.equal(model.weight, weight) and engine.accountant.num_steps == 1


def test_an_empty_batch_is_released_in_the_dtype_of_a_non_empty_one():
    """A float64 model: float32 noise in an empty batch's release would reveal its size 0."""
    x, y = toy()
    _, _, optimizer, loader = private(nn.Linear(5, 2).double(), data=(x.double(), y), batch_size=1, epochs=0.05)
    seen, sizes = [], []
    with observe_releases(seen.append):
        for _, yb in loader:
            sizes.append(len(yb))
            optimizer.step()
    assert 0 in sizes and any(sizes)
    assert {event.value.dtype for event in seen} == {torch.float64}


@pytest.mark.parametrize("bad_class", [7, -1])
def test_a_class_id_beyond_the_outputs_anywhere_in_the_data_is_refused_before_training(bad_class):
    x, y = toy()
    y[123] = bad_class  # not among the two first records
    with pytest.raises(ModelError, match="the loss cannot take the model's outputs"):
        private(nn.Linear(5, 2), data=(x, y))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.frozen, self.b, self.unused = nn.Linear(5, 4), nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(3, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.tanh(self.frozen(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("engine_name", ["auto", "vmap"])
def test_api_clipped_sum_equals_a_per_example_loop_with_frozen_unused_params_and_two_groups(engine_name):
    torch.manual_seed(0)
    model = Net()
    reference = Net()
    reference.load_state_dict(model.state_dict())
    groups = [{"params": [*model.a.parameters(), *model.unused.parameters()], "lr": 0.1}]
    groups.append({"params": list(model.b.parameters()), "lr": 0.3})
    engine = privopt.PrivacyEngine(accountant="rdp", insecure_seed=0, engine=engine_name)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(groups), dataset=toy(), batch_size=40, epochs=1, epsilon=2.0,
        delta=1e-4, max_grad_norm=0.05,
    )  # fmt: skip
    xb, yb = next(iter(loader))
    seen = []
    with observe_releases(seen.append), pytest.warns(RuntimeWarning), insecure_scale_noise_for_testing(0.0):
        optimizer.step()
    params = [p for p in reference.parameters() if p.requires_grad]
    expected = torch.zeros(sum(p.numel() for p in params))
    for i in range(len(yb)):
        loss = nn.functional.cross_entropy(reference(xb[i : i + 1]), yb[i : i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        g = torch.cat([(torch.zeros_like(p) if d is None else d).reshape(-1) for d, p in zip(grads, params)])
        expected += g * min(1.0, 0.05 / float(g.norm()))
    assert len(yb) > 0 and torch.allclose(seen[0].value, expected / 40, atol=1e-7)


def test_an_empty_batch_sum_has_the_dtype_and_device_of_a_full_one():
    from privopt.grads import get_engine
    from privopt.grads.flat import zero_flat

    model = torch.nn.Linear(4, 3).double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    loss = lambda out, t: torch.nn.functional.cross_entropy(out, t, reduction="none")
    full = get_engine("vmap").clipped_sum(model, loss, x, y, clip=1.0).total
    empty = zero_flat(model)
    assert (empty.dtype, empty.device, empty.shape) == (full.dtype, full.device, full.shape)
    assert not empty.any()
