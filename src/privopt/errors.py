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
