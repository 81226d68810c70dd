"""The shared training loop: a builder, a small step/evaluate loop, callbacks, and the run's outputs.

* :mod:`privopt.training.builder`: data, model, loss, algorithm, calibration, ledger, randomness;
* :mod:`privopt.training.loop`: :func:`run_loop` and the :class:`Callback` interface (also used
  by the experiments that need only the loop, e.g. Paper B's Covertype runs);
* :mod:`privopt.training.callbacks`: progress, signals, divergence;
* :mod:`privopt.training.outputs`: what is written (public record vs secret checkpoint vs
  non-private diagnostics) and in which order;
* :mod:`privopt.training.resume`, :mod:`privopt.training.fingerprints` and
  :mod:`privopt.training.rundir`: resume checks (what a resume must reproduce), the lock;
* :mod:`privopt.training.run`: :func:`train`.

What a run publishes and why it is private end to end: ``docs/privacy.md``.

Example:
    >>> from privopt.config import RunConfig
    >>> from privopt.training import train
    >>> cfg = RunConfig.from_dict({"algorithm": "dp-sgd", "dataset": "digits", "model": "logreg",
    ...     "algorithm_params": {"epochs": 1, "batch_size": 100, "lr": 0.5},
    ...     "privacy": {"epsilon": 2.0, "delta": 1e-5}})
    >>> import tempfile; record = train(cfg, out_dir=tempfile.mkdtemp() + "/run", progress=False)
    >>> record["privacy"]["epsilon_spent"] <= 2.0, record["randomness"]["noise_and_sampling"]
    (True, 'secret')
"""

from privopt.training.builder import Run, build_run, randomness_section, run_sources
from privopt.training.callbacks import RunDiverged
from privopt.training.loop import Callback, Every, LoopState, StepLimit, run_loop
from privopt.training.metrics import (
    RunMetric,
    available_run_metrics,
    build_loss,
    evaluate,
    get_run_metrics,
    register_run_metric,
)
from privopt.training.outputs import (
    CURVES_NAME,
    DIAGNOSTICS_NAME,
    METRICS_NAME,
    MODEL_NAME,
    RECORD_NAME,
    load_diagnostics,
)
from privopt.training.run import RunInterrupted, train

__all__ = [
    "train",
    "RunInterrupted",
    "RunDiverged",
    # building blocks
    "Run",
    "build_run",
    "randomness_section",
    "run_sources",
    "Callback",
    "Every",
    "LoopState",
    "StepLimit",
    "run_loop",
    # metrics
    "RunMetric",
    "available_run_metrics",
    "build_loss",
    "evaluate",
    "get_run_metrics",
    "register_run_metric",
    # outputs
    "RECORD_NAME",
    "METRICS_NAME",
    "CURVES_NAME",
    "MODEL_NAME",
    "DIAGNOSTICS_NAME",
    "load_diagnostics",
]
