"""Empirical privacy audits: ``privopt audit`` (``docs/audit.md``).

An audit inserts canaries (each with probability ½, secretly), trains with the real pipeline,
scores every canary from what the run releases, and turns the membership guesses into a lower
bound on ε with a stated confidence. A bound above the ε the run accounted refutes the run's
privacy claim.

* :func:`run_audit` — the audit of a config (one-run or many-run, white-box and/or black-box);
* :mod:`privopt.audit.bounds` — the statistics (Steinke, Nasr & Jagielski 2023; Clopper–Pearson);
* :mod:`privopt.audit.canaries` — gradient canaries (:class:`AuditModel`, :class:`LinearAuditModel`) and input canaries;
* :mod:`privopt.audit.scores` — white-box (released gradients) and black-box (released model) scores;
* :mod:`privopt.audit.report` — the summary, ``audit.json`` and ``audit.png``.

Example (the statistics alone; a full audit trains models, see ``docs/audit.md``):
    >>> import numpy as np
    >>> from privopt.audit import one_run_bound
    >>> rng = np.random.default_rng(0)
    >>> included = rng.random(1000) < 0.5
    >>> guesses = np.where(rng.random(1000) < 0.73, included, ~included)   # ε = 1 randomized response
    >>> 0.5 < one_run_bound(guesses + 1e-9 * rng.random(1000), included, delta=0.0).epsilon <= 1.0
    True
"""

from privopt.audit.audit import METHODS, MODES, AuditReport, AuditResult, run_audit
from privopt.audit.bounds import ManyRunBound, OneRunBound, many_run_bound, one_run_bound
from privopt.audit.canaries import AuditModel, CanaryHead, LinearAuditModel, draw_inclusion
from privopt.audit.report import format_report, plot_report, write_report

__all__ = [
    "run_audit",
    "AuditReport",
    "AuditResult",
    "MODES",
    "METHODS",
    "one_run_bound",
    "many_run_bound",
    "OneRunBound",
    "ManyRunBound",
    "AuditModel",
    "CanaryHead",
    "LinearAuditModel",
    "draw_inclusion",
    "format_report",
    "write_report",
    "plot_report",
]
