"""Post-hoc logit adjustment: predict with ``logits − τ·log π``, π the training split's class prior.

A model trained on imbalanced data learns the training prior into its logits, so its decision
threshold leans towards the majority class. Subtracting ``τ·log π_k`` from the logit of class ``k``
(Menon et al., "Long-tail learning via logit adjustment", ICLR 2021) removes a learned prior, which
is what a class-balanced error asks for; the model itself is unchanged. ``docs/data.md``, "Logit
adjustment", has the measured effect.

The prior π is a statistic of the private training split, so it is either

* **public** (``prior``: class shares the user knows without reading the records, e.g. the
  imbalance ratio a benchmark was built with), or
* **released** (``noise_ratio``): the label histogram with the Gaussian mechanism, planned with the
  algorithm's queries so the run's total ε stays the target. One record changes one count by 1
  (add/remove: L2 sensitivity 1) or two counts by 1 (replace-one: √2); the counts get
  ``N(0, z²)`` each, with ``z = scale · noise_ratio`` of the run's calibration. As for every release,
  the accountant reads ``z`` against the add/remove bound (1) and doubles that bound under
  replace-one, a safe bound for the true √2. Counts below 1
  are raised to 1 before normalising (post-processing), so no class gets ``log 0``.

Example:
    >>> la = LogitAdjustment.from_config({"prior": [0.9, 0.1]})
    >>> [round(v, 4) for v in la.offsets(la.prior, num_classes=2).tolist()]  # τ·log π
    [-0.1054, -2.3026]
    >>> LogitAdjustment.from_config({"noise_ratio": 10.0}).planned_step().mechanisms
    (('class_counts', 10.0),)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from privopt.errors import ConfigError

__all__ = ["FAMILY", "AdjustedLogits", "LogitAdjustment"]

FAMILY = "class_counts"
_KEYS = ("tau", "prior", "noise_ratio")


def _positive(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"logit_adjustment.{key} must be a finite number > 0, got {v!r}")
    return float(v)


def _prior(v: Any) -> tuple[float, ...]:
    if not isinstance(v, (list, tuple)) or len(v) < 2:
        raise ConfigError(f"logit_adjustment.prior must be a list of class shares (one per class), got {v!r}")
    return tuple(_positive("prior", p) for p in v)


def histogram_sensitivity(neighbouring: str) -> float:
    """L2 sensitivity of a label histogram: one count moves (add/remove) or two do (replace-one)."""
    from privopt.privacy.events import ADD_REMOVE, check_neighbouring

    return 1.0 if check_neighbouring(neighbouring) == ADD_REMOVE else math.sqrt(2.0)


@dataclass(frozen=True)
class LogitAdjustment:
    """The logit adjustment of a run (config key ``logit_adjustment``; ``docs/data.md``).

    Attributes:
        tau: the adjustment's strength τ (1: remove the prior exactly).
        prior: public class shares (normalised here); ``None``: the prior is released from the
            training labels with noise (``noise_ratio``).
        noise_ratio: the label histogram's noise multiplier relative to the run's calibrated scale.
    """

    tau: float = 1.0
    prior: tuple[float, ...] | None = None
    noise_ratio: float | None = None

    @classmethod
    def from_config(cls, d: Any) -> LogitAdjustment | None:
        """The adjustment a config asks for (``None`` for an empty mapping: predictions as trained)."""
        if not isinstance(d, dict):
            raise ConfigError(f"logit_adjustment must be a mapping, got {d!r}")
        if not d:
            return None
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ConfigError(f"logit_adjustment takes {', '.join(_KEYS)}; unknown {unknown}")
        if ("prior" in d) == ("noise_ratio" in d):
            raise ConfigError(
                "logit_adjustment needs exactly one of prior (public class shares) or noise_ratio "
                f"(release the training labels' histogram privately), got {d!r}"
            )
        prior = _prior(d["prior"]) if "prior" in d else None
        ratio = _positive("noise_ratio", d["noise_ratio"]) if "noise_ratio" in d else None
        return cls(_positive("tau", d.get("tau", 1.0)), prior, ratio)

    @property
    def releases(self) -> bool:
        """Whether the prior is a release of the training labels (it then costs privacy)."""
        return self.prior is None

    def planned_step(self):
        """The release in a run's inventory: one full-batch Gaussian query of family ``class_counts``."""
        from privopt.privacy import FullBatch, PlannedStep

        return PlannedStep(FullBatch(), ((FAMILY, self.noise_ratio),), 1)

    @staticmethod
    def counts(y: torch.Tensor, num_classes: int) -> torch.Tensor:
        """The exact label histogram (float64), the statistic the release noises."""
        return torch.bincount(y.reshape(-1).long().cpu(), minlength=num_classes).to(torch.float64)

    def release(self, y: torch.Tensor, *, num_classes: int, noise_multiplier: float, ledger, rng):
        """The noisy label histogram of ``y``; the step is recorded in ``ledger`` first."""
        from privopt.grads.release import draw_gaussian_noise  # the one privacy-noise primitive
        from privopt.privacy import FullBatch, Gaussian, Step

        ledger.record(Step(FullBatch(), (Gaussian(noise_multiplier, name=FAMILY),)))
        std = noise_multiplier * histogram_sensitivity("add_remove")  # the accountant scales for replace-one
        noise = draw_gaussian_noise((num_classes,), std=std, rng=rng, dtype=torch.float64).cpu()
        return self.counts(y, num_classes) + noise

    @staticmethod
    def prior_from(counts: Any) -> torch.Tensor:
        """Class shares from (possibly noisy) counts: each raised to at least 1, then normalised."""
        c = torch.as_tensor(counts, dtype=torch.float64).clamp_min(1.0)
        return c / c.sum()

    def offsets(self, prior: Any, *, num_classes: int) -> torch.Tensor:
        """``τ·log π`` per class, what :class:`AdjustedLogits` subtracts."""
        p = torch.as_tensor(prior, dtype=torch.float64)
        if tuple(p.shape) != (num_classes,):
            raise ConfigError(f"logit_adjustment: {p.numel()} class shares for a dataset of {num_classes} classes")
        return self.tau * torch.log(p / p.sum())


class AdjustedLogits(nn.Module):
    """``model(x) − offsets``: the released predictor of a run with a logit adjustment.

    A one-logit binary model (the logistic loss) predicts class 1 from a positive logit, so its
    single logit is shifted by ``offsets[1] − offsets[0]``.

    Example:
        >>> net = AdjustedLogits(nn.Identity(), torch.tensor([0.0, 1.0]))
        >>> net(torch.zeros(1, 2)).tolist(), net(torch.zeros(3)).tolist()
        ([[0.0, -1.0]], [-1.0, -1.0, -1.0])
    """

    def __init__(self, model: nn.Module, offsets: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("offsets", offsets.to(torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        if out.dim() == 1 or (out.dim() == 2 and out.shape[1] == 1 and self.offsets.numel() == 2):
            return out - (self.offsets[1] - self.offsets[0]).to(out.dtype)
        return out - self.offsets.to(out.dtype)
