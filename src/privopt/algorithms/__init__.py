"""Optimisation algorithms; importing this package registers the built-ins."""

from privopt.algorithms import (  # noqa: F401  (DP-SVRG, DP-SVRG++, closed-form DP-GD; Paper B)  # noqa: F401  (DRO, Paper A)
    dp_gd_erm,
    dpsgd,
    dro_baselines,
    dro_double_spider,
    dro_recursive_spider,
    svrg,
)
from privopt.algorithms.base import Algorithm, RunContext, available_algorithms, get_algorithm, register_algorithm

__all__ = ["Algorithm", "RunContext", "available_algorithms", "get_algorithm", "register_algorithm"]
