"""Small models: logistic regression, a one-hidden-layer MLP and a compact CNN.

Initialisation (docs/models.md): Kaiming (He) weights for ReLU layers and zero biases; the linear
model starts at zero (a common, seed-free starting point for convex problems such as DP-ERM on
Covertype).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from privopt.errors import ConfigError
from privopt.models.pooling import MaxPool2d
from privopt.models.registry import _check_groups, _require_image, register_model


def _kaiming(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class AppendConstant(nn.Module):
    """Appends a column holding the public constant ``value`` to flat inputs ``[B, d] -> [B, d + 1]``.

    With a bias-free ``Linear(d + 1, k)`` after it, the last weight column ``w`` acts as a bias
    ``value * w``: the same function as ``Linear(d, k)`` with a bias scaled by ``value``, whose
    per-sample gradients every engine computes exactly (an ordinary Linear layer).
    """

    def __init__(self, value: float):
        super().__init__()
        self.value = float(value)

    def forward(self, x):
        return torch.cat([x, x.new_full((x.shape[0], 1), self.value)], dim=1)

    def extra_repr(self) -> str:
        return f"value={self.value:g}"


@register_model("logreg")
def logreg(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    bias: bool = True,
    zero_init: bool = True,
    bias_scale: float = 1.0,
    single_logit: bool = False,
) -> nn.Module:
    """Linear model on the flattened input (multinomial / binary logistic regression).

    ``single_logit`` (two classes only): one output, the logit of class 1, for ``loss: logistic``;
    with ``bias=false`` it is the ``Linear(d, 1, bias=False)`` of the linear ERM algorithms
    (``dp-svrg``, ``dp-svrg-pp``, ``dp-gd-erm``, ``dp-amd``).

    ``bias_scale`` = s ≠ 1 reparametrises the bias as ``s·b`` (a public constant; the function class
    is unchanged): the model appends the constant s to every input and trains a bias-free Linear.
    Under per-sample clipping the bias's gradient, and the noise it receives relative to the
    logit, grow with ``s``. On the mnist-st scattering head no s in 0.25–64 beat s = 1
    (``docs/models.md``; ``docs/results/dro-history.md``, "Phase 10").

    Example:
        >>> m = logreg(input_shape=(3,), num_classes=2, bias_scale=8.0)
        >>> m[-1].weight.shape, m[-1].bias is None
        (torch.Size([2, 4]), True)
    """
    for key, flag in (("bias", bias), ("zero_init", zero_init), ("single_logit", single_logit)):
        if not isinstance(flag, bool):
            raise ConfigError(f"logreg {key} must be true or false, got {flag!r}")
    if (
        isinstance(bias_scale, bool)
        or not isinstance(bias_scale, (int, float))
        or not (math.isfinite(bias_scale) and bias_scale > 0)
    ):
        raise ConfigError(f"logreg bias_scale must be a finite number > 0, got {bias_scale!r}")
    if bias_scale != 1.0 and not bias:
        raise ConfigError("logreg bias_scale needs bias=true (it scales the bias)")
    if single_logit and num_classes != 2:
        raise ConfigError(f"logreg single_logit needs a two-class dataset, got {num_classes} classes")
    d = math.prod(input_shape)
    scaled = bias and bias_scale != 1.0
    lin = nn.Linear(d + scaled, 1 if single_logit else num_classes, bias=bias and not scaled)
    if zero_init:
        nn.init.zeros_(lin.weight)
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)
    layers: list[nn.Module] = [nn.Flatten()] if len(input_shape) > 1 else []
    return nn.Sequential(*layers, *([AppendConstant(bias_scale)] if scaled else []), lin)


@register_model("mlp")
def mlp(*, input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> nn.Module:
    """Flatten -> Linear(d, hidden) -> ReLU -> Linear(hidden, classes) (101,770 params on MNIST; docs/models.md)."""
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ConfigError(f"mlp hidden must be a positive integer, got {hidden!r}")
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )
    _kaiming(net)
    return net


@register_model("cnn")
def cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, int] = (16, 32),
    groups: int = 4,
    norm: str = "group",
) -> nn.Module:
    """Two 3x3 conv blocks (conv -> GroupNorm -> ReLU -> 2x2 max-pool), then a linear classifier.

    About 21k parameters on 28x28x1 (26k on 32x32x3) with the defaults; fast on CPU. ``norm="none"`` drops GroupNorm.
    """
    c, h, w = _require_image("cnn", input_shape)
    if norm not in ("group", "none"):
        raise ConfigError(f"cnn norm={norm!r} unknown; use 'group' or 'none'")
    if h < 4 or w < 4:
        raise ConfigError(f"cnn needs images of at least 4x4 (two 2x2 poolings), got {h}x{w}")
    layers: list[nn.Module] = []
    cin = c
    for cout in channels:
        layers.append(nn.Conv2d(cin, cout, 3, padding=1))
        if norm == "group":
            layers.append(nn.GroupNorm(_check_groups(cout, groups, f"a {cout}-channel conv"), cout))
        layers += [nn.ReLU(), MaxPool2d(2)]  # torch's fast CPU kernels (models/pooling.py)
        cin = cout
    layers += [nn.Flatten(), nn.Linear(cin * (h // 4) * (w // 4), num_classes)]
    net = nn.Sequential(*layers)
    _kaiming(net)
    return net
