"""Small models: logistic regression, a one-hidden-layer MLP and a compact CNN.

Initialisation (docs/models.md): Kaiming (He) weights for ReLU layers and zero biases; the linear
model starts at zero (a common, seed-free starting point for convex problems such as DP-ERM on
Covertype).
"""

from __future__ import annotations

import math

from torch import nn

from privopt.errors import ConfigError
from privopt.models.registry import _check_groups, _require_image, register_model


def _kaiming(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


@register_model("logreg")
def logreg(*, input_shape: tuple[int, ...], num_classes: int, bias: bool = True, zero_init: bool = True) -> nn.Module:
    """Linear model on the flattened input (multinomial / binary logistic regression)."""
    for key, flag in (("bias", bias), ("zero_init", zero_init)):
        if not isinstance(flag, bool):
            raise ConfigError(f"logreg {key} must be true or false, got {flag!r}")
    d = math.prod(input_shape)
    lin = nn.Linear(d, num_classes, bias=bias)
    if zero_init:
        nn.init.zeros_(lin.weight)
        if bias:
            nn.init.zeros_(lin.bias)
    return nn.Sequential(nn.Flatten(), lin) if len(input_shape) > 1 else nn.Sequential(lin)


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
        layers += [nn.ReLU(), nn.MaxPool2d(2)]
        cin = cout
    layers += [nn.Flatten(), nn.Linear(cin * (h // 4) * (w // 4), num_classes)]
    net = nn.Sequential(*layers)
    _kaiming(net)
    return net
