"""privopt inside your own code: DP-SGD in your training loop, or any algorithm in one call.

* :class:`PrivacyEngine` — ``make_private(module=, optimizer=, dataset= | data_loader=, ...)``
  returns your module, a DP optimizer and a Poisson data loader (DP-SGD: one clipped, noisy
  gradient per step; exact calibration; a budget guard).
* :func:`fit` — any registered algorithm (also those with two points or several queries per
  step) on your model, loss and data, on the shared training loop.
* :func:`load_run` — a finished run's released model; :func:`compare_runs` — a sweep's runs side by
  side, from their public records.

The names are imported on first use: :func:`compare_runs` (``privopt runs``) reads JSON records
and never loads torch.

See ``docs/api.md``.
"""

_LAZY = {
    "DPOptimizer": "optimizer",
    "PoissonLoader": "loader",
    "PrivacyEngine": "engine",
    "ReleasedRun": "runs",
    "RunTable": "run_table",
    "compare_runs": "run_table",
    "fit": "fitting",  # not fit.py: importing privopt.api.fit (the module) would rebind the name
    "load_run": "runs",
    "per_sample_loss": "losses",
    "training_data": "loader",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"privopt.api.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'privopt.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
