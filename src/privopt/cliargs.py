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
import re

from privopt.errors import close_name

__all__ = [
    "DEVICES",
    "add_plugin_option",
    "add_run_outputs",
    "exact_options",
    "float_list",
    "int_list",
    "name_list",
    "negative_values",
    "non_negative_int",
    "parse_with_hints",
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


def add_plugin_option(
    parser: argparse.ArgumentParser,
    *,
    what: str = "the config can name",
    kinds: str = "an algorithm, model, dataset...",
    stated: str = "config key `plugins`",
    dest: str = "plugin",
) -> None:
    """``--plugin MODULE_OR_FILE``, repeatable: your code to import first (:mod:`privopt.plugins`);
    ``what`` names it, ``kinds`` says which of its registrations, ``stated`` where the run states it;
    the entries go to ``args.<dest>``.

    Example:
        >>> p = argparse.ArgumentParser(prog="x")
        >>> add_plugin_option(p)
        >>> p.parse_args(["--plugin", "mypkg.ext", "--plugin", "ext.py"]).plugin
        ['mypkg.ext', 'ext.py']
    """
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE_OR_FILE", dest=dest,
        help=f"import this module (mypkg.ext) or Python file (ext.py, from the current directory) first, so {what} "
        f"what it registers ({kinds}); repeatable; {stated}. It runs as your code",
    )  # fmt: skip


def exact_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Turn off argparse's prefix matching in ``parser`` and all its sub-commands: an option is
    taken only as spelt in full, so a new option can never change what an old abbreviation meant
    (``--batch-size`` is refused instead of read as ``--batch-sizes``).

    Example:
        >>> p = argparse.ArgumentParser(prog="x", exit_on_error=False)
        >>> _ = p.add_argument("--batch-sizes")
        >>> exact_options(p).parse_known_args(["--batch-size", "8"])[1]
        ['--batch-size', '8']
    """
    for each in _with_subcommands(parser):
        each.allow_abbrev = False
    return parser


def _with_subcommands(parser: argparse.ArgumentParser):
    """``parser`` and every sub-command parser below it, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _with_subcommands(sub)


# A token that starts like a number (-1,2  -1e-5  -.5  -inf): argparse's own test (-1, -0.5 only) reads
# the rest as options, so `--epsilon -1,2` failed with "expected one argument" instead of naming the value.
_NUMBER_LIKE = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


def negative_values(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """In ``parser`` and all its sub-commands, a token that starts like a negative number (``-1,2``,
    ``-1e-5``, ``-inf``) is a value, so the option it follows refuses it by name (no option is
    spelt like a number).

    Example:
        >>> p = argparse.ArgumentParser(prog="x", exit_on_error=False)
        >>> _ = p.add_argument("--epsilons")
        >>> negative_values(p).parse_args(["--epsilons", "-1,2"]).epsilons
        '-1,2'
    """
    for each in _with_subcommands(parser):
        each._negative_number_matcher = _NUMBER_LIKE
    return parser


# (command, option) -> what to say instead of the close name, where that name means something else.
WRONG_OPTION_HINTS = {
    ("audit", "--run"): "privopt audit takes no run folder: it trains its own runs from the config the run was "
    "trained with, --config FILE; --runs is how many trainings a many-run audit makes",
}


def parse_with_hints(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unrecognised option is reported with the close name among
    the options of the sub-command it was given to (or, where that name means something else, with
    what :data:`WRONG_OPTION_HINTS` says).

    Example:
        >>> p = argparse.ArgumentParser(prog="x")
        >>> sub = p.add_subparsers(dest="command", required=True)
        >>> _ = sub.add_parser("bench").add_argument("--batch-sizes")
        >>> import contextlib, io
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        ...     parse_with_hints(exact_options(p), ["bench", "--batch-size", "8"])
        >>> print(err.getvalue().splitlines()[-1])
        x: error: unrecognized arguments: --batch-size 8 (did you mean '--batch-sizes'?)
    """
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if extra[0].startswith("--"):
            option = extra[0].split("=", 1)[0]
            said = WRONG_OPTION_HINTS.get((getattr(args, "command", None), option))
            hint = f" ({said})" if said else close_name(option, _option_strings(parser, args))
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _option_strings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The long options of the (sub-)command ``args`` was parsed by."""
    found = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                found += _option_strings(chosen, args)
    return found
