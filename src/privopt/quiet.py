"""What the command line prints about code privopt does not control: stderr is a public log.

An exception raised by torch, numpy or a user's model, loss or dataset code, and a warning it
emits, can quote a record (``Target 913 is out of bounds``, a shape that is a Poisson batch's
size, a user's own ``f"bad row {x}"``). Without ``privopt --debug`` (or ``PRIVOPT_DEBUG=1``) the
CLI prints one line per exception, its type and where it was raised (code, never data), and of a
foreign warning only its category and origin; privopt's own errors and warnings
(:class:`~privopt.errors.PrivoptError`, :class:`~privopt.errors.PrivoptWarning`) never quote
private values and are printed in full. With the opt-in everything is printed, as Python would.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator

from privopt.errors import DEBUG_ENV, PrivoptWarning, debug_enabled

__all__ = [
    "HIDDEN",
    "PEER_FAILED",
    "debug_mode",
    "foreign_error_line",
    "hide_foreign_warnings",
    "public_tail",
    "quiet_warnings",
]

HIDDEN = "may quote private data: not shown; `privopt --debug ...` or PRIVOPT_DEBUG=1 shows it"
# How a torchrun process says that another one failed (privopt.distributed.comm): not the cause to quote.
PEER_FAILED = "with the other client processes failed"
# torch's (glog-style) log lines, e.g. torchrun's "E1125 07:30:05.750000 5849 ...] failed (exitcode: 1)".
_TORCH_LOG = re.compile(r"[DIWEF]\d{4} \d\d:\d\d:\d\d")


def _where(frame) -> str:
    module = frame.f_globals.get("__name__", "?")
    qualname = getattr(frame.f_code, "co_qualname", frame.f_code.co_name).split(".")
    return ".".join([module, *(p for p in qualname if not p.startswith("<"))])  # no <locals>, <listcomp>


def _is_privopt(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module == "privopt" or module.startswith("privopt.")


def foreign_error_line(err: BaseException) -> str:
    """One line about an exception privopt did not raise on purpose: its type and where, not its text.

    Example:
        >>> try:
        ...     int("secret 42")
        ... except ValueError as e:
        ...     line = foreign_error_line(e)
        >>> line.startswith("ValueError in ") and "secret" not in line
        True
    """
    frames = [f for f, _ in traceback.walk_tb(err.__traceback__)]
    if type(err.__cause__).__name__ == "_RemoteTraceback":  # re-raised from a --jobs worker process
        where = " in a worker process"
    elif not frames:
        where = ""
    elif _is_privopt(frames[-1]):
        where = f" in {_where(frames[-1])}"
    else:
        ours = [f for f in frames if _is_privopt(f)]
        where = f" in {_where(frames[-1])}" + (f", called from {_where(ours[-1])}" if ours else "")
    return f"{type(err).__name__}{where} (its message and traceback {HIDDEN.replace('shows it', 'shows them')})"


def _is_decoration(line: str) -> bool:
    """A rule such as torchrun's ``=====`` or ``*****`` frame: nothing to quote."""
    return len(line) >= 3 and set(line) <= set("=-*#~_")


def _child_lines(lines: list[str]) -> list[str]:
    """``lines`` without torchrun's own report of a failed child: its log lines (``E1125 07:30:05...``),
    its ``ChildFailedError`` traceback and the framed summary after it; the child's output stays."""
    launcher = [i for i, ln in enumerate(lines) if ln.split(":", 1)[0].endswith("ChildFailedError")]
    if launcher:
        tracebacks = [i for i in range(launcher[-1]) if lines[i].startswith("Traceback (most recent call last)")]
        lines = lines[: tracebacks[-1] if tracebacks else launcher[-1]]
    return [ln for ln in lines if not _is_decoration(ln) and not _TORCH_LOG.match(ln)]


def public_tail(stderr: str) -> str:
    """What a parent may quote of a failed privopt child process's stderr: the child's last own
    ``privopt: ...`` line (public by construction; under torchrun, not a process's line that only
    says another one failed), else the type of its last exception only. torchrun's own report of
    the failure, and decorative rules, are never what is quoted.

    Example:
        >>> public_tail("Traceback ...\\nValueError: row 3 holds 7.25")
        'ValueError (its message may quote private data: not shown; `privopt --debug ...` or PRIVOPT_DEBUG=1 shows it)'
    """
    every = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    lines = _child_lines(every) or [ln for ln in every if not _is_decoration(ln)]
    if debug_enabled():
        return lines[-1] if lines else "?"
    own = [ln for ln in lines if ln.startswith("privopt: ")]
    own = [ln for ln in own if PEER_FAILED not in ln] or own
    if own:
        return own[-1]
    last = lines[-1] if lines else ""
    kind = last.split(":", 1)[0] if ":" in last and last.split(":", 1)[0].replace(".", "").isidentifier() else "?"
    return f"{kind} (its message {HIDDEN})"


def _hidden_warning(category, filename, lineno, file) -> None:
    out = sys.stderr if file is None else file
    with contextlib.suppress(OSError, ValueError, AttributeError):  # as Python's own: a closed stderr is no error
        out.write(f"privopt: warning: {category.__name__} from {filename}:{lineno} (its text {HIDDEN})\n")


def _quiet(previous):
    def show(message, category, filename, lineno, file=None, line=None):
        if debug_enabled() or issubclass(category, PrivoptWarning):
            previous(message, category, filename, lineno, file, line)
        else:
            _hidden_warning(category, filename, lineno, file)

    show.privopt_quiet = True
    return show


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """While the block runs, a foreign warning shows its category and origin, not its text
    (privopt's own warnings, and every warning under debugging, go to the previous handler)."""
    previous = warnings.showwarning
    warnings.showwarning = _quiet(previous)
    try:
        yield
    finally:
        warnings.showwarning = previous


def hide_foreign_warnings() -> None:
    """:func:`quiet_warnings` for the rest of this process: the initializer of a worker process."""
    if not getattr(warnings.showwarning, "privopt_quiet", False):
        warnings.showwarning = _quiet(warnings.showwarning)


@contextlib.contextmanager
def debug_mode(on: bool) -> Iterator[None]:
    """``privopt --debug``: set ``$PRIVOPT_DEBUG`` for this process and the workers and ``torchrun``
    children it starts (which inherit the environment); restored after."""
    before = os.environ.get(DEBUG_ENV)
    if on:
        os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if on:
            if before is None:
                os.environ.pop(DEBUG_ENV, None)
            else:
                os.environ[DEBUG_ENV] = before
