"""Module-level functions for the ``--jobs`` tests: spawned worker processes import them by name."""

import signal
import time


def echo_or_fail(x, delay: float = 0.0):
    """``x`` after ``delay`` seconds; ``x=None`` raises KeyError (not a failed-run error)."""
    time.sleep(delay)
    if x is None:
        raise KeyError("boom in a worker")
    return x


def broken_model():
    """A model factory whose every call fails with an error a run does not turn into a failed row."""
    raise RuntimeError("model factory broke in a worker")


def defer_sigterm_or_fail(seconds, delay: float = 0.0):
    """Sleep ``seconds`` with SIGTERM ignored (as a training run's own handler defers it to its next
    step); ``seconds=None`` raises KeyError after ``delay``."""
    if seconds is None:
        time.sleep(delay)
        raise KeyError("boom in a worker")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)
    return seconds


SECRET = "SECRET-record-4711"  # what a failing or warning worker quotes (tests/test_cli_tracebacks.py)


def leak_in_worker():
    """Fails, quoting a "record" in its message, as a user's model might."""
    raise RuntimeError(f"bad value in {SECRET}")


def warn_in_worker():
    """Warns, quoting a "record" in its text, as torch or a user's code might; returns 1."""
    import warnings

    warnings.warn(f"odd value in {SECRET}", UserWarning, stacklevel=1)
    return 1


def noise_source_kind(seed):
    """The class of the noise source a run started in this process gets (``privopt.training.run_sources``)."""
    from privopt.training import run_sources

    noise = run_sources(seed)["noise"]
    kind = type(noise).__name__
    if hasattr(noise, "close"):
        noise.close()
    return kind
