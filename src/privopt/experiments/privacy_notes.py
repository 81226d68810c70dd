"""What a reproduction's outputs must say about the values its ε does not cover.

Every run's ε covers that run only (docs/privacy.md, "What is not accounted"). A reproduction
that chose its hyper-parameters on records of the training data, or reports measurements taken on
the training records without noise, says so in every output that depends on them: the run records
(``privacy.not_accounted``), the result rows, the summaries and the Markdown tables.

Example:
    >>> hyperparameter_note({"tuned": True}).startswith("tuned by grid search")
    True
    >>> hyperparameter_note({"tuned": False, "hyperparameters": "budget defaults"}) is None
    True
    >>> hyperparameter_note({"tuned": True, "selection": None}) is None  # e.g. an independent draw
    True
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEMO_SELECTION",
    "DRO_BUDGET_DEFAULTS",
    "DRO_DEFAULTS_CHOSEN_ON",
    "dro_defaults_note",
    "ERM_TRAINING_MEASUREMENTS",
    "ERM_TUNING_ROWS",
    "SOSP_TRAINING_MEASUREMENTS",
    "TRAINING_MEASUREMENTS",
    "TUNED_ON_TRAINING",
    "VALIDATION_SCORES",
    "hyperparameter_note",
    "notes_markdown",
]

TUNED_ON_TRAINING = (
    "tuned by grid search on a validation split carved from the training data (tuning.json): "
    "that choice read private records and is NOT accounted in epsilon_spent"
)
VALIDATION_SCORES = (
    "the trials' validation scores are measured on records carved from the training split, without "
    "noise: NOT private; the tuning runs are not accounted in epsilon"
)
DEMO_SELECTION = (
    "fixed in code (privopt.experiments.demo.DEMO_HYPERPARAMETERS), chosen by the developers on "
    "validation splits of digits-st (docs/results/dro.md, 'Demo'): that choice read these records "
    "and is NOT accounted in epsilon_spent"
)
DRO_BUDGET_DEFAULTS = (
    "the budget's defaults (privopt.experiments.dro_protocol.BUDGETS), chosen by the developers on "
    "validation splits carved from the training data of mnist-st, fashion-mnist and cifar10-st "
    "(docs/results/dro-history.md): on these datasets that choice read private records and is NOT "
    "accounted in epsilon_spent"
)
TRAINING_MEASUREMENTS = (
    "grad_norm (‖∇ₓΨ_KL‖), dro_lam_star and the MIA AUCs are computed on the training records "
    "without noise: NOT private, research measurements of the methods (docs/privacy.md, 'Diagnostics')"
)


SOSP_TRAINING_MEASUREMENTS = (
    "grad_norm, hessian_min_eig and lanczos_converged (results.jsonl) are measured on training records "
    "without noise: NOT private, research measurements of the released models (docs/privacy.md, 'Diagnostics')"
)


ERM_TRAINING_MEASUREMENTS = (
    "F* (training) with its solver's certificate, the optimality gaps, their curves and the comparisons "
    "built on them (results.jsonl, summary, figures) are computed on the training rows without noise: NOT "
    "private, research measurements of the excess empirical risk the paper's bounds are about "
    "(docs/privacy.md, 'Diagnostics')"
)


ERM_TUNING_ROWS = (
    "chosen on the tuning rows, the next n_tune rows of the same Covertype file in keyed-hash order, "
    "treated as public: that choice, F* (tuning) and the tuning gaps read those rows without noise and "
    "are NOT accounted in epsilon_spent; the split is count-based (a row added to the file can move a "
    "training row into the tuning rows), so the guarantee is about a row of the training set as selected, "
    "not about a row of the file (docs/algorithms/erm.md, 'The Covertype comparison')"
)


DRO_DEFAULTS_CHOSEN_ON = ("mnist-st", "fashion-mnist", "cifar10-st")


def dro_defaults_note(dataset: object) -> str | None:
    """:data:`DRO_BUDGET_DEFAULTS` for a dataset the DRO budget's defaults were chosen on, else None.

    Example:
        >>> dro_defaults_note("mnist-st") == DRO_BUDGET_DEFAULTS, dro_defaults_note("digits-st")
        (True, None)
    """
    return DRO_BUDGET_DEFAULTS if isinstance(dataset, str) and dataset in DRO_DEFAULTS_CHOSEN_ON else None


def hyperparameter_note(tuning: dict[str, Any], *, defaults_note: str | None = None) -> str | None:
    """The note for a reproduction's tuning report (``tuning.json``): its ``selection`` when it has
    one (``None``: no private record was read, e.g. tuned on independent data), else
    :data:`TUNED_ON_TRAINING` for a tuned report, ``defaults_note`` for budget defaults (where they
    were chosen, if on this data) and ``None`` for given values."""
    if "selection" in tuning:
        return tuning["selection"]
    if tuning.get("hyperparameters") == "budget defaults":
        return defaults_note
    return TUNED_ON_TRAINING if tuning.get("tuned") else None


def notes_markdown(meta: dict[str, Any]) -> str:
    """The privacy notes of a summary (``hyperparameter_tuning``, ``not_private``, ``plugins``) as Markdown lines."""
    lines = []
    if meta.get("plugins"):  # whose code ran: a plugin's algorithm is only as private as its release plan
        names = ", ".join(f"`{p}`" for p in meta["plugins"])
        lines.append(f"**Your code:** plugins {names} were imported (what they register is as private as its code).")
    if meta.get("hyperparameter_tuning"):
        lines.append(f"**Not accounted:** hyper-parameters {meta['hyperparameter_tuning']}.")
    if meta.get("not_private"):
        lines.append(f"**Not private:** {meta['not_private']}.")
    return "\n\n".join(lines)
