"""How many CPU cores this process may use, and how many worker processes share them.

Kept below the training layer, which reads both (a resume warns when its recorded thread count
oversubscribes the cores), while the worker pools that set the second live in
:mod:`privopt.experiments.jobs`.

Example:
    >>> from privopt.cores import pool_jobs, usable_cores
    >>> usable_cores() >= 1, pool_jobs()
    (True, 1)
"""

from __future__ import annotations

import os

__all__ = ["pool_jobs", "set_pool_jobs", "usable_cores"]

_POOL_JOBS = 1  # in a worker process: how many workers its pool runs (this one among them)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS reports one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pool_jobs() -> int:
    """How many worker processes of a pool run at once, this one among them (1 outside one)."""
    return _POOL_JOBS


def set_pool_jobs(jobs: int) -> None:
    """Called once in each worker process of a pool of ``jobs`` workers."""
    global _POOL_JOBS
    _POOL_JOBS = int(jobs)
