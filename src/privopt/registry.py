"""Name → object registries for privopt's extension points (algorithms, geometries, models, datasets, ...).

A class registers under its ``name`` attribute (:meth:`Registry.register`), any other object —
a factory function, a spec — under an explicit name (:meth:`Registry.register_as`,
:meth:`Registry.add`). Registering a different object under a taken name and looking up an unknown
name both fail with a :class:`~privopt.errors.ConfigError` that names the kind of thing and the
choices.

Example:
    >>> from privopt.registry import Registry
    >>> shapes = Registry("shape")
    >>> @shapes.register
    ... class Square:
    ...     name = "square"
    >>> shapes.lookup("square") is Square, shapes.names()
    (True, ('square',))
    >>> shapes.lookup("circle")
    Traceback (most recent call last):
    ...
    privopt.errors.ConfigError: unknown shape 'circle'; available: square
    >>> @shapes.register_as("triangle")
    ... def make_triangle():
    ...     return "▲"
    >>> shapes.lookup("triangle")()
    '▲'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from privopt.errors import ConfigError, close_name

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects of one kind by name.

    Args:
        kind: what the objects are, for error messages (``"algorithm"``, ``"model"``).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, obj: T) -> T:
        """Make ``obj`` available under ``name`` (re-adding the same or an equal object is a no-op)."""
        if name in self._entries and self._entries[name] is not obj and self._entries[name] != obj:
            raise ConfigError(f"{self.kind} name {name!r} registered twice")
        self._entries[name] = obj
        return obj

    def register(self, cls: T) -> T:
        """Class decorator: make ``cls`` available under ``cls.name``."""
        return self.add(cls.name, cls)  # type: ignore[attr-defined]

    def register_as(self, name: str) -> Callable[[Any], Any]:
        """Decorator: make the decorated object available under ``name``; returns it unchanged."""

        def deco(obj: Any) -> Any:
            self.add(name, obj)
            return obj

        return deco

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def entries(self) -> dict[str, T]:
        """The registered objects by name, sorted by name."""
        return dict(sorted(self._entries.items()))

    def lookup(self, name: str) -> T:
        """The object registered as ``name``; an unknown name fails with the available choices."""
        if not isinstance(name, str) or name not in self._entries:
            hint = close_name(name, self.names()) if isinstance(name, str) else ""
            raise ConfigError(f"unknown {self.kind} {name!r}{hint}; available: {', '.join(self.names())}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries
