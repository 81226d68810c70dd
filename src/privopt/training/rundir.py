"""The run directory: checks before any work, and a lock while a run owns it.

A run directory is reusable when it is new, empty, or holds only what a run killed before its
first checkpoint leaves behind (the lock file and hidden ``.*.tmp`` files); it is refused when it
holds a run (``record.json`` / ``checkpoint.pt``) or any other file. While a run (or a resume)
writes into it, it holds an exclusive ``flock`` on ``.privopt.lock``: a second run into the same
directory fails at once with a clear message. The owner removes the file when it is done (finished,
paused or failed); the kernel releases the lock when a process dies, even by SIGKILL, so the file a
crashed run leaves is taken over by the next run or resume, never blocks it. What the owner writes in
it, and how ``privopt runs`` tells a live run from a killed one by it: :mod:`privopt.runlock`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from privopt.checkpoint import CHECKPOINT_NAME
from privopt.errors import ConfigError
from privopt.runlock import LOCK_NAME, owner_text, parse_owner

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None

__all__ = ["LOCK_NAME", "RunDirLock", "check_new_run_dir", "check_resume_dir", "is_leftover"]

RECORD_NAME = "record.json"


def is_leftover(name: str) -> bool:
    """Files a run may leave when it is killed: its lock and unfinished atomic writes."""
    return name == LOCK_NAME or (name.startswith(".") and name.endswith(".tmp"))


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_writable(out: Path) -> None:
    target = out if out.is_dir() else _nearest_existing(out)
    if not target.is_dir():
        raise ConfigError(f"cannot create output directory {out}: {target} is a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=".privopt-write-test.", suffix=".tmp", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"cannot write to output folder {target}: {e.strerror or e}") from None


def _check_reusable(out: Path) -> None:
    names = sorted(p.name for p in out.iterdir())
    runs = [n for n in names if n in (RECORD_NAME, CHECKPOINT_NAME)]
    if runs:
        hint = (
            f", or continue that run with --resume {out} (from Python: train(None, out_dir=..., resume=True))"
            if CHECKPOINT_NAME in runs
            else ""
        )
        raise ConfigError(
            f"output directory {out} already holds a run ({', '.join(runs)}); choose another output directory{hint}"
        )
    foreign = [n for n in names if not is_leftover(n)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ConfigError(f"output directory {out} already holds files ({shown}); choose another or empty it")


def _launched_by_torchrun(out: Path) -> bool:
    try:
        return json.loads((out / RECORD_NAME).read_text()).get("launch", {}).get("launcher") == "torchrun"
    except (OSError, ValueError, AttributeError):
        return False


def check_new_run_dir(out: Path) -> None:
    """Before building a new run: ``out`` must not be a file, must be writable, must hold no run."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output path {out} is a file, not a directory; choose a new directory")
    if out.is_dir():
        _check_reusable(out)
    _check_writable(out)


def check_resume_dir(out: Path) -> None:
    """Before resuming: ``out`` must be an existing, writable run directory."""
    out = Path(out)
    if not out.is_dir():
        what = "is a file" if out.exists() else "does not exist"
        raise ConfigError(f"cannot resume: {out} {what} (give the run's output directory)")
    names = sorted(p.name for p in out.iterdir())
    foreign = [n for n in names if not is_leftover(n)]
    # A run writes its checkpoint before anything else: without one, other files are not a run's
    # (and locking the folder would leave a lock file in it).
    if CHECKPOINT_NAME not in names and _launched_by_torchrun(out):
        raise ConfigError(
            f"cannot resume: {out} holds a run launched by torchrun (one process per client), which writes no "
            "checkpoint and cannot be resumed: no process holds every client's secrets; start it again in a "
            "new output directory"
        )
    if CHECKPOINT_NAME not in names and foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ConfigError(
            f"cannot resume: {out} is not a privopt run directory (no {CHECKPOINT_NAME}; it holds {shown}); "
            "give the output directory of the run to continue"
        )
    _check_writable(out)


class RunDirLock:
    """Exclusive ownership of a run directory (created if needed) for the duration of a ``with``.

    On entry it also removes the ``.*.tmp`` leftovers of writers that were killed: only the
    owner writes in the directory, so no other writer can be in progress.
    """

    def __init__(self, out: Path):
        self.out = Path(out)
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the run directory {self.out}: {e.strerror or e}") from None
        for _ in range(100):
            fd = self._open_and_lock()
            if self._is_current(fd):
                break
            os.close(fd)  # locked a file its owner had just removed: lock the one now at the path
        else:  # pragma: no cover - another process keeps replacing the file
            raise ConfigError(f"run directory {self.out} is in use by another privopt run")
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner_text().encode(), 0)
        self._fd = fd
        for leftover in self.out.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)
        return self

    def _open_and_lock(self) -> int:
        try:
            fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot create the run directory {self.out}: {e.strerror or e}") from None
        if fcntl is not None:
            try:
                _lock_exclusive(fd)
            except BlockingIOError:
                owner = parse_owner(os.pread(fd, 4096, 0))
                os.close(fd)
                elsewhere = owner["host"] not in (None, socket.gethostname())
                who = f"pid {owner['pid'] or '?'}" + (f" on host {owner['host']}" if elsewhere else "")
                raise ConfigError(
                    f"run directory {self.out} is in use by another privopt run ({who}); "
                    "wait for it to end or choose another output directory"
                ) from None
            except OSError as e:
                os.close(fd)
                raise ConfigError(
                    f"cannot lock the run directory {self.out}: {e.strerror or e} (its file system may not support "
                    "file locks); choose an output directory on another file system, e.g. a local disk"
                ) from None
        return fd

    def _is_current(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at the lock's path (an owner removes it before unlocking)."""
        try:
            here = os.stat(self.out / LOCK_NAME)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            # Removed while still locked: whoever opens the path next creates a new file, and one
            # that opened the old file before this sees it is no longer at the path.
            with contextlib.suppress(OSError):  # a folder made read-only meanwhile: keep the run's result
                (self.out / LOCK_NAME).unlink()
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _lock_exclusive(fd: int, *, tries: int = 50) -> None:
    """``flock(LOCK_EX)`` without waiting for an owner, but for ``privopt runs``: it holds a shared lock
    for an instant while it checks whether a run still lives (``BlockingIOError`` once held for 0.5 s)."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == tries - 1:
                raise
            time.sleep(0.01)
