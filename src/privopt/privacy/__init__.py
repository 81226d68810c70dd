"""privopt.privacy: privacy bookkeeping (events, accountants, calibration, ledger) and numpy noise helpers.

Nothing in this package imports torch; it is pure math on Google's ``dp_accounting``.
"""

from privopt.privacy.accountant import EpsilonResult, delta_of, dp_relation_for, epsilon_of, to_dp_event
from privopt.privacy.calibration import (
    Calibration,
    Inventory,
    PlannedStep,
    calibrate,
    dp_sgd_noise,
    gaussian_noise_multiplier,
)
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
    WithoutReplacement,
    check_neighbouring,
    sensitivity_factor,
    step_from_dict,
)
from privopt.privacy.ledger import PrivacyLedger
from privopt.privacy.mechanisms import (
    gaussian_noise,
    laplace_noise,
    laplace_scale,
    report_noisy_max,
    report_noisy_max_epsilon,
)

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
    "Step",
    "Sampling",
    "Mechanism",
    "check_neighbouring",
    "sensitivity_factor",
    "step_from_dict",
    # accounting
    "EpsilonResult",
    "to_dp_event",
    "dp_relation_for",
    "epsilon_of",
    "delta_of",
    # calibration
    "PlannedStep",
    "Inventory",
    "Calibration",
    "calibrate",
    "gaussian_noise_multiplier",
    "dp_sgd_noise",
    # ledger
    "PrivacyLedger",
    # numpy mechanisms
    "gaussian_noise",
    "laplace_noise",
    "laplace_scale",
    "report_noisy_max",
    "report_noisy_max_epsilon",
]
