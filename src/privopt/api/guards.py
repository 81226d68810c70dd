"""Misuse guards of :meth:`privopt.PrivacyEngine.make_private` and its DP optimizer.

* :class:`ModelFingerprint`: the module structure, parameters, forward methods and hooks as
  ``make_private`` checked them; ``step()`` refuses a model changed since (a layer added or replaced,
  a parameter added, removed, replaced or reshaped, ``forward`` replaced on a layer or its class, a
  hook registered or removed), before anything is charged. O(modules + parameter tensors) attribute
  reads per step, no tensor values read.
* :class:`AccumulationGuard`: a forward hook that makes a ``loss.backward()`` on a second
  batch before ``step()`` / ``zero_grad()`` (gradient accumulation) fail in that ``backward()``.
* :func:`claim` / :func:`check_unclaimed`: a module (or a parameter of it) and an optimizer made
  private once cannot be made private again by another engine, whose fresh budget would hide
  the ε already spent on them.

See ``docs/api.md``, "Rules of the loop".
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from privopt.errors import ConfigError, ModelError

__all__ = ["ACCUMULATION", "AGAIN", "AccumulationGuard", "ModelFingerprint", "check_unclaimed", "claim"]

ACCUMULATION = (
    "loss.backward() on a new batch while the gradient of an earlier batch is still pending (no "
    "optimizer.step() or optimizer.zero_grad() in between): gradient accumulation over several batches is not "
    "supported. step() releases the clipped gradient of the last batch only, and each Poisson batch is a separate "
    "sampled query the noise was calibrated for. For a larger effective batch pass a larger batch_size= to "
    "make_private (the noise is calibrated for it), with max_physical_batch_size= if memory is the limit (the "
    "clipped sum of each batch is then computed in chunks), and call optimizer.step() once per batch"
)


def _changes(before: dict[str, Any], after: dict[str, Any], *, what: str, same: Callable[[Any, Any], str]) -> list:
    """What differs between two name -> entry maps: added, removed, and ``same(old, new)`` messages."""
    out = [f"{what} {n!r} added" for n in after if n not in before]
    out += [f"{what} {n!r} removed" for n in before if n not in after]
    out += [f"{what} {n!r} {d}" for n in before if n in after for d in [same(before[n], after[n])] if d]
    return out


def _module_change(old: type, new: type) -> str:
    return "" if old is new else f"is now {new.__name__} (was {old.__name__})"


def _param_change(old: tuple[nn.Parameter, tuple], new: tuple[nn.Parameter, tuple]) -> str:
    if old[0] is not new[0]:
        return "was replaced by another tensor"
    return "" if old[1] == new[1] else f"changed shape {list(old[1])} -> {list(new[1])}"


def _walk(module: nn.Module) -> tuple[list, list]:
    """Every module and parameter object once, in a fixed order (no names built: this runs every step)."""
    modules, params, stack, seen = [], [], [module], set()
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:  # a child slot set to None; a module shared (or in a cycle)
            continue
        seen.add(id(m))
        modules.append(m)
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:  # a parameter shared by two layers (tied weights)
                seen.add(id(p))
                params.append(p)
        stack.extend(reversed(m._modules.values()))
    return modules, params


# A layer's hooks, by handle id, and what an error calls them; torch's hooks on every module.
_HOOKS = {
    "_forward_pre_hooks": "forward pre-hook",
    "_forward_hooks": "forward hook",
    "_backward_pre_hooks": "backward pre-hook",
    "_backward_hooks": "backward hook",
}
_GLOBAL_HOOKS = tuple(f"_global{k}" for k in _HOOKS)  # torch.nn.modules.module.register_module_*_hook


def _calls(modules: list[nn.Module]) -> list[tuple]:
    """What runs when each layer is called: its ``forward`` (replaced on the instance, or its class's)
    and the handle ids of its hooks. Attribute reads only, as :func:`_walk`."""
    return [  # spelled out: a generator per layer would double the cost of the check
        (
            own.get("forward"),
            getattr(type(m), "forward", None),
            tuple(own.get("_forward_pre_hooks", ())),
            tuple(own.get("_forward_hooks", ())),
            tuple(own.get("_backward_pre_hooks", ())),
            tuple(own.get("_backward_hooks", ())),
        )
        for m in modules
        for own in (m.__dict__,)
    ]


def _global_hooks() -> tuple:
    return tuple(tuple(getattr(torch_module, k, ())) for k in _GLOBAL_HOOKS)


def _call_changes(names: list[str], before: list[tuple], after: list[tuple]) -> list[str]:
    out = []
    for name, old, new in zip(names, before, after):
        where = f"layer {name!r}" if name else "the model"
        if old[0] != new[0]:
            out.append(f"the forward of {where} was replaced on the instance")
        if old[1] != new[1]:
            out.append(f"the forward of {where}'s class was replaced")
        for kind, o, n in zip(_HOOKS.values(), old[2:], new[2:]):
            out += [f"a {kind} was registered on {where}"] * len(set(n) - set(o))
            out += [f"a {kind} was removed from {where}"] * len(set(o) - set(n))
    return out


class ModelFingerprint:
    """The module's layers and parameters at ``make_private``: each one's name, the object itself,
    and its type or shape, in :func:`_walk`'s order; each layer's ``forward`` and hooks
    (:func:`_calls`), and torch's hooks on every module.

    Holds the objects themselves (the module holds them anyway), so a replaced one is never
    mistaken for its replacement by a reused ``id``. ``requires_grad`` is not part of it:
    freezing a parameter later is allowed (it gets no released gradient). Taken after the DP
    optimizer registered its own hook (:class:`AccumulationGuard`).
    """

    def __init__(self, module: nn.Module):
        modules, params = _walk(module)
        module_names = {id(m): name for name, m in module.named_modules()}
        param_names = {id(p): name for name, p in module.named_parameters()}
        self._modules = [(module_names[id(m)], m, type(m)) for m in modules]
        self._params = [(param_names[id(p)], p, tuple(p.shape)) for p in params]
        self._calls, self._global = _calls(modules), _global_hooks()

    def _same_layers(self, modules: list, params: list) -> bool:
        if len(modules) != len(self._modules) or len(params) != len(self._params):
            return False
        return all(m is old for m, (_, old, _) in zip(modules, self._modules)) and all(
            p is old and p.shape == shape for p, (_, old, shape) in zip(params, self._params)
        )

    def check(self, module: nn.Module) -> None:
        """Raise ``ModelError`` naming every change since ``make_private`` (cheap when there is none)."""
        modules, params = _walk(module)
        if self._same_layers(modules, params):
            calls, hooks = _calls(modules), _global_hooks()
            if calls == self._calls and hooks == self._global:
                return
            changes = _call_changes([name for name, _, _ in self._modules], self._calls, calls)
            if hooks != self._global:
                changes.append("a hook on every module was registered or removed (register_module_*_hook)")
        else:
            changes = self._layer_changes(module)
        raise ModelError(
            f"the model changed after make_private: {'; '.join(changes) or 'its layers were moved'}. Its "
            "per-example gradients, clipping and optimizer were checked for the model as it was; build the final "
            "model first (its layers, forward and hooks), then call make_private (nothing was charged for this step)"
        )

    def _layer_changes(self, module: nn.Module) -> list[str]:
        old_modules = {name: cls for name, _, cls in self._modules}
        changes = _changes(
            old_modules, {n: type(m) for n, m in module.named_modules()}, what="layer", same=_module_change
        )
        old = {name: (p, shape) for name, p, shape in self._params}
        new = {n: (p, tuple(p.shape)) for n, p in module.named_parameters()}
        return changes + _changes(old, new, what="parameter", same=_param_change)


class AccumulationGuard:
    """Forward hook on the private module: hooks the output so ``backward()`` reports to the optimizer.

    Holds the optimizer weakly, and pickles / deep-copies as a no-op hook, so a saved or copied
    model carries no reference to the optimizer (nor to its secret noise source).
    """

    def __init__(self, optimizer: Any = None):
        self._optimizer = None if optimizer is None else weakref.ref(optimizer)

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        opt = None if self._optimizer is None else self._optimizer()
        # The forward passes of step() itself (the gradient engine's) are not the user's.
        if opt is None or opt._in_step or not torch.is_grad_enabled():
            return
        if isinstance(output, Mapping):
            outputs = list(output.values())
        else:
            outputs = output if isinstance(output, (tuple, list)) else (output,)
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(opt._on_backward)

    def __reduce__(self) -> tuple:
        return (AccumulationGuard, ())


# Modules and optimizers made private, with a description of the ε spent on them. Weak keys: a
# model that is garbage collected is forgotten; the values never reference the keys.
_CLAIMED_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CLAIMED_OPTIMIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def claim(module: nn.Module, optimizer: Any, spent: Callable[[], str]) -> None:
    """Mark ``module`` and ``optimizer`` as made private; ``spent()`` describes the ε spent on them."""
    _CLAIMED_MODULES[module] = spent
    if optimizer is not None:
        _CLAIMED_OPTIMIZERS[optimizer] = spent


AGAIN = (
    "a second PrivacyEngine would start a fresh budget, while the ε already spent on this model adds up with it. "
    "Keep training with the first engine's optimizer and loader (iterating beyond the planned epochs is allowed "
    "until its budget guard stops), or start from a fresh model (to go on training on other data, make_private a "
    "copy.deepcopy of this one, knowing that the two ε add up for records the two trainings share)"
)


def check_unclaimed(module: nn.Module, optimizer: Any) -> None:
    """Raise ``ConfigError`` if ``module`` shares a parameter with a module made private, or
    ``optimizer`` was made private, naming what and the ε spent on it."""
    if optimizer is not None and optimizer in _CLAIMED_OPTIMIZERS:
        raise ConfigError(f"this optimizer was already made private ({_CLAIMED_OPTIMIZERS[optimizer]()}): {AGAIN}")
    claimed = {id(p): spent for m, spent in list(_CLAIMED_MODULES.items()) for p in m.parameters()}
    for name, p in module.named_parameters():
        if id(p) in claimed:
            raise ConfigError(
                f"the module's parameter {name!r} belongs to a model already made private ({claimed[id(p)]()}): {AGAIN}"
            )
