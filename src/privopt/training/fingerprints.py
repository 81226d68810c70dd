"""Fingerprints a resume checks: the data, the model, a custom loss, and the code that computes the sums.

A resumed run replays the interrupted run's noise, so it must compute the same sums: the same data,
the same model (structure, settings, code), loss, algorithm and gradient engine. Every fingerprint
here is SECRET when it covers data (a data hash lets anyone test a guess of the whole dataset) and
is kept only in the checkpoint (:mod:`privopt.training.resume`). Code is read from its source when
Python can find it, and always from its bytecode, names, constants, defaults and captured values,
so the fingerprints of code are comparable within one Python minor version only (a resume checks
it). A user's function (not privopt's, torch's or NumPy's) is covered with the module-level values
it reads by name: numbers, strings, tuples, untrained tensors, arrays and functions, and those it
reads through a chain of attribute names (:func:`_chains`): ``config.SCALE`` (``config`` a module,
class or object of the module's namespace; not a library's or the standard library's module) and,
in a model's methods, ``self.cfg.scale``. Not covered: what code reads by subscript
(``cfg["scale"]``), ``getattr`` with a computed name, a property, ``__getattr__`` or a call, and
what an argument or local variable holds.
"""

from __future__ import annotations

import contextvars
import dis
import functools
import hashlib
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = [
    "code_fingerprint",
    "data_fingerprint",
    "items_fingerprint",
    "loss_fingerprint",
    "metrics_fingerprint",
    "model_fingerprint",
    "model_items",
]

_SPLITS = ("x_train", "y_train", "g_train", "x_val", "y_val", "g_val", "x_test", "y_test", "g_test")
# nn.Module's own bookkeeping (parameters, buffers, submodules, hooks) and the train/eval flag,
# which the run sets itself: every other instance attribute is the user's setting.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"training"}
# The hooks a user may leave on a module (privopt's engines remove theirs after each use).
_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_LIBRARY_MODULES = ("torch", "typing", "abc", "collections", "numpy")  # their code: the versions checked
_NOT_USER_CODE = (*_LIBRARY_MODULES, "privopt")
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
_MISSING = object()
# How many attribute names of a chain (``a.b.c.d.e``) are followed: a bound on the work per chain.
_MAX_CHAIN = 4
_ROOT_OPS = {"LOAD_GLOBAL": "g", "LOAD_NAME": "g", "LOAD_FAST": "l", "LOAD_FAST_CHECK": "l", "LOAD_DEREF": "l"}
_ROOT_OPS["LOAD_FAST_BORROW"] = "l"
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
# While model_items runs, the module-level values user code reads are items of their own (an
# error names the one that changed); elsewhere they are part of the function's fingerprint.
_ITEMS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("privopt_items", default=None)


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
    by value, functions by their code (e.g. ``SCALE = 3.0`` edited in a script between two processes),
    read by name or at the end of a chain of attributes (``config.SCALE``: :func:`_follow`).
    Modules, classes and other objects are not values to compare, and library code is left out:
    its versions are checked, and its globals include per-process settings."""
    space = getattr(fn, "__globals__", None)
    if depth >= 3 or not isinstance(space, dict) or str(space.get("__name__")).split(".")[0] in _NOT_USER_CODE:
        return []
    module, parts = str(space.get("__name__")), []
    for name in sorted(_names(code)):
        got = _setting_parts(space.get(name, _MISSING), depth)
        if got is not None:
            parts += _report(f"{module}.{name}", got)
    for chain in sorted(c for c in _chains(code) if c[0] == "g"):
        found = _follow(space.get(chain[1], _MISSING), chain[2:], depth)
        if found is not None:
            parts += _report(".".join((module, chain[1], *chain[2 : 2 + found[0]])), found[1])
    return parts


def _report(name: str, parts: list[Any]) -> list[Any]:
    """A module-level value's parts: an item of its own under :func:`model_items`, else inline."""
    items = _ITEMS.get()
    if items is None:
        return [name, *parts]
    items[f"module-level value {name}"] = _digest(parts)
    return [name]


def _setting_parts(v: Any, depth: int) -> list[Any] | None:
    """A value a setting may hold, or ``None`` for anything else (an object, a module, a trained
    tensor: the checkpoint holds its values and each step changes it)."""
    if v is _MISSING or (isinstance(v, torch.Tensor) and v.requires_grad):
        return None
    if isinstance(v, frozenset):
        return _value_parts(sorted(map(_const_repr, v)))
    if isinstance(v, (str, int, float, bool, bytes, type(None), torch.dtype, torch.Tensor, tuple)):
        return _value_parts(v)
    if hasattr(v, "tobytes") and hasattr(v, "dtype") and hasattr(v, "shape"):  # a NumPy array
        return _value_parts(v)
    if inspect.isfunction(v) or isinstance(v, functools.partial):
        return _callable_parts(v, depth + 1)
    return None


@functools.lru_cache(maxsize=4096)
def _chains(code: Any) -> frozenset[tuple[str, ...]]:
    """The chains of attribute names code reads, nested code included: ``("g", "config", "SCALE")``
    for a global's (``config.SCALE``), ``("l", "self", "cfg", "scale")`` for a local's. Read from the
    bytecode: a name loaded, then its attributes loaded one after the other."""
    out: set[tuple[str, ...]] = set()
    chain: tuple[str, ...] | None = None
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG":  # a prefix of the next instruction
            continue
        if ins.opname in _ATTR_OPS and chain is not None and isinstance(ins.argval, str):
            chain = (*chain, ins.argval) if len(chain) < _MAX_CHAIN + 2 else chain
            continue
        if chain is not None and len(chain) > 2:
            out.add(chain)
        kind = _ROOT_OPS.get(ins.opname)
        chain = (kind, ins.argval) if kind is not None and isinstance(ins.argval, str) else None
    if chain is not None and len(chain) > 2:
        out.add(chain)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            out |= _chains(c)
    return frozenset(out)


def _library(v: Any) -> bool:
    """A module or class of a library or of the standard library (its values are not a run's settings)."""
    name = v.__name__ if isinstance(v, types.ModuleType) else v.__module__ if isinstance(v, type) else None
    return isinstance(name, str) and name.split(".")[0] in (*_NOT_USER_CODE, *_STDLIB)


def _follow(v: Any, attrs: tuple[str, ...], depth: int) -> tuple[int, list[Any]] | None:
    """The first setting (:func:`_setting_parts`) along ``v.a.b...``, with how many names lead to it.
    Attributes are read statically (``inspect.getattr_static``): no property, ``__getattr__`` or
    descriptor runs, so reading never changes or computes anything."""
    for i, name in enumerate(attrs):
        if v is _MISSING or _library(v) or (i and isinstance(v, (torch.Tensor, nn.Module))):
            return None
        owner, v = v, inspect.getattr_static(v, name, _MISSING)
        if isinstance(v, types.MemberDescriptorType) and not isinstance(owner, type):  # a __slots__ value
            v = _slot(v, owner)
        got = _setting_parts(v, depth)
        if got is not None:
            return i + 1, got
    return None


def _slot(descriptor: Any, owner: Any) -> Any:
    try:
        return descriptor.__get__(owner, type(owner))
    except AttributeError:  # a slot never set
        return _MISSING


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


def _user_classes(cls: type) -> list[type]:
    """A class and its bases outside torch and the standard library's ``object`` (a class made by
    exec without ``__name__`` says it is from builtins)."""
    return [c for c in cls.__mro__ if c is not object and c.__module__.split(".")[0] not in _LIBRARY_MODULES]


def _functions(c: type) -> Iterator[tuple[str, Any]]:
    """A class's own functions (methods, static and class methods, property getters), by name."""
    for name, member in sorted(vars(c).items()):
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(fn):
            yield name, fn


def _class_parts(cls: type) -> list[Any]:
    """A class's code and that of its bases outside torch and the standard library: the source when
    Python can find it, and every function's bytecode, defaults and captured values (a class made
    by a factory function has one source for several bodies)."""
    parts: list[Any] = []
    for c in _user_classes(cls):
        parts += [c.__module__ + "." + c.__qualname__, _source(c)]
        for name, fn in _functions(c):
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
    """Hash of a model's architecture: of its :func:`model_items`."""
    return items_fingerprint(model_items(model))


def items_fingerprint(items: dict[str, str]) -> str:
    """Hash of :func:`model_items` (two models have the same one if and only if the same items)."""
    return _digest(sorted(items.items()))


def _dotted(*names: str) -> str:
    return ".".join(n for n in names if n) or "(the model itself)"


def model_items(model: nn.Module) -> dict[str, str]:
    """A model's architecture, one hash per item a resume can name when it changed (names only,
    never values): ``structure`` (class, its modules' printed structure and settings: layer kinds,
    activations, strides; parameter and buffer names, shapes and dtypes), the ``code of`` every
    module's class (forward and the rest of it: :func:`code_fingerprint`), every module's plain
    ``attribute`` (``self.scale = 3.0``, read by ``forward`` but not printed) and those its methods
    read through attribute chains (``self.cfg.scale``), its ``hook`` s (code and captured values),
    and every ``module-level value`` that code reads (:func:`_global_parts`)."""
    items: dict[str, str] = {}
    token = _ITEMS.set(items)
    try:
        structure = [type(model).__module__ + "." + type(model).__qualname__, repr(model)]
        structure += [f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in [*model.named_parameters(), *model.named_buffers()]]
        items["structure"] = _digest(structure)
        seen: set[type] = set()
        for path, m in model.named_modules():
            if type(m) not in seen:
                seen.add(type(m))
                label = f"code of {type(m).__module__}.{type(m).__qualname__}"
                items[label if label not in items else f"{label} ({_dotted(path)})"] = _digest(_class_parts(type(m)))
            _module_items(items, path, m)
    finally:
        _ITEMS.reset(token)
    return items


def _module_items(items: dict[str, str], path: str, m: nn.Module) -> None:
    """One module's plain attributes, those its methods read through ``self``, and its hooks."""
    for key, v in sorted(vars(m).items()):
        if key not in _MODULE_INTERNALS:
            items[f"attribute {_dotted(path, key)}"] = _digest(_value_parts(v))
    for c in _user_classes(type(m)):
        for _, fn in _functions(c):
            code = fn.__code__
            me = code.co_varnames[0] if code.co_argcount else None
            for chain in sorted(_chains(code)):
                mine = chain[:2] == ("l", me) and not _internal(type(m), chain[2])
                found = _follow(m, chain[2:], 0) if mine else None
                if found is not None:
                    items[f"attribute {_dotted(path, *chain[2 : 2 + found[0]])}"] = _digest(found[1])
    for key in _HOOKS:
        for i, hook in enumerate(getattr(m, key, {}).values()):
            items[f"hook {key.strip('_')} #{i + 1} of {_dotted(path)}"] = _digest(_callable_parts(hook))


def _internal(cls: type, name: str) -> bool:
    """``self.name`` is no setting: nn.Module's bookkeeping, the train/eval flag the run sets
    itself, or a method (its class's code is an item of its own)."""
    return name in _MODULE_INTERNALS or isinstance(
        inspect.getattr_static(cls, name, None), (types.FunctionType, staticmethod, classmethod, property)
    )
