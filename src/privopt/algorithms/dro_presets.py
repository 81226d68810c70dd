"""The DRO algorithms' former (paper-scale) defaults, kept as an explicit preset.

Until 2026-11 the DRO algorithms defaulted to Paper A's schedule: SPIDER phases of q = 32 with
refresh batches of 2048, an x step of 0.1, a weight cap A = 4, and (for the SPIDER methods) a
uniformly random output iterate; the primal–dual baselines clamped the released losses at 10 and
gave the loss vector the x-query's noise multiplier. On a short CPU run (``privopt train`` on
digits at ε = 1) those settings learn almost nothing: a SPIDER correction's noise is set by its
threshold, which at useful steps is as large as a refresh's bound while its batch is smaller, so
the estimator is mostly noise; the normalised x step of 0.1 then moves the model by at most 0.1 a
step in an almost random direction; and A = 4 multiplies the x-query's noise by 4. The present
defaults and the measurements behind them: ``docs/algorithms/dro.md`` ("Defaults").

:data:`PAPER_DEFAULTS` holds, per algorithm, the former value of every field whose default changed,
so the old behaviour stays one call away and code that depends on it (the reproductions' recipe in
:func:`privopt.experiments.dro_protocol.method_params`, the end-to-end benchmark, the pinned
regression numbers) states it explicitly instead of inheriting it.

Example:
    >>> from privopt.algorithms import get_algorithm
    >>> algo = get_algorithm("dp-double-spider", **PAPER_DEFAULTS["dp-double-spider"])
    >>> algo.config.q, algo.config.N1, algo.config.lr, algo.config.weight_cap, algo.config.output
    (32, 2048, 0.1, 4.0, 'random')
"""

from __future__ import annotations

from typing import Any

__all__ = ["PAPER_DEFAULTS"]

_SPIDER = {"q": 32, "lr": 0.1, "weight_cap": 4.0, "output": "random"}
_PRIMAL_DUAL = {"lr": 0.1, "weight_cap": 4.0, "loss_bound": 10.0, "loss_noise_ratio": 1.0}

PAPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "dp-double-spider": {**_SPIDER, "N1": 2048, "N3": 2048},
    "dp-recursive-spider": {**_SPIDER, "b1": 2048, "b3": 2048},
    "dp-sgda": dict(_PRIMAL_DUAL),
    "private-diff": {**_PRIMAL_DUAL, "q": 32, "refresh_batch": 2048, "batch_size": 128, "clip_x_diff": None},
}
