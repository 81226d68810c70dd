"""Atomic checkpoints: a crash while saving never corrupts the last good one.

The payload is written to a temporary file in the same directory, flushed and fsync'ed, then
moved over the old checkpoint with ``os.replace`` (atomic on POSIX).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from privopt.errors import DataError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "save_checkpoint", "load_checkpoint"]

CHECKPOINT_NAME = "checkpoint.pt"
_UMASK = os.umask(0)
os.umask(_UMASK)


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; outputs should be readable like any file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    path = Path(run_dir) / CHECKPOINT_NAME
    _atomic_write(path, lambda f: torch.save(state, f))
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise DataError(f"no checkpoint to resume from: {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise DataError(f"checkpoint {path} is corrupt or unreadable: {e}") from None
