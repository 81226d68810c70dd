"""Statistics a run releases before its first step: the feature mean and the class prior.

Both are full-batch Gaussian queries of the training split, planned with the algorithm's own
queries (one calibration, so the run's total ε stays the target), recorded in the ledger when drawn
and kept in the record's ``released`` section, from which a resumed run restores them instead of
drawing again. A non-private run uses the exact statistics; those go to the owner-only diagnostics,
never to ``released``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from privopt.config import RunConfig
from privopt.data.centering import FAMILY as CENTERING_FAMILY
from privopt.data.centering import FeatureCentering
from privopt.data.class_prior import FAMILY as PRIOR_FAMILY
from privopt.data.class_prior import LogitAdjustment
from privopt.errors import ConfigError
from privopt.privacy import Inventory

__all__ = ["PreTraining", "apply_pretraining", "plan_pretraining", "with_pretraining"]


@dataclass(frozen=True)
class PreTraining:
    """What a config asks to release before training (``None``: that release is off)."""

    centering: FeatureCentering | None = None
    adjustment: LogitAdjustment | None = None

    def planned_steps(self) -> tuple:
        """The releases that read the training split, as inventory steps."""
        steps = [self.centering.planned_step()] if self.centering is not None else []
        if self.adjustment is not None and self.adjustment.releases:
            steps.append(self.adjustment.planned_step())
        return tuple(steps)


def plan_pretraining(cfg: RunConfig, comm: Any) -> PreTraining:
    """The pre-training releases of ``cfg``, validated before any data is loaded."""
    plan = PreTraining(
        FeatureCentering.from_config(cfg.feature_centering), LogitAdjustment.from_config(cfg.logit_adjustment)
    )
    if comm is not None and plan.planned_steps():  # each process would draw its own statistic
        raise ConfigError(
            "feature_centering and a released logit_adjustment are not available in runs launched by torchrun "
            "(one process per client)"
        )
    return plan


def with_pretraining(inventory: Any, plan: PreTraining, algorithm: str) -> Any:
    """``inventory`` plus the pre-training releases (calibrated together)."""
    steps = plan.planned_steps()
    if inventory is None or not steps:
        return inventory
    if inventory.composition == "parallel":
        raise ConfigError(
            f"feature_centering and a released logit_adjustment are full-batch releases; algorithm {algorithm!r} "
            "accounts passes over disjoint parts (parallel composition), which cannot hold them"
        )
    return Inventory((*inventory.steps, *steps), composition=inventory.composition)


def _centred(data: Any, centering, calibration, ledger, *, rng, released) -> tuple[Any, dict]:
    if centering is None:
        return data, {}
    if released is not None and "feature_mean" in released:
        mean = torch.tensor(released["feature_mean"], dtype=torch.float32)
    elif calibration is None:
        mean = (centering.clipped_sum(data.x_train) / data.x_train.shape[0]).to(torch.float32).to(data.x_train.device)
        return _with_private(centering.apply(data, mean), feature_mean_exact=mean.cpu().tolist()), {}
    else:
        z = calibration.noise[CENTERING_FAMILY]
        mean = centering.release(data.x_train, noise_multiplier=z, ledger=ledger, rng=rng)
    mean = mean.to(data.x_train.device)
    return centering.apply(data, mean), {"feature_mean": mean.cpu().tolist()}


def _offsets(data: Any, adjustment, calibration, ledger, *, rng, released) -> tuple[Any, Any, dict]:
    """(data, offsets, released) of the logit adjustment; ``offsets`` is None without one."""
    if adjustment is None:
        return data, None, {}
    k, out = int(data.num_classes), {}
    if not adjustment.releases:
        prior = adjustment.prior
    elif released is not None and "class_counts" in released:  # a resumed run: released before
        out = {"class_counts": list(released["class_counts"])}
        prior = adjustment.prior_from(out["class_counts"])
    elif calibration is None:  # exact counts: a private statistic, diagnostics only
        counts = adjustment.counts(data.y_train, k)
        data, prior = _with_private(data, class_counts_exact=counts.tolist()), adjustment.prior_from(counts)
    else:
        z = calibration.noise[PRIOR_FAMILY]
        counts = adjustment.release(data.y_train, num_classes=k, noise_multiplier=z, ledger=ledger, rng=rng)
        prior, out = adjustment.prior_from(counts), {"class_counts": counts.tolist()}
    return data, adjustment.offsets(prior, num_classes=k).to(data.x_train.device), out


def _with_private(data: Any, **stats: Any) -> Any:
    meta = dict(data.meta)
    meta["private"] = {**meta.get("private", {}), **stats}
    return replace(data, meta=meta)


def apply_pretraining(
    cfg: RunConfig, data: Any, plan: PreTraining, calibration, ledger, *, rng, released
) -> tuple[Any, Any, dict]:
    """``(data, logit offsets, released)``: ``data`` centred on the released feature mean and the
    offsets of the logit adjustment (``None`` without one), drawn now and recorded in ``ledger``,
    or restored from the statistics a resumed run released before (``released``)."""
    data, out = _centred(data, plan.centering, calibration, ledger, rng=rng, released=released)
    data, offsets, prior_out = _offsets(data, plan.adjustment, calibration, ledger, rng=rng, released=released)
    return data, offsets, {**out, **prior_out}
