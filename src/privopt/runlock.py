"""Who owns a run directory, and whether that owner still lives: the ``.privopt.lock`` file.

A run (or a resume) holds an exclusive ``flock`` on ``.privopt.lock`` for as long as it owns its
directory (:class:`privopt.training.rundir.RunDirLock`): it creates the file before the run's first
record and removes it after its last. In it the owner writes its pid, host name and the kernel's
boot id (nothing of the data). The kernel releases the lock when the process dies, even by SIGKILL,
an out-of-memory kill or a reboot, with no pid-reuse race; so :func:`owner_state`, for ``privopt
runs``, tells a live run from one whose process is gone: it takes a shared lock for an instant and
never writes. A lock is only seen by the machine holding it on a file system that shares no locks
(NFS mounted ``nolock``, some FUSE file systems): an owner on another host is reported as
``unknown``, never as gone.

Kept below the training layer, which writes the file, so that ``privopt runs`` reads it without torch.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None

__all__ = ["ALIVE", "ENDED", "LOCK_NAME", "UNKNOWN", "OwnerState", "owner_state", "owner_text", "parse_owner"]

LOCK_NAME = ".privopt.lock"
ALIVE, ENDED, UNKNOWN = "alive", "ended", "unknown"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # Linux: one per kernel boot, shared by its containers


@dataclass(frozen=True)
class OwnerState:
    """What the lock file of a run directory says about the process that owns it.

    Attributes:
        state: ``ALIVE`` (a process holds the lock), ``ENDED`` (none does: no file, or a free lock
            written on this machine) or ``UNKNOWN`` (this machine cannot tell).
        host: the owner's host name as it wrote it (``None``: no file, or one of an earlier privopt).
        why: for ``UNKNOWN``, why it cannot be told.
    """

    state: str
    host: str | None = None
    why: str | None = None


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def owner_text() -> str:
    """The lock file's content for this process: one JSON line (pid, host name, boot id)."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "boot_id": _boot_id()}) + "\n"


def parse_owner(data: bytes) -> dict:
    """The owner a lock file names: ``{"pid", "host", "boot_id"}`` (``None`` where it says nothing; an
    earlier privopt wrote the pid alone)."""
    text = data.decode("utf-8", errors="replace").strip()
    try:
        owner = json.loads(text)
    except ValueError:
        owner = None
    if text.isdigit():  # the pid alone
        owner = {"pid": int(text)}
    if not isinstance(owner, dict):
        owner = {}
    return {key: owner.get(key) for key in ("pid", "host", "boot_id")}


def _here(owner: dict) -> bool:
    """Whether the owner ran under this kernel (same boot id) or on this host (same name, maybe before a
    reboot): then its lock, were it held, would be seen here."""
    boot = _boot_id()
    return (boot is not None and owner["boot_id"] == boot) or owner["host"] == socket.gethostname()


def _probe(path: Path) -> OwnerState | None:
    """One look at the lock file; ``None`` when the file was replaced meanwhile (look again)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # the owner removes it after its last record: no owner now
        return OwnerState(ENDED)
    except OSError as e:
        return OwnerState(UNKNOWN, why=f"its {LOCK_NAME} cannot be read ({e.strerror or e})")
    try:
        owner = parse_owner(os.pread(fd, 4096, 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return OwnerState(ALIVE, host=owner["host"])
        except OSError as e:
            why = f"the file system does not lock files ({e.strerror or e})"
            return OwnerState(UNKNOWN, host=owner["host"], why=why)
        try:
            mine = os.fstat(fd)
            if (mine.st_ino, mine.st_dev) != _inode(path):
                return None  # its owner removed it and another may have made a new one: look at that
            owner = parse_owner(os.pread(fd, 4096, 0))  # under the lock: no owner is writing it
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if _here(owner):
        return OwnerState(ENDED, host=owner["host"])
    if owner["host"]:
        why = f"it ran on host {owner['host']}, whose lock this machine may not see: look there"
    else:
        why = "its lock file, written by an earlier privopt, names no host: it may run on another machine"
    return OwnerState(UNKNOWN, host=owner["host"], why=why)


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_dev


def owner_state(folder: str | Path) -> OwnerState:
    """Whether a process owns the run directory ``folder`` now (see the module's docstring).

    Takes a shared ``flock`` on its lock file for an instant (an owner starting then waits for it)
    and writes nothing. Only meaningful for a run whose record is not final: a finished run's owner
    removes the file.
    """
    if fcntl is None:  # pragma: no cover - not POSIX
        return OwnerState(UNKNOWN, why="this system has no file locks")
    for _ in range(5):
        state = _probe(Path(folder) / LOCK_NAME)
        if state is not None:
            return state
    return OwnerState(UNKNOWN, why=f"its {LOCK_NAME} keeps being replaced")  # pragma: no cover - runs keep starting
