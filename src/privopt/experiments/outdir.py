"""A reproduction's ``--out`` folder: checked before any work, and left as it was when the
reproduction stops with a user error before it has written a result.

A mistyped ``--data-dir`` is found when the first run loads its data, after the folder (and an
empty ``results.jsonl``) exists; leaving them behind made the corrected command refuse the folder
as "not empty". Only what the failed command created and left empty is removed: a result, a file
of the user's, or anything that was already there is never touched.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from privopt.errors import ConfigError, PrivoptError

__all__ = ["check_output_path", "reproduction_output"]


def check_output_path(out: str | Path) -> None:
    """Raise :class:`ConfigError` when ``out`` or the nearest existing folder above it is a file.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "f"
        >>> _ = f.write_text("x")
        >>> check_output_path(f)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: output path ... is a file, not a directory; choose a new directory
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output path {out} is a file, not a directory; choose a new directory")
    above = path.absolute()
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ConfigError(f"cannot create output directory {out}: {above} is a file")


def _holds_nothing(folder: Path) -> bool:
    """Only folders and empty files below ``folder`` (no link, no data)."""
    return all(not p.is_symlink() and (p.is_dir() or p.stat().st_size == 0) for p in folder.rglob("*"))


def _remove_new_and_empty(path: Path, before: set[Path]) -> None:
    # Only the new entries are walked: an existing --out may hold a large tree of earlier outputs.
    for p in set(path.iterdir()) - before:
        with contextlib.suppress(OSError):  # best effort: the user error is what gets reported
            if p.is_symlink():
                continue
            if p.is_file() and p.stat().st_size == 0:
                p.unlink()
            elif p.is_dir() and _holds_nothing(p):
                shutil.rmtree(p)


@contextlib.contextmanager
def reproduction_output(out: str | Path | None) -> Iterator[None]:
    """Check ``out``, then run the body; on a user error (or an OS error) remove what the body created
    in ``out`` that holds no data (empty files, folders of nothing else), and ``out`` itself when the
    body created it and it is empty."""
    if out is None:
        yield
        return
    path = Path(out)
    check_output_path(path)
    created = not path.exists()
    before = set(path.iterdir()) if path.is_dir() else set()
    try:
        yield
    except (PrivoptError, OSError):
        if path.is_dir():
            _remove_new_and_empty(path, before)
            if created and not any(path.iterdir()):
                with contextlib.suppress(OSError):
                    path.rmdir()
        raise
