"""DP feature centring: subtract a privately released mean of the training features from every split.

Tramèr & Boneh ("Differentially private learning needs better features", ICLR 2021) normalise
scattering features with statistics of the training data; those statistics are data-dependent, so
privopt releases them with the Gaussian mechanism and charges them to the run. Only the per-coordinate
mean is released: on mnist-st it carries the whole gain of the exact standardisation (dividing by
per-coordinate standard deviations gained nothing and their second moments are too small to release
accurately at d ≈ 4,000; ``docs/results/dro-history.md``, "Phase 10").

The release (one full-batch Gaussian query, planned with the algorithm's own queries so the run's
total ε stays the target):

* every training row is clipped to the declared L2 bound ``R`` (``norm_bound``; the scattering rows
  have norm exactly ``scale``, so clipping changes nothing there), hence the sum of the rows has
  add/remove sensitivity ``R`` (``2R`` for replace-one);
* ``mean = (Σ_i clip_R(x_i) + N(0, (z·R)² I)) / n`` with ``z`` the family ``feature_mean``'s
  multiplier, ``z = scale · noise_ratio`` of the run's calibration, as for every release: the
  accountant reads ``z`` against the add/remove bound ``R`` and itself doubles the sensitivity under
  replace-one (``docs/accounting.md``); ``n`` is public (``docs/privacy.md``);
* then every record of every split is centred, ``x − mean``, and (``renormalise``) rescaled to its
  own norm before centring: a per-record map with the released mean as a public constant, i.e.
  post-processing.

Example:
    >>> fc = FeatureCentering.from_config({"norm_bound": 1.0, "noise_ratio": 20.0})
    >>> fc.planned_step().mechanisms
    (('feature_mean', 20.0),)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from privopt.errors import ConfigError

__all__ = ["FAMILY", "FeatureCentering"]

FAMILY = "feature_mean"


def _positive(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"feature_centering.{key} must be a finite number > 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class FeatureCentering:
    """The private centring of a run (config key ``feature_centering``; ``docs/data.md``).

    Attributes:
        norm_bound: declared L2 bound ``R`` of a training row; rows are clipped to it before summing.
        noise_ratio: the release's noise multiplier relative to the run's calibrated scale (larger:
            less of the budget, a noisier mean).
        renormalise: keep each record's norm (the centred row is rescaled to the norm it had).
    """

    norm_bound: float
    noise_ratio: float
    renormalise: bool = True

    @classmethod
    def from_config(cls, d: Any) -> FeatureCentering | None:
        """The centring a config asks for (``None`` for an empty mapping: no centring)."""
        if not isinstance(d, dict):
            raise ConfigError(f"feature_centering must be a mapping, got {d!r}")
        if not d:
            return None
        unknown = sorted(set(d) - {"norm_bound", "noise_ratio", "renormalise"})
        missing = sorted({"norm_bound", "noise_ratio"} - set(d))
        if unknown or missing:
            problems = [f"{what} {keys}" for what, keys in (("unknown", unknown), ("missing", missing)) if keys]
            raise ConfigError(f"feature_centering takes norm_bound, noise_ratio and renormalise; {', '.join(problems)}")
        renorm = d.get("renormalise", True)
        if not isinstance(renorm, bool):
            raise ConfigError(f"feature_centering.renormalise must be true or false, got {renorm!r}")
        return cls(_positive("norm_bound", d["norm_bound"]), _positive("noise_ratio", d["noise_ratio"]), renorm)

    def planned_step(self):
        """The release in a run's inventory: one full-batch Gaussian query of family ``feature_mean``."""
        from privopt.privacy import FullBatch, PlannedStep

        return PlannedStep(FullBatch(), ((FAMILY, self.noise_ratio),), 1)

    def clipped_sum(self, x: torch.Tensor) -> torch.Tensor:
        """``Σ_i clip_R(x_i)`` in float64 (each row contributes at most ``R``: the declared sensitivity)."""
        rows = x.reshape(x.shape[0], -1).to(torch.float64)
        factors = (self.norm_bound / rows.norm(dim=1).clamp_min(1e-300)).clamp(max=1.0)
        return (rows * factors[:, None]).sum(0)

    def release(self, x: torch.Tensor, *, noise_multiplier: float, ledger, rng) -> torch.Tensor:
        """The noisy mean of the training rows ``x``; the step is recorded in ``ledger`` first."""
        from privopt.grads.release import draw_gaussian_noise  # the one privacy-noise primitive
        from privopt.privacy import FullBatch, Gaussian, Step

        ledger.record(Step(FullBatch(), (Gaussian(noise_multiplier, name=FAMILY),)))
        # z·R under either relation: under replace-one the accountant itself reads it against 2R.
        std = noise_multiplier * self.norm_bound
        total = self.clipped_sum(x)
        noise = draw_gaussian_noise(tuple(total.shape), std=std, rng=rng, dtype=torch.float64)
        return ((total + noise.to(total.device)) / x.shape[0]).to(torch.float32)

    def centre(self, x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """``x − mean`` per record (rescaled to each record's own norm with ``renormalise``)."""
        if x.shape[0] == 0:
            return x
        flat = x.reshape(x.shape[0], -1)
        out = flat - mean.to(flat.dtype)
        if self.renormalise:
            out = out * (flat.norm(dim=1, keepdim=True) / out.norm(dim=1, keepdim=True).clamp_min(1e-12))
        return out.reshape(x.shape)

    def apply(self, data: Any, mean: torch.Tensor) -> Any:
        """``data`` with every split centred on the released ``mean`` (and the fact in its public meta)."""
        if tuple(mean.shape) != (math.prod(data.input_shape),):
            raise ConfigError(f"a released feature mean of shape {tuple(mean.shape)} does not fit {data.input_shape}")
        splits = {f: self.centre(getattr(data, f), mean) for f in ("x_train", "x_val", "x_test")}
        meta = dict(data.meta)
        meta["public"] = {**meta.get("public", {}), "feature_centering": dataclasses.asdict(self)}
        return dataclasses.replace(data, **splits, meta=meta)
