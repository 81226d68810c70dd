"""Exceptions raised by privopt. Each names the problem so a user can fix the input."""


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


def public_reason(err: BaseException) -> str:
    """What a public output (a record, a results row) may say of ``err``.

    privopt's own messages name the problem without quoting private values (``docs/privacy.md``,
    "errors and warnings"). Any other exception comes from code privopt does not control (torch,
    numpy, a user's model or loss), whose text can quote a record: only its type is kept.

    Example:
        >>> public_reason(ConfigError("lr must be > 0"))
        'ConfigError: lr must be > 0'
        >>> public_reason(RuntimeError("Target 7 is out of bounds"))
        'RuntimeError (its message is not recorded: it may quote private values; see the traceback)'
    """
    if isinstance(err, PrivoptError):
        return f"{type(err).__name__}: {err}"
    return f"{type(err).__name__} (its message is not recorded: it may quote private values; see the traceback)"
