"""Optimisation algorithms; importing this package registers the built-ins.

What each implements and its privacy inventory: ``docs/algorithms/``. Building blocks:
:mod:`~privopt.algorithms.releases` (release plans), :mod:`~privopt.algorithms.estimators`
(SPIDER, STORM) and :mod:`~privopt.algorithms.config` (validated hyper-parameters).
"""

from privopt.algorithms import (  # noqa: F401  (registers the built-ins)
    dp_amd,
    dp_gd_erm,
    dpsgd,
    dro_baselines,
    dro_double_spider,
    dro_primal_dual,
    dro_recursive_spider,
    gauss_psgd,
    group_dro,
    sosp_baseline,
    sosp_common,
    svrg,
    worst_group_oco,
    worst_group_phased,
    worst_group_sgd,
)
from privopt.algorithms.base import Algorithm, RunContext, available_algorithms, get_algorithm, register_algorithm
from privopt.algorithms.config import AlgorithmConfig
from privopt.algorithms.estimators import SpiderEstimator, StormEstimator
from privopt.algorithms.releases import (
    BatchPlan,
    Fixed,
    Phase,
    PlanRun,
    Query,
    ReleasePlan,
    ReleasePlanExceeded,
    StepProportional,
)

__all__ = [
    "Algorithm",
    "AlgorithmConfig",
    "BatchPlan",
    "Fixed",
    "Phase",
    "PlanRun",
    "Query",
    "ReleasePlan",
    "ReleasePlanExceeded",
    "RunContext",
    "SpiderEstimator",
    "StepProportional",
    "StormEstimator",
    "available_algorithms",
    "get_algorithm",
    "register_algorithm",
]
