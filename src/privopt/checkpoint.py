"""Atomic file writes and checkpoints: a crash while saving never corrupts the last good file.

Every output is written to a temporary file in the same directory (plain ``os.write`` calls, then
``fsync``), moved over the old file with ``os.replace`` (atomic on POSIX) and the directory entry
is synced. A crash at any point leaves either the old or the new file, plus at most a hidden
``.NAME.*.tmp`` leftover that the next run in that directory removes.

Checkpoints are SECRET (mode 0600): they hold the keys of the secure noise and sampling generators
and the exact model, so anyone who reads one can replay or strip the privacy noise (see
``docs/privacy.md``).

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = save_checkpoint(d, {"step": 3})
    >>> load_checkpoint(d)["step"], oct((d / CHECKPOINT_NAME).stat().st_mode & 0o777)
    (3, '0o600')
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from privopt.errors import DataError

__all__ = [
    "CHECKPOINT_NAME",
    "SECRET_MODE",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "save_checkpoint",
    "load_checkpoint",
    "torch_bytes",
]

CHECKPOINT_NAME = "checkpoint.pt"
SECRET_MODE = 0o600
_CHUNK = 1 << 20
_UMASK = os.umask(0)
os.umask(_UMASK)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` by ``data`` atomically; ``mode`` defaults to ``0666 & ~umask`` (0600: secret)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # created 0600
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:_CHUNK]) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, (0o666 & ~_UMASK) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode(), mode=mode)


def atomic_write_json(path: Path, obj: Any, *, mode: int | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n", mode=mode)


def _json_default(o: Any) -> Any:
    torch = sys.modules.get("torch")  # not imported here: JSON and text writes stay torch-free (privopt runs)
    if torch is not None and isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def torch_bytes(obj: Any) -> bytes:
    """``torch.save`` into memory (so the file itself is written by one atomic write)."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``run_dir/checkpoint.pt`` atomically with owner-only permissions (it is secret)."""
    path = Path(run_dir) / CHECKPOINT_NAME
    atomic_write_bytes(path, torch_bytes(state), mode=SECRET_MODE)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    """Read ``run_dir/checkpoint.pt``; :class:`DataError` when it is missing or unreadable."""
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise DataError(f"no checkpoint to resume from: {path} does not exist")
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise DataError(f"checkpoint {path} is corrupt or unreadable: {e}") from None
    if not isinstance(state, dict):
        raise DataError(f"checkpoint {path} is not a privopt checkpoint (holds a {type(state).__name__})")
    return state
