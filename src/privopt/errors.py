"""Exceptions and warnings raised by privopt. Each names the problem so a user can fix the input."""

import difflib
import functools
import inspect
import os
from collections.abc import Callable, Iterable

DEBUG_ENV = "PRIVOPT_DEBUG"  # set (not "" or "0"): errors and warnings may quote private data


class PrivoptError(Exception):
    """Base class of every error privopt raises on purpose."""


class ConfigError(PrivoptError, ValueError):
    """A setting, argument or configuration value is invalid (names the key and the bad value)."""


class DataError(PrivoptError, ValueError):
    """A dataset file is missing, corrupt, or its content is invalid (NaN/inf, wrong shape)."""


class ModelError(PrivoptError, ValueError):
    """A model is incompatible with per-sample DP training (e.g. BatchNorm mixes samples)."""


class PrivacyBudgetExceeded(PrivoptError):
    """A query would push the spent epsilon above the run's target; it was not answered."""


class RunDiverged(PrivoptError, ArithmeticError):
    """The loss or the parameters became non-finite (NaN/inf): the run stopped, its record says so."""

    exit_code = 4  # the CLI's exit code for a run that failed


class RunFailed(PrivoptError):
    """A run failed in a way its own process cannot say more about publicly (a peer process of a
    distributed run left; a benchmark's child run failed): the message names what failed, never why."""

    exit_code = 4


class PrivoptWarning(UserWarning):
    """Base class of privopt's own warnings: like its errors, they never quote private values (the
    CLI shows them in full; any other warning's text is hidden unless debugging, see ``privopt.quiet``)."""


class PrivoptRuntimeWarning(PrivoptWarning, RuntimeWarning):
    """A privopt warning about something that happens while running (e.g. a slower fallback)."""


class PrivoptDeprecationWarning(PrivoptWarning, DeprecationWarning):
    """A privopt option that will be removed."""


def close_name(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the candidate closest to a misspelt ``word``, else ``""``.

    Example:
        >>> close_name("test_fracton", ["test_fraction", "seed"])
        " (did you mean 'test_fraction'?)"
    """
    match = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def known_keywords(hints: dict[str, str] | None = None) -> Callable[[Callable], Callable]:
    """Decorator: a call with a keyword the function does not take fails with a :class:`ConfigError`
    naming it, the close name or ``hints[name]`` (e.g. how another library's argument maps here), and
    the keywords it takes, instead of Python's bare ``TypeError``.

    Example:
        >>> @known_keywords({"sigma": "the noise is calibrated from eps"})
        ... def run(*, eps=1.0):
        ...     return eps
        >>> run(epz=2.0)
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: run() takes no argument 'epz' (did you mean 'eps'?); it takes: eps
        >>> run(sigma=2.0)
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: run() takes no argument 'sigma': the noise is calibrated from eps; it takes: eps
    """

    def wrap(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters
        takes = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"]

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            unknown = [k for k in kwargs if k not in params]
            if unknown:
                name = unknown[0]
                why = f": {hints[name]}" if hints and name in hints else close_name(name, takes)
                raise ConfigError(f"{fn.__name__}() takes no argument {name!r}{why}; it takes: {', '.join(takes)}")
            return fn(*args, **kwargs)

        return checked

    return wrap


def debug_enabled() -> bool:
    """Whether ``$PRIVOPT_DEBUG`` asks for the details that may quote private data (``privopt --debug``
    sets it): the messages and tracebacks of foreign exceptions, the text of foreign warnings, the
    line of a data file an error is about. Only for debugging on your own data."""
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def some(noun: str, index: int | None = None) -> str:
    """``"some line"``: which record an error is about is that record's data; under
    :func:`debug_enabled` ``"line 3"`` (``index`` 0-based), for a user debugging their own file.

    Example:
        >>> some("line", 2) if not debug_enabled() else "some line"
        'some line'
    """
    if index is not None and debug_enabled():
        return f"{noun} {index + 1}"
    return f"some {noun}"


def public_reason(err: BaseException) -> str:
    """What a public output (a record, a results row) may say of ``err``.

    privopt's own messages name the problem without quoting private values (``docs/privacy.md``,
    "errors and warnings"). Any other exception comes from code privopt does not control (torch,
    numpy, a user's model or loss), whose text can quote a record: only its type is kept.

    Example:
        >>> public_reason(ConfigError("lr must be > 0"))
        'ConfigError: lr must be > 0'
        >>> public_reason(RuntimeError("Target 7 is out of bounds"))
        'RuntimeError (its message is not recorded: it may quote private values; privopt --debug shows it)'
    """
    if isinstance(err, PrivoptError):
        return f"{type(err).__name__}: {err}"
    return f"{type(err).__name__} (its message is not recorded: it may quote private values; privopt --debug shows it)"
