"""Result rows of Paper A's reproduction runs: a run record as a flat row, a failed run's row,
the log line of each, and the tuning report (used by :mod:`privopt.experiments.dro_runner`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privopt.experiments.dro_protocol import METHOD_LABELS, Budget
from privopt.experiments.privacy_notes import VALIDATION_SCORES

__all__: list[str] = []  # helpers of dro_runner, not a public API

if TYPE_CHECKING:
    from privopt.experiments.dro_runner import RunSpec

Log = Callable[[str], None]


def result_row(
    method: str,
    spec: RunSpec,
    rec: dict,
    *,
    private: bool,
    n: int,
    hp: dict,
    epochs: float,
    epsilon,
    seed: int,
    pre: str,
) -> dict:
    """A flat result row (+ ``history``) from a run record."""
    m, p = rec["metrics"], rec["privacy"]
    row = {
        "dataset": spec.dataset_label,
        "method": method,
        "label": METHOD_LABELS.get(method, method),
        "private": private,
        "epsilon": epsilon if private else None,
        "delta": p["delta"] if private else None,
        "epsilon_spent": p["epsilon_spent"],
        "seed": seed,
        "n_train": n,
        "lr": hp["lr"],
        "clip": hp["clip"],
        "epochs": epochs,
        "steps": rec["steps_done"],
        **{f"{pre}_{k}": m.get(f"{pre}_{src}") for k, src in _METRIC_KEYS},
        **{k: m.get(k) for k in ("grad_norm", "dro_lam_star", "mia_auc", "mia_bound", "mia_slack")},
        "mia_within_bound": None if m.get("mia_within_bound") is None else bool(m["mia_within_bound"]),
    }
    if pre == "val":
        row["val_score"] = row["val_balanced_accuracy"]
    keys = ("step", "grad_norm", f"{pre}_accuracy", f"{pre}_roc_auc", f"{pre}_f1")
    row["history"] = [{k: h.get(k) for k in keys} for h in rec["history"]]
    return row


_METRIC_KEYS = (
    ("accuracy", "accuracy"),
    ("auc", "roc_auc"),
    ("f1", "f1"),
    ("worst_class_accuracy", "worst_class_accuracy"),
    ("balanced_accuracy", "balanced_accuracy"),
)


def failed_row(method: str, spec: RunSpec, *, private: bool, eps, seed: int, hp: dict, error: str, run_dir: Path):
    """The row of a run that raised (NaN metrics, the error)."""
    nan = math.nan
    metrics = ("test_accuracy", "test_auc", "test_f1", "test_worst_class_accuracy", "grad_norm", "wall_s")
    return {
        "dataset": spec.dataset_label,
        "method": method,
        "label": METHOD_LABELS.get(method, method),
        "private": private,
        "epsilon": eps,
        "delta": None,
        "epsilon_spent": None,
        "seed": seed,
        "lr": hp["lr"],
        "clip": hp["clip"],
        **dict.fromkeys(metrics, nan),
        **dict.fromkeys(("mia_auc", "mia_bound", "mia_slack", "mia_within_bound"), None),
        "steps": 0,
        "run_dir": str(run_dir),
        "error": error,
        "history": [],
    }


def finite(x: Any) -> bool:
    """A finite int or float (not None, NaN or ±inf)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


def log_row(say: Log, kind: str, row: dict) -> None:
    """One line per finished run (the parent's, whatever runs them)."""
    method, eps, seed = row["method"], row["epsilon"], row["seed"]
    if row.get("error"):
        say(f"  {kind} {method:20s} eps={eps} seed {seed}: FAILED ({row['error']})")
        return
    mia = "" if row["mia_auc"] is None else f", MIA AUC {row['mia_auc']:.3f}"
    if row["mia_auc"] is not None and row["mia_bound"] is not None:
        mia += f" (cap {row['mia_bound']:.3f})"
    eps_txt = "non-private" if eps is None else f"eps={eps:g} (spent {row['epsilon_spent']:.3f})"
    gn = row["grad_norm"]  # None: the metric was not asked for (it reads the training data)
    grad = "" if gn is None else f", grad norm {f'{gn:.3g}' if finite(gn) else 'nan'}"
    say(
        f"  {kind} {method:20s} {eps_txt:28s} seed {seed}: test acc {row['test_accuracy']:.4f}"
        f"{grad}{mia} ({row['model']}, {row['wall_s']:.1f} s)"
    )


def tuning_report(budget: Budget, methods, trials, best, wall: float, per_method_s) -> dict[str, Any]:
    """``tuning.json``: the grid, every trial and the best point per (method, ε)."""
    return {
        "grid": {"lr": list(budget.lrs), "clip": list(budget.clips), "weight_cap": list(budget.weight_cap_grid)},
        # at an ε a rule covers, the cap is the rule's, not tuned
        "weight_cap_rules": [list(rule) for rule in budget.weight_caps],
        "method_lr_grids": {m: list(budget.lrs_for(m)) for m in methods if budget.setting(m).lrs is not None},
        "trials_per_method": {m: sum(1 for t in trials if t["method"] == m) for m in methods},
        "tune_at": budget.tune_at,
        "tune_epochs": budget.tune_epochs,
        "tune_repeats": budget.tune_repeats,
        "validation": f"{budget.val_fraction:g} of the training split (stratified, seed 0); score = balanced "
        "validation accuracy (the -ST test splits are class-balanced while the validation split "
        "keeps the training imbalance, so plain accuracy would reward majority-class predictors)",
        "n_trials": len(trials),
        "wall_s": wall,
        "wall_s_per_method": per_method_s,
        "privacy_note": VALIDATION_SCORES,
        "best": [{"method": m, "epsilon": e, **hp} for (m, e), hp in best.items()],
        "trials": trials,
    }
