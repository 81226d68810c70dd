"""Model registry: ``build_model(name, input_shape=..., num_classes=...)``.

Every registered model is checked with :func:`privopt.grads.validate.validate_model` (no layer
that mixes samples, e.g. BatchNorm) before it is returned, so any model obtained here is usable
with per-sample gradient clipping.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from torch import nn

from privopt.errors import ConfigError, ModelError
from privopt.registry import Registry

__all__ = ["register_model", "available_models", "build_model", "count_parameters"]

_MODELS: Registry[Callable[..., nn.Module]] = Registry("model")


def register_model(name: str) -> Callable:
    """Decorator registering ``factory(*, input_shape, num_classes, **kw) -> nn.Module`` as ``name``.

    A factory of another signature is refused here (``ConfigError``), not when a run builds it: it
    must take ``input_shape`` and ``num_classes`` by keyword and its options keyword-only (after
    ``*``), which is how ``model_params`` reach it.
    """
    register = _MODELS.register_as(name)

    def deco(factory: Callable) -> Callable:
        _check_factory(name, factory)
        return register(factory)

    return deco


def _check_factory(name: str, factory: Callable) -> None:
    want = f"model {name!r}: the factory must be `def f(*, input_shape, num_classes, <options>=...)`"
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        raise ConfigError(f"{want}, got {factory!r}") from None
    kinds = {p: v.kind for p, v in params.items()}
    takes_any = inspect.Parameter.VAR_KEYWORD in kinds.values()
    missing = [p for p in ("input_shape", "num_classes") if p not in kinds and not takes_any]
    free = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    by_name = inspect.Parameter.POSITIONAL_OR_KEYWORD  # fine for the two the loop passes by keyword
    bad = [p for p, k in kinds.items() if k not in free and not (p in ("input_shape", "num_classes") and k is by_name)]
    if missing or bad:
        why = f"missing {missing}" if missing else f"{bad} not keyword-only (put them after `*`)"
        raise ConfigError(f"{want}; {why}")


def available_models() -> list[str]:
    """Names accepted by :func:`build_model`."""
    _ensure_builtin()
    return list(_MODELS.names())


def _ensure_builtin() -> None:
    import privopt.models.resnet
    import privopt.models.simple  # noqa: F401


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int | None = None,
    **kw,
) -> nn.Module:
    """Build a registered model.

    Args:
        name: one of :func:`available_models` (``logreg``, ``mlp``, ``cnn``, ``resnet20``).
        input_shape: shape of one example, e.g. ``(1, 28, 28)`` or ``(54,)`` (``Dataset.input_shape``).
        num_classes: number of outputs (pass 1 for a single-logit binary model).
        seed: if given, parameters are initialised under ``torch.manual_seed(seed)`` without
            touching the global RNG state; otherwise the global torch RNG is used (so
            ``torch.manual_seed`` before the call also makes the initialisation deterministic).
        **kw: model-specific options (e.g. ``hidden=128`` for ``mlp``, ``groups=16`` for ``resnet20``).

    Raises:
        ConfigError: unknown model, unknown option or invalid shape.

    Example:
        >>> import torch
        >>> m = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, seed=0)
        >>> m(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """
    _ensure_builtin()
    factory = _MODELS.lookup(name)
    shape = tuple(input_shape)
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ConfigError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    params = inspect.signature(factory).parameters
    allowed = {p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY} - {
        "input_shape",
        "num_classes",
    }
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown} for model {name!r}; its options: {', '.join(sorted(allowed)) or 'none'}"
        )
    if seed is None:
        model = factory(input_shape=shape, num_classes=num_classes, **kw)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = factory(input_shape=shape, num_classes=num_classes, **kw)
    from privopt.grads.validate import validate_model

    validate_model(model)
    return model


def _require_image(name: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise ConfigError(f"model {name!r} needs image input_shape (C, H, W), got {shape}")
    return shape  # type: ignore[return-value]


def _check_groups(channels: int, groups: int, where: str) -> int:
    g = min(groups, channels)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or channels % g:
        raise ModelError(f"GroupNorm groups={groups!r} must divide the {channels} channels of {where}")
    return g
