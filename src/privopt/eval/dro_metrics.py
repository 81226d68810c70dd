"""Run metrics of the DRO experiments, which the training loop registers (``docs/privacy.md``,
"Diagnostics").

Both read the private training data without noise, so both are registered with
``reads_private_data=True``: a run computes them only with ``non_private_diagnostics: true`` and
writes them to ``diagnostics.NOT_PRIVATE.json``, never to its public record.

* ``grad_norm`` (every evaluation): ``‖∇ₓΨ_KL(x)‖`` on the FULL training set, with
  ``Ψ_KL(x) = min_{λ≥λ0} λ·log mean_i exp(ℓ_i/λ) + λρ`` — the same objective for every method, so
  the curves are comparable across methods (evaluation only, non-private).
* ``mia`` (once, at the end): a black-box loss attack's ROC AUC (members = training points,
  non-members = held-out test points), next to the DP cap ``e^ε/(1+e^ε) + δ`` and a
  3-standard-error allowance.

Why the attack sets are *class-matched*: the "-ST" datasets train on an imbalanced split but test
on a rebalanced one, so a raw train-vs-test comparison would let the attack win by recognising the
minority class (higher loss, over-represented among non-members) even against a model that
memorised nothing. The DP cap only speaks about members and non-members drawn from the SAME
distribution, so both sides are subsampled (seeded) to the training split's label proportions.
Within a class, test and training images come from the same source distribution.

Select them per run with ``RunConfig.metrics = ["grad_norm", "mia"]`` and
``non_private_diagnostics: true``. The KL-DRO constants are
read from the run's algorithm hyper-parameters (``rho``, ``lam0``, ``loss_bound``) and default to
Paper A's ``ρ = 0.5``, ``λ0 = 1e−3``.

Example:
    >>> from privopt.training import available_run_metrics
    >>> {"grad_norm", "mia"} <= set(available_run_metrics())
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["DEFAULT_LAM0", "DEFAULT_RHO", "class_matched_indices", "grad_norm_metric", "mia_metric"]

DEFAULT_RHO = 0.5
DEFAULT_LAM0 = 1e-3
MIA_NUM_SE = 3.0
MIA_MAX_PER_SIDE = 10_000  # Paper A's attack uses 10,000 members / non-members


def _dro_constants(record: dict[str, Any]) -> tuple[float, float, float | None]:
    """(ρ, λ0, loss bound) of the run: algorithm hyper-parameters, else Paper A's values.

    Non-DRO methods (DP-SGD, ERM) have no ρ/λ0; the metric still uses Paper A's constants so all
    methods are measured on the same objective.
    """
    hp = dict(record.get("config", {}).get("algorithm_params", {}))
    hp.update(record.get("hyperparameters") or {})
    rho = float(hp.get("rho", DEFAULT_RHO))
    lam0 = float(hp.get("lam0", DEFAULT_LAM0))
    bound = hp.get("loss_bound")
    return rho, lam0, (float(bound) if isinstance(bound, (int, float)) else None)


def grad_norm_metric(*, model, loss_fn, data, record) -> dict[str, float]:
    """``{"grad_norm": ‖∇ₓΨ_KL‖, "dro_lam_star": λ*, "dro_psi": Ψ_KL}`` on the full training set."""
    from privopt.eval.gradnorm import kl_dro_stats

    rho, lam0, bound = _dro_constants(record)
    st = kl_dro_stats(model, loss_fn, data.x_train, data.y_train, lam0=lam0, rho=rho, loss_bound=bound)
    return {"grad_norm": st.grad_norm, "dro_lam_star": st.lam_star, "dro_psi": st.psi}


def class_matched_indices(
    y_members: torch.Tensor,
    y_non_members: torch.Tensor,
    *,
    num_classes: int,
    seed: int = 0,
    max_per_side: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of equally sized member / non-member subsets, both with the members' label mix.

    The common size N is the largest with ``round(N·p_c)`` records of every class c available on
    both sides (``p_c`` = the members' label proportions), capped by ``max_per_side``.

    Example:
        >>> import torch
        >>> ym = torch.tensor([0] * 90 + [1] * 10)
        >>> yn = torch.tensor([0] * 50 + [1] * 50)
        >>> a, b = class_matched_indices(ym, yn, num_classes=2)
        >>> len(a) == len(b), int((yn[b] == 1).sum()), int((ym[a] == 1).sum())
        (True, 6, 6)
    """
    ym, yn = np.asarray(y_members), np.asarray(y_non_members)
    cm = np.bincount(ym, minlength=num_classes)
    cn = np.bincount(yn, minlength=num_classes)
    p = cm / cm.sum()
    present = p > 0
    n_common = int(np.floor(np.min(np.minimum(cm, cn)[present] / p[present])))
    if max_per_side is not None:
        n_common = min(n_common, int(max_per_side))
    rng = np.random.default_rng(seed)
    take_m, take_n = [], []
    for c in np.flatnonzero(present):
        k = int(min(round(n_common * p[c]), cm[c], cn[c]))
        take_m.append(rng.choice(np.flatnonzero(ym == c), size=k, replace=False))
        take_n.append(rng.choice(np.flatnonzero(yn == c), size=k, replace=False))
    return np.concatenate(take_m), np.concatenate(take_n)


def mia_metric(*, model, loss_fn, data, record) -> dict[str, float]:
    """Loss-attack AUC on class-matched members (train) vs non-members (test) and the DP cap.

    Returns ``mia_auc``, ``mia_n`` (records per side) and, for private runs, ``mia_bound``,
    ``mia_slack`` and ``mia_within_bound`` (1.0 / 0.0). Non-private runs report the AUC only.
    """
    from privopt.eval.mia import dp_auc_bound, hanley_mcneil_se, mia_auc

    seed = 0  # one fixed (public) choice of the attack's subsample for every run, as in all results so far
    im, inn = class_matched_indices(
        data.y_train, data.y_test, num_classes=data.num_classes, seed=seed, max_per_side=MIA_MAX_PER_SIDE
    )
    im_t, in_t = torch.from_numpy(im), torch.from_numpy(inn)
    auc = mia_auc(
        model,
        loss_fn,
        members=(data.x_train[im_t], data.y_train[im_t]),
        non_members=(data.x_test[in_t], data.y_test[in_t]),
        balance=False,
        seed=seed,
    )
    out = {"mia_auc": auc, "mia_n": float(len(im))}
    priv = record.get("privacy") or {}
    if priv.get("private"):
        bound = dp_auc_bound(priv["epsilon_spent"], priv["delta"])
        slack = MIA_NUM_SE * hanley_mcneil_se(bound, len(im), len(inn))
        out.update(mia_bound=bound, mia_slack=slack, mia_within_bound=float(auc <= bound + slack))
    return out
