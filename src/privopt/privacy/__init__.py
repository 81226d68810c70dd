"""privopt.privacy: privacy bookkeeping (events, accountants, calibration, ledger, filter) and numpy noise helpers.

Nothing in this package imports torch; it is a thin layer over Google's ``dp_accounting``.
See docs/accounting.md.
"""

from privopt.lazy import lazy_exports

# Where each public name lives: loaded on first use (see __getattr__).
_SUBMODULES = {
    "accountant": "DEFAULT_ORDERS EpsilonResult delta_of epsilon_of pld_supported rdp_curve",
    "calibration": (
        "DEFAULT_TIME_LIMIT Calibration CalibrationProgress calibrate dp_sgd_noise gaussian_noise_multiplier"
    ),
    "checks": "check_delta_for_size",
    "events": (
        "ADD_REMOVE NEIGHBOURING REPLACE_ONE FullBatch Gaussian Laplace Mechanism Poisson PureDP Sampling "
        "SingleRecord Step TreeAggregation WithoutReplacement check_neighbouring sensitivity_factor "
        "step_from_dict"
    ),
    "filter": "RdpFilter",
    "inventory": (
        "COMPOSITIONS Inventory LaplaceShape NoisyMaxShape PlannedStep TreeShape laplace_family "
        "noisy_max_family tree_family"
    ),
    "ledger": "PrivacyLedger",
    "sweep": "MAX_SWEEP_ROWS dp_sgd_epsilon dp_sgd_steps dp_sgd_sweep",
    "mechanisms": "gaussian_noise laplace_noise laplace_scale report_noisy_max report_noisy_max_epsilon",
    "parallel": "ParallelLedger ledger_from_dict make_ledger",
    "translate": "dp_relation_for to_dp_event",
}
_LAZY = {name: f"privopt.privacy.{module}" for module, names in _SUBMODULES.items() for name in names.split()}

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
    # budget planning
    "MAX_SWEEP_ROWS",
    "dp_sgd_epsilon",
    "dp_sgd_steps",
    "dp_sgd_sweep",
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


# The events (imported by the sampling and data code) must not pull in dp_accounting and scipy,
# about a second, before anything is accounted.
__getattr__, __dir__ = lazy_exports("privopt.privacy", _LAZY, globals())
