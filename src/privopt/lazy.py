"""Names a package imports on first use (PEP 562 module ``__getattr__``), so importing the package
stays fast: ``import privopt`` and ``privopt runs`` load no torch, the accounting events no
dp_accounting."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: ``where`` maps each name to the module that
    defines it (absolute), imported on first access and then kept in ``namespace`` (the package's
    ``globals()``), so the next access is a plain lookup.

    Example:
        >>> ns = {}
        >>> get, names = lazy_exports("pkg", {"sqrt": "math"}, ns)
        >>> get("sqrt")(9.0), "sqrt" in ns, names()
        (3.0, True, ['sqrt'])
    """

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(where[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
