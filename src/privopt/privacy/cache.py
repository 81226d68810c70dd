"""A cache of accounting results on disk, shared by every run of a user (docs/accounting.md, "Caching").

A calibration costs seconds of PLD evaluations, and each run of the same configuration asks the
same questions again (the same schedule, noise, epsilon and delta). Results are stored as small
JSON files under ``$PRIVOPT_ACCOUNTING_CACHE`` (default ``$PRIVOPT_CACHE/accounting``, else
``~/.cache/privopt/accounting``); ``PRIVOPT_ACCOUNTING_CACHE=off`` turns the cache off.

Never a wrong privacy guarantee:

* the key holds every input of the computation, plus a fingerprint of the code that computes it
  (the source of ``privopt.privacy`` and the versions of dp_accounting, numpy and scipy): a
  changed accountant never reads an old answer;
* an entry stores its full key and a checksum of key and value; an entry that does not parse,
  whose key differs (a hash collision) or whose checksum fails is ignored (and recomputed);
* writes are atomic (a temporary file renamed into place), so a reader never sees half an entry;
  a cache that cannot be written (read-only home) is skipped silently.

Only the accounting inputs and outputs are stored (schedules, noise multipliers, epsilons): no
data, nothing secret.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     cache = DiskCache("demo", root=d)
    ...     cache.put({"q": 0.1}, {"epsilon": 1.5})
    ...     cache.get({"q": 0.1}), cache.get({"q": 0.2})
    ({'epsilon': 1.5}, None)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

__all__ = ["DiskCache", "cache_root", "code_fingerprint"]

_FORMAT = 1
_OFF = ("off", "0", "false", "no", "none")


def cache_root() -> Path | None:
    """The directory of the accounting cache, or ``None`` when ``PRIVOPT_ACCOUNTING_CACHE=off``."""
    explicit = os.environ.get("PRIVOPT_ACCOUNTING_CACHE")
    if explicit is not None:
        return None if explicit.strip().lower() in (*_OFF, "") else Path(explicit)
    base = os.environ.get("PRIVOPT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "privopt")
    return Path(base) / "accounting"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of everything that determines an accounting result besides its inputs: the source of
    ``privopt.privacy`` and the versions of the numerical libraries under it."""
    import dp_accounting
    import numpy
    import scipy

    h = hashlib.sha256()
    for lib in (dp_accounting, numpy, scipy):
        h.update(f"{lib.__name__}={getattr(lib, '__version__', '?')};".encode())
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _checksum(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


class DiskCache:
    """JSON values on disk under ``root/kind``, keyed by a JSON-able ``key`` (see the module docstring).

    Args:
        kind: Sub-directory (one per kind of result).
        root: Cache directory (default :func:`cache_root`, read at every call; ``None``: off).
    """

    def __init__(self, kind: str, *, root: str | Path | None = None):
        self.kind, self._root = kind, root

    def _dir(self) -> Path | None:
        root = cache_root() if self._root is None else Path(self._root)
        return None if root is None else root / self.kind

    @staticmethod
    def _key_text(key) -> str:
        return json.dumps({"format": _FORMAT, "code": code_fingerprint(), "key": key}, sort_keys=True)

    def _path(self, key_text: str) -> Path | None:
        d = self._dir()
        return None if d is None else d / f"{hashlib.sha256(key_text.encode()).hexdigest()}.json"

    def get(self, key):
        """The value stored under ``key``, or ``None`` (absent, off, unreadable, corrupt or another key)."""
        key_text = self._key_text(key)
        path = self._path(key_text)
        if path is None:
            return None
        try:
            entry = json.loads(path.read_text())
            value_text = json.dumps(entry["value"], sort_keys=True)
            if entry["key"] != key_text or entry["check"] != _checksum(key_text, value_text):
                return None
            return entry["value"]
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def put(self, key, value) -> None:
        """Store ``value`` (JSON-able) under ``key``, atomically; does nothing when off or unwritable."""
        key_text = self._key_text(key)
        path = self._path(key_text)
        if path is None:
            return
        value_text = json.dumps(value, sort_keys=True)
        entry = {"key": key_text, "value": value, "check": _checksum(key_text, value_text)}
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            os.replace(tmp, path)
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
