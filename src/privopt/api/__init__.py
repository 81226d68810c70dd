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

from privopt.lazy import lazy_exports

_LAZY = {
    "DPOptimizer": "privopt.api.optimizer",
    "PoissonLoader": "privopt.api.loader",
    "PrivacyEngine": "privopt.api.engine",
    "ReleasedRun": "privopt.api.runs",
    "RunTable": "privopt.api.run_table",
    "compare_runs": "privopt.api.run_table",
    "fit": "privopt.api.fitting",  # not fit.py: importing privopt.api.fit (the module) would rebind the name
    "load_run": "privopt.api.runs",
    "per_sample_loss": "privopt.api.losses",
    "training_data": "privopt.api.loader",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports("privopt.api", _LAZY, globals())
