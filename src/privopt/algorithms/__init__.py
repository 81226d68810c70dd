"""Optimisation algorithms; importing this package registers the built-ins."""

from privopt.algorithms.base import Algorithm, RunContext, available_algorithms, get_algorithm, register_algorithm
from privopt.algorithms import dpsgd  # noqa: F401  (registers sgd, dp-sgd, dp-gd)
from privopt.algorithms import svrg, dp_gd_erm  # noqa: F401  (DP-SVRG, DP-SVRG++, closed-form DP-GD; Paper B)
from privopt.algorithms import dro_double_spider, dro_recursive_spider, dro_baselines  # noqa: F401  (DRO, Paper A)

__all__ = ["Algorithm", "RunContext", "available_algorithms", "get_algorithm", "register_algorithm"]
