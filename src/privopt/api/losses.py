"""Per-example losses for :class:`privopt.PrivacyEngine` and :func:`privopt.fit` (they live in
:mod:`privopt.objectives.losses`, below the training layer that also uses them)."""

from privopt.objectives.losses import LossFn, PerExampleLoss, per_sample_loss

__all__ = ["LossFn", "PerExampleLoss", "per_sample_loss"]
