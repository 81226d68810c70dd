"""A run's status as it is now, not only as its record last said (``privopt runs``, :func:`load_run`).

A run commits its record with status ``running`` while it trains, then a final one. A run whose
process was killed (SIGKILL, out of memory, a reboot) never writes the final one: its record says
``running`` for ever. The run directory's lock (:mod:`privopt.runlock`) tells whether a process still
owns the folder: if none does, the run is shown ``interrupted`` (as one stopped by Ctrl-C, it resumes
from its last checkpoint); if this machine cannot tell (the run's lock file names another host, or
the file system does not lock files), ``unknown``. The record is never rewritten here: the status
shown is derived. Torch-free, like :mod:`privopt.api.run_table`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from privopt.runlock import ALIVE, ENDED, OwnerState, owner_state

__all__ = ["RESUMABLE", "current_status", "resume_command"]

CHECKPOINT_NAME = "checkpoint.pt"  # privopt.checkpoint.CHECKPOINT_NAME (not imported: that pulls in torch)
RESUMABLE = ("paused", "interrupted")  # the statuses privopt train --resume continues from
_OWNED = ("running", *RESUMABLE)  # the record a resume starts with says one of these until its first commit


def current_status(
    record_path: Path, record: dict[str, Any], read: Callable[[Path], dict[str, Any]]
) -> tuple[dict[str, Any], str, OwnerState | None]:
    """``(record, status, owner)``: the run's record (read again when needed), its status now and what its
    lock file says (``None``: not looked at, the record is final).

    ``running`` while a process owns the folder; a record saying ``running`` with no owner:
    ``interrupted``; one this machine cannot check: ``unknown``. A paused or interrupted run that a
    process owns is being resumed: ``running``. ``read`` reads a record (:func:`run_table._read`).
    """
    if record.get("status") not in _OWNED:
        return record, record.get("status"), None
    folder = record_path.parent
    owner = owner_state(folder)
    if owner.state == ALIVE:
        return record, "running", owner
    if owner.state != ENDED or record.get("status") != "running":
        return record, "unknown" if record.get("status") == "running" else record.get("status"), owner
    # No owner, and the record says running. Read it again: a run that ended just before the look
    # wrote its final record first. Then look again: one that started since holds the lock now.
    record = read(record_path)
    if record.get("status") != "running":
        return current_status(record_path, record, read)
    owner = owner_state(folder)
    status = {ALIVE: "running", ENDED: "interrupted"}.get(owner.state, "unknown")
    return record, status, owner


def resume_command(folder: Path, record: dict[str, Any]) -> str | None:
    """How to continue the run in ``folder``: the CLI rebuilds what its config names; a dataset, model or
    loss passed as a Python object must be passed again from Python. ``None`` without a checkpoint (a
    torchrun run, or one moved without its SECRET ``checkpoint.pt``): nothing to resume from."""
    if not (folder / CHECKPOINT_NAME).is_file():
        return None
    sections = (record.get(k) if isinstance(record.get(k), dict) else {} for k in ("dataset", "model"))
    own = [k for k, sec in zip(("dataset", "model"), sections) if sec.get("source") == "api"]
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    own += ["loss"] if config.get("loss") == "custom" else []
    if not own:
        return f"privopt train --resume {folder}"
    return f"privopt.training.train(None, out_dir={str(folder)!r}, resume=True, ...) with the same " + ", ".join(own)
