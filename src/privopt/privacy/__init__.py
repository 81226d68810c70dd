"""privopt.privacy: privacy bookkeeping (events, accountants, calibration, ledger, filter) and numpy noise helpers.

Nothing in this package imports torch; it is a thin layer over Google's ``dp_accounting``.
See docs/accounting.md.
"""

from privopt.privacy.accountant import (
    DEFAULT_ORDERS,
    EpsilonResult,
    delta_of,
    epsilon_of,
    pld_supported,
    rdp_curve,
)
from privopt.privacy.calibration import (
    DEFAULT_TIME_LIMIT,
    Calibration,
    CalibrationProgress,
    calibrate,
    dp_sgd_noise,
    gaussian_noise_multiplier,
)
from privopt.privacy.checks import check_delta_for_size
from privopt.privacy.events import (
    ADD_REMOVE,
    NEIGHBOURING,
    REPLACE_ONE,
    FullBatch,
    Gaussian,
    Laplace,
    Mechanism,
    Poisson,
    PureDP,
    Sampling,
    SingleRecord,
    Step,
    TreeAggregation,
    WithoutReplacement,
    check_neighbouring,
    sensitivity_factor,
    step_from_dict,
)
from privopt.privacy.filter import RdpFilter
from privopt.privacy.inventory import (
    COMPOSITIONS,
    Inventory,
    LaplaceShape,
    NoisyMaxShape,
    PlannedStep,
    TreeShape,
    laplace_family,
    noisy_max_family,
    tree_family,
)
from privopt.privacy.ledger import PrivacyLedger
from privopt.privacy.mechanisms import (
    gaussian_noise,
    laplace_noise,
    laplace_scale,
    report_noisy_max,
    report_noisy_max_epsilon,
)
from privopt.privacy.parallel import ParallelLedger, ledger_from_dict, make_ledger
from privopt.privacy.translate import dp_relation_for, to_dp_event

__all__ = [
    # events
    "ADD_REMOVE",
    "REPLACE_ONE",
    "NEIGHBOURING",
    "Poisson",
    "WithoutReplacement",
    "FullBatch",
    "SingleRecord",
    "Gaussian",
    "Laplace",
    "PureDP",
    "TreeAggregation",
    "Step",
    "Sampling",
    "Mechanism",
    "check_neighbouring",
    "sensitivity_factor",
    "step_from_dict",
    # accounting
    "EpsilonResult",
    "DEFAULT_ORDERS",
    "to_dp_event",
    "dp_relation_for",
    "epsilon_of",
    "delta_of",
    "rdp_curve",
    "pld_supported",
    "check_delta_for_size",
    # calibration
    "PlannedStep",
    "Inventory",
    "TreeShape",
    "tree_family",
    "LaplaceShape",
    "NoisyMaxShape",
    "laplace_family",
    "noisy_max_family",
    "Calibration",
    "CalibrationProgress",
    "DEFAULT_TIME_LIMIT",
    "calibrate",
    "gaussian_noise_multiplier",
    "dp_sgd_noise",
    # ledger and adaptive filter
    "PrivacyLedger",
    "RdpFilter",
    "ParallelLedger",
    "COMPOSITIONS",
    "make_ledger",
    "ledger_from_dict",
    # numpy mechanisms
    "gaussian_noise",
    "laplace_noise",
    "laplace_scale",
    "report_noisy_max",
    "report_noisy_max_epsilon",
]
