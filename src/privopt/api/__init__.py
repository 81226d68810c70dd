"""privopt inside your own code: DP-SGD in your training loop, or any algorithm in one call.

* :class:`PrivacyEngine` — ``make_private(module=, optimizer=, dataset= | data_loader=, ...)``
  returns your module, a DP optimizer and a Poisson data loader (DP-SGD: one clipped, noisy
  gradient per step; exact calibration; a budget guard).
* :func:`fit` — any registered algorithm (also those with two points or several queries per
  step) on your model, loss and data, on the shared training loop.
* :func:`load_run` — a finished run's released model; :func:`compare_runs` — a sweep's runs side by
  side, from their public records.

See ``docs/api.md``.
"""

from privopt.api.engine import PrivacyEngine
from privopt.api.fit import fit
from privopt.api.loader import PoissonLoader, training_data
from privopt.api.losses import per_sample_loss
from privopt.api.optimizer import DPOptimizer
from privopt.api.run_table import RunTable, compare_runs
from privopt.api.runs import ReleasedRun, load_run

__all__ = [
    "DPOptimizer",
    "PoissonLoader",
    "PrivacyEngine",
    "ReleasedRun",
    "RunTable",
    "compare_runs",
    "fit",
    "load_run",
    "per_sample_loss",
    "training_data",
]
