"""Fingerprints a resume checks: the data, the model, a custom loss, and the code that computes the sums.

A resumed run replays the interrupted run's noise, so it must compute the same sums: the same data,
the same model (structure, settings, code), loss, algorithm and gradient engine. Every fingerprint
here is SECRET when it covers data (a data hash lets anyone test a guess of the whole dataset) and
is kept only in the checkpoint (:mod:`privopt.training.resume`). Code is read from its source when
Python can find it, and always from its bytecode, names, constants, defaults and captured values,
so the fingerprints of code are comparable within one Python minor version only (a resume checks
it). A user's function (not privopt's, torch's or NumPy's) is covered with the module-level values
it reads by name: numbers, strings, tuples, untrained tensors, arrays and functions. Best effort: what it
reads through a module or an object (``config.SCALE``, a dict's entries) is not covered.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any

import torch
from torch import nn

__all__ = ["code_fingerprint", "data_fingerprint", "loss_fingerprint", "metrics_fingerprint", "model_fingerprint"]

_SPLITS = ("x_train", "y_train", "g_train", "x_val", "y_val", "g_val", "x_test", "y_test", "g_test")
# nn.Module's own bookkeeping (parameters, buffers, submodules, hooks) and the train/eval flag,
# which the run sets itself: every other instance attribute is the user's setting.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"training"}
# The hooks a user may leave on a module (privopt's engines remove theirs after each use).
_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_LIBRARY_MODULES = ("torch", "typing", "abc", "collections", "numpy")  # their code: the versions checked
_NOT_USER_CODE = (*_LIBRARY_MODULES, "privopt")
_MISSING = object()


def _digest(parts: list[Any]) -> str:
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\x00")
    return h.hexdigest()


def data_fingerprint(data: Any) -> str:
    """Hash of every split's values, shapes and dtypes (SECRET: identifies the training data), and
    of the number of groups: the worst-group algorithms size their draws and weights by it."""
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((data.num_classes, tuple(data.input_shape))).encode())
    groups = int(getattr(data, "num_groups", 0) or 0)
    if groups:  # only for data with groups: the fingerprints of other data are unchanged
        h.update(repr(("num_groups", groups)).encode())
    for name in _SPLITS:
        t = getattr(data, name, None)
        h.update(name.encode())
        if t is not None:
            h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        if t is not None and t.numel():
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _code_parts(code: Any) -> list[Any]:
    """A code object's bytecode, names and constants, nested code objects included."""
    parts: list[Any] = [code.co_code, code.co_names, code.co_varnames]
    for c in code.co_consts:
        parts += _code_parts(c) if hasattr(c, "co_code") else [_const_repr(c)]
    return parts


def _const_repr(c: Any) -> str:
    """A constant's repr, the same in every process: ``x in {"a", "b"}`` compiles to a frozenset,
    whose order (and repr) depends on the process's string hash seed."""
    if isinstance(c, frozenset):
        return "frozenset(" + repr(sorted(_const_repr(x) for x in c)) + ")"
    if isinstance(c, tuple):
        return "(" + ", ".join(_const_repr(x) for x in c) + ")"
    return repr(c)


def _value_parts(v: Any, depth: int = 0) -> list[Any]:
    if isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        return [str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()]
    if isinstance(v, (str, int, float, bool, bytes, type(None), torch.dtype)):
        return [repr(v)]
    if hasattr(v, "tobytes") and hasattr(v, "dtype") and hasattr(v, "shape"):  # a NumPy array
        return [str(v.dtype), tuple(v.shape), v.tobytes()]
    if depth < 3 and isinstance(v, (list, tuple)):
        return [len(v), *(x for item in v for x in _value_parts(item, depth + 1))]
    if isinstance(v, nn.Module):  # e.g. the trained model itself: its architecture, not its weights
        return [type(v).__qualname__, repr(v)]
    if depth < 3 and callable(v) and not isinstance(v, type):
        return _callable_parts(v, depth + 1)
    if isinstance(v, type):
        return [v.__module__ + "." + v.__qualname__]
    return [type(v).__module__ + "." + type(v).__qualname__]


def _callable_parts(fn: Any, depth: int = 0) -> list[Any]:
    if isinstance(fn, nn.Module):
        state = [x for t in fn.state_dict().values() for x in _value_parts(t)]
        return [type(fn).__qualname__, repr(fn), *state]
    if isinstance(fn, functools.partial):
        return [
            "partial",
            *_callable_parts(fn.func, depth),
            *_value_parts((fn.args, tuple(sorted(fn.keywords.items())))),
        ]
    code = getattr(fn, "__code__", None)
    if code is None:  # a builtin or another callable: its name
        return [getattr(fn, "__module__", ""), getattr(fn, "__qualname__", type(fn).__qualname__)]
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c) and c.cell_contents is not fn]
    parts = [*_code_parts(code), *_value_parts(tuple(fn.__defaults__ or ()), depth), *_value_parts(tuple(cells), depth)]
    return parts + _global_parts(fn, code, depth)


def _names(code: Any) -> set[str]:
    """Every name a code object and the functions nested in it look up (globals among them)."""
    out = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            out |= _names(c)
    return out


def _global_parts(fn: Any, code: Any, depth: int) -> list[Any]:
    """The module-level values a user's function reads: numbers, strings, tuples, tensors and arrays
    by value, functions by their code (e.g. ``SCALE = 3.0`` edited in a script between two processes).
    Modules, classes and other objects are left out (their state is not a value to compare), and so
    is library code, whose versions a resume checks: its globals include per-process settings."""
    space = getattr(fn, "__globals__", None)
    if depth >= 3 or not isinstance(space, dict) or str(space.get("__name__")).split(".")[0] in _NOT_USER_CODE:
        return []
    parts: list[Any] = []
    for name in sorted(_names(code)):
        v = space.get(name, _MISSING)
        if isinstance(v, torch.Tensor) and v.requires_grad:  # trained: the checkpoint holds its values
            continue
        if isinstance(v, (str, int, float, bool, bytes, type(None), torch.dtype, torch.Tensor, tuple, frozenset)):
            parts += [name, *_value_parts(sorted(map(_const_repr, v)) if isinstance(v, frozenset) else v)]
        elif hasattr(v, "tobytes") and hasattr(v, "dtype") and hasattr(v, "shape"):  # a NumPy array
            parts += [name, *_value_parts(v)]
        elif inspect.isfunction(v) or isinstance(v, functools.partial):
            parts += [name, *_callable_parts(v, depth + 1)]
    return parts


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def loss_fingerprint(loss: Any) -> str:
    """Hash of a loss function's code (bytecode, names, constants, nested functions), defaults and
    captured values, or of a loss module's class, settings and state: a resumed run replays the
    interrupted run's noise, so it must compute the same sums (with the module-level values it
    reads by name: :func:`_global_parts`)."""
    return _digest(_callable_parts(loss))


def metrics_fingerprint(metrics: Any) -> str:
    """Hash of the run metrics' names, timing, declarations and code (:func:`loss_fingerprint`'s
    coverage): a resumed run publishes their values beside those computed before the checkpoint,
    and a metric may draw from the generator a model's dropout draws from."""
    return _digest([x for m in metrics for x in (m.name, m.when, m.reads_private_data, *_callable_parts(m.fn))])


@functools.lru_cache(maxsize=512)
def _source(cls: type) -> str | None:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # defined in a REPL, by exec, or a compiled extension
        return None


def _class_parts(cls: type) -> list[Any]:
    """A class's code and that of its bases outside torch and the standard library: the source when
    Python can find it, and every function's bytecode, defaults and captured values (a class made
    by a factory function has one source for several bodies)."""
    parts: list[Any] = []
    for c in cls.__mro__:  # (a class made by exec without __name__ says it is from builtins)
        if c is object or c.__module__.split(".")[0] in _LIBRARY_MODULES:
            continue
        parts += [c.__module__ + "." + c.__qualname__, _source(c)]
        for name, member in sorted(vars(c).items()):
            fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if inspect.isfunction(fn):
                parts += [name, *_callable_parts(fn)]
    return parts


def code_fingerprint(obj: Any) -> str:
    """Hash of the code of ``obj``'s class (e.g. an algorithm or a gradient engine, registered by a
    user or built in) and of the classes of the objects it holds (e.g. a divergence or geometry)."""
    parts = _class_parts(type(obj))
    for name, v in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else ():
        if not isinstance(v, (torch.Tensor, nn.Module, type)) and type(v).__module__.split(".")[0] not in (
            "builtins",
            *_LIBRARY_MODULES,
        ):
            parts += [name, *_class_parts(type(v))]
    return _digest(parts)


def model_fingerprint(model: nn.Module) -> str:
    """Hash of a model's architecture: class, its modules' printed structure and settings (layer
    kinds, activations, strides: ReLU and Tanh between the same layers have the same parameters),
    parameter and buffer names, shapes and dtypes; every module's code (forward and the rest of
    its class: :func:`code_fingerprint`), plain attributes (e.g. ``self.scale = 3.0``, read by
    ``forward`` but not printed) and hooks (their code and captured values)."""
    items: list[Any] = [type(model).__module__ + "." + type(model).__qualname__, repr(model)]
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        items.append(f"{name}:{tuple(t.shape)}:{t.dtype}")
    seen: set[type] = set()
    for name, m in model.named_modules():
        if type(m) not in seen:
            seen.add(type(m))
            items += _class_parts(type(m))
        for key, v in sorted(vars(m).items()):
            if key not in _MODULE_INTERNALS:
                items += [name, key, *_value_parts(v)]
        for key in _HOOKS:
            for hook in getattr(m, key, {}).values():
                items += [name, key, *_callable_parts(hook)]
    return _digest(items)
