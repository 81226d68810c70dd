"""Small group datasets and hand-built run contexts for the worst-group tests."""

import torch
from torch import nn

from privopt.algorithms.base import RunContext
from privopt.data import load_dataset
from privopt.grads import get_engine
from privopt.models import build_model
from privopt.rng import TorchSource


def tiny_groups(*, n=400, seed=0, fractions=(0.5, 0.3, 0.2)):
    return load_dataset(
        "synthetic-groups", seed=seed, num_groups=len(fractions), dim=4, n_train=n, n_test_per_group=100,
        group_fractions=list(fractions),
    )  # fmt: skip


def ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def make_ctx(data, *, model="logreg", x=None, y=None, groups=None, seed=0):
    """A non-private RunContext (no ledger, no noise) over ``data`` or the given tensors."""
    x = data.x_train if x is None else x
    y = data.y_train if y is None else y
    torch.manual_seed(seed)
    net = build_model(model, input_shape=tuple(x.shape[1:]), num_classes=2, seed=seed)
    extra = {"dataset": data} if groups is None else {"groups": groups, "num_groups": data.num_groups}
    ctx = RunContext(
        model=net, loss_fn=ce, x_train=x, y_train=y, engine=get_engine("vmap"), ledger=None, noise={},
        noise_rng=TorchSource(seed=seed + 1), sampler_rng=TorchSource(seed=seed + 2), extra=extra,
    )  # fmt: skip
    return ctx, data
