"""Name → class registries for privopt's extension points (algorithms, mirror geometries, ...).

A class registers under its ``name`` attribute; registering a different class under a taken name
and looking up an unknown name both fail with a :class:`~privopt.errors.ConfigError` that names the
kind of thing and the choices.

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
"""

from __future__ import annotations

from typing import Generic, TypeVar

from privopt.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Classes of one kind by their ``name`` attribute.

    Args:
        kind: what the classes are, for error messages (``"algorithm"``, ``"geometry"``).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._classes: dict[str, T] = {}

    def register(self, cls: T) -> T:
        """Class decorator: make ``cls`` available under ``cls.name``."""
        name = cls.name
        if name in self._classes and self._classes[name] is not cls:
            raise ConfigError(f"{self.kind} name {name!r} registered twice")
        self._classes[name] = cls
        return cls

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._classes))

    def classes(self) -> dict[str, T]:
        """The registered classes by name, sorted by name."""
        return dict(sorted(self._classes.items()))

    def lookup(self, name: str) -> T:
        """The class registered as ``name``; an unknown name fails with the available choices."""
        if not isinstance(name, str) or name not in self._classes:
            raise ConfigError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}")
        return self._classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._classes
