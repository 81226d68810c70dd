"""Torch loss modules as make_private's criterion: element-wise ones (nn.MSELoss, nn.L1Loss,
nn.HuberLoss, nn.BCEWithLogitsLoss) give one loss per output element with reduction="none"; each
example's are reduced as the module's own reduction would (mean, or sum), so the standard
regression setup works. Targets that torch would broadcast across examples are refused.

Regression test: ``criterion=nn.MSELoss()`` with a [B, 1] output and [B, 1] targets was refused
with "the loss must return one value per example (reduction='none'), got shape (2, 1)".
"""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import privopt
from privopt.api import per_sample_loss
from privopt.errors import ModelError
from privopt.grads.release import insecure_scale_noise_for_testing, observe_releases

N = 200


def data(k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=g)
    return x, torch.randn(N, k, generator=g)


def released_and_reference(criterion, reference, *, k=1, targets=None):
    """The released gradient of one step with the noise off, and a per-example autograd loop of
    ``reference`` (a per-example loss written by hand) on the same batch."""
    x, y = data(k)
    y = y if targets is None else targets(y)
    model = nn.Linear(6, k)
    engine = privopt.PrivacyEngine(insecure_seed=0, accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=(x, y), batch_size=20,
        epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=0.1, criterion=criterion,
    )  # fmt: skip
    xb, yb = next(iter(loader))
    expected = torch.zeros(sum(p.numel() for p in model.parameters()))
    for i in range(len(yb)):
        g = torch.autograd.grad(reference(model(xb[i : i + 1]), yb[i : i + 1]).sum(), list(model.parameters()))
        g = torch.cat([t.reshape(-1) for t in g])
        expected += g * min(1.0, 0.1 / float(g.norm()))
    seen = []
    with pytest.warns(RuntimeWarning), observe_releases(seen.append), insecure_scale_noise_for_testing(0.0):
        optimizer.step()
    return seen[0].value, expected / 20


@pytest.mark.parametrize(
    "criterion, reference, k",
    [
        (nn.MSELoss(), lambda o, t: F.mse_loss(o, t, reduction="none").mean(1), 1),
        (nn.MSELoss(), lambda o, t: F.mse_loss(o, t, reduction="none").mean(1), 3),
        (nn.MSELoss(reduction="sum"), lambda o, t: F.mse_loss(o, t, reduction="none").sum(1), 3),
        (nn.L1Loss(), lambda o, t: F.l1_loss(o, t, reduction="none").mean(1), 3),
        (nn.HuberLoss(delta=0.5), lambda o, t: F.huber_loss(o, t, reduction="none", delta=0.5).mean(1), 3),
    ],
    ids=["mse-1", "mse-3", "mse-sum-3", "l1-3", "huber-3"],
)
def test_an_element_wise_loss_module_is_reduced_per_example(criterion, reference, k):
    released, expected = released_and_reference(criterion, reference, k=k)
    assert torch.allclose(released, expected, atol=1e-6)


def test_bce_with_logits_on_one_output_and_float_labels():
    released, expected = released_and_reference(
        nn.BCEWithLogitsLoss(),
        lambda o, t: F.binary_cross_entropy_with_logits(o, t, reduction="none").mean(1),
        targets=lambda y: (y > 0).float(),
    )
    assert torch.allclose(released, expected, atol=1e-6)


def test_targets_broadcast_across_examples_are_refused_by_make_private():
    """[B, 1] outputs against [B] targets broadcast to [B, B] in torch: each example's loss would
    read every other example's target, so per-example clipping would not bound a record."""
    x, y = data(1)
    model = nn.Linear(6, 1)
    with pytest.raises(ModelError, match=r"broadcast|shape"):
        privopt.PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=(x, y[:, 0]),
            batch_size=20, epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=0.1, criterion=nn.MSELoss(),
        )  # fmt: skip


def test_a_cross_entropy_module_is_unchanged_and_the_callers_module_keeps_its_reduction():
    ce = nn.CrossEntropyLoss(label_smoothing=0.1)
    loss = per_sample_loss(ce)
    out, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 1, 0])
    assert torch.allclose(loss(out, y), F.cross_entropy(out, y, reduction="none", label_smoothing=0.1))
    assert ce.reduction == "mean"
