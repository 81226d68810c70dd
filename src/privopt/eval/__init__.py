"""Evaluation: classification metrics, DRO gradient norms (non-private) and membership inference."""

from privopt.eval.gradnorm import KLDROStats, dual_grad_norm, kl_dro_grad_norm, kl_dro_stats
from privopt.eval.metrics import classification_metrics, group_accuracies, worst_group_accuracy
from privopt.eval.mia import dp_auc_bound, hanley_mcneil_se, mia_auc, mia_report

__all__ = [
    "KLDROStats",
    "classification_metrics",
    "dp_auc_bound",
    "dual_grad_norm",
    "group_accuracies",
    "hanley_mcneil_se",
    "kl_dro_grad_norm",
    "kl_dro_stats",
    "mia_auc",
    "mia_report",
    "worst_group_accuracy",
]
