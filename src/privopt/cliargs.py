"""Value types for command-line options: a bad value is an argparse usage error (exit 2, one
line naming the option), never a traceback from deep inside a run.

Example:
    >>> import argparse
    >>> p = argparse.ArgumentParser(prog="x", exit_on_error=False)
    >>> _ = p.add_argument("--sizes", type=int_list)
    >>> p.parse_args(["--sizes", "128,512"]).sizes
    [128, 512]
    >>> positive_float("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a finite number > 0, got 'nan'
"""

from __future__ import annotations

import argparse
import math

__all__ = [
    "DEVICES",
    "add_run_outputs",
    "float_list",
    "int_list",
    "name_list",
    "non_negative_int",
    "positive_float",
    "positive_int",
]


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _int(text, 0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _items(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list without empty items, got {text!r}")
    return items


def int_list(text: str) -> list[int]:
    """Comma-separated integers >= 1, e.g. ``128,512``."""
    return [positive_int(t) for t in _items(text)]


def float_list(text: str) -> list[float]:
    """Comma-separated finite numbers > 0, e.g. ``0.5,1,8``."""
    return [positive_float(t) for t in _items(text)]


def name_list(text: str) -> list[str]:
    """Comma-separated names, e.g. ``mlp,cnn``."""
    return _items(text)


DEVICES = ("cpu", "cuda")  # the --device choices (config key `device`)


def add_run_outputs(
    parser: argparse.ArgumentParser, *, out_help: str = "output directory (new)", quiet: bool = True, jobs: bool = False
):
    """The options every reproduction shares: ``--insecure-seed``, ``--out``, ``--json`` and ``--quiet``
    (and ``--jobs`` for the reproductions that run in worker processes).

    Example:
        >>> p = argparse.ArgumentParser(prog="x")
        >>> add_run_outputs(p, jobs=True)
        >>> a = p.parse_args(["--out", "runs/x", "--insecure-seed", "3"])
        >>> (a.out, a.insecure_seed, a.json, a.quiet, a.jobs)
        ('runs/x', 3, False, False, 1)
    """
    if jobs:
        parser.add_argument(
            "--jobs", type=non_negative_int, default=1, metavar="N",
            help="runs at a time, each in its own process with one torch thread (0: one per CPU core; default 1). "
            "Results and their order do not depend on N",
        )  # fmt: skip
    parser.add_argument(
        "--insecure-seed", type=non_negative_int, metavar="N", default=None,
        help="seed the noise and sampling of every run (run s uses N + s): reproducible, NOT private "
        "(anyone who reads the seed can replay the noise); default: secret randomness",
    )  # fmt: skip
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    if quiet:
        parser.add_argument("--quiet", action="store_true", help="print nothing (outputs are still written)")
