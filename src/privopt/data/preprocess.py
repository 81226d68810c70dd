"""Feature scaling of the loading pipeline: public constants by default, data statistics only on request.

Modes (``load_dataset(scaling=...)``):

* ``"public"`` (default): clip into the dataset's public bounds, then ``(x - center) / scale``
  with published constants (see :mod:`privopt.data.public`).
* ``"unit"``: clip into the public bounds and map them to [0, 1] (pixels / 255).
* ``"none"``: the values as parsed (no clipping).
* ``"data"``: standardise with the TRAINING split's mean/std. Not differentially private: one
  record moves every record's scaling. Emits :class:`PrivatePreprocessingWarning` and marks the
  dataset's public metadata with ``"private_preprocessing": True``.

Every mode except ``"data"`` transforms each record on its own, with constants fixed before the
data is read. See ``docs/data.md`` ("Public preprocessing").
"""

from __future__ import annotations

import warnings

import numpy as np

from privopt.data.public import SCALING_MODES, PublicScaling
from privopt.errors import ConfigError, PrivoptWarning

__all__ = ["PrivatePreprocessingWarning", "scale_splits", "unit_norm_rows", "check_mode"]


class PrivatePreprocessingWarning(PrivoptWarning):
    """A pipeline step looked at private statistics (e.g. the training split's mean/std)."""


def check_mode(mode: object) -> str:
    if mode not in SCALING_MODES:
        raise ConfigError(f"scaling must be one of {', '.join(map(repr, SCALING_MODES))}, got {mode!r}")
    return str(mode)


def unit_norm_rows(x: np.ndarray) -> np.ndarray:
    """Scale every non-zero record to unit L2 norm (a per-record operation, so public)."""
    flat = x.reshape(x.shape[0], -1)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    return (flat / np.where(norms > 0, norms, 1.0)).reshape(x.shape).astype(np.float32)


def scale_splits(
    xs: dict[str, np.ndarray], *, scaling: PublicScaling, mode: str, kind: str, unit_norm: bool = False
) -> tuple[dict[str, np.ndarray], list[str], dict, dict]:
    """Scale every split; returns ``(scaled, steps, public_facts, private_stats)``.

    ``xs`` must hold a ``"train"`` split. ``unit_norm`` (public bounds to [0, 1], then unit-norm
    rows) needs mode ``"public"`` or ``"unit"``.
    """
    check_mode(mode)
    public: dict = {"scaling_mode": mode, "constants": scaling.describe()}
    private: dict = {}
    if unit_norm:
        if mode not in ("public", "unit"):
            raise ConfigError(f"unit_norm needs scaling 'public' or 'unit' (public bounds), got {mode!r}")
        out = {k: unit_norm_rows(scaling.apply(x, mode="unit")) for k, x in xs.items()}
        steps = [
            f"clipped into public bounds and min-max scaled to [0, 1] with them ({scaling.source}); "
            "then every record scaled to unit L2 norm"
        ]
        return out, steps, {**public, "scaling_mode": "unit+unit_norm"}, private
    if mode == "data":
        return _standardise_with_training_statistics(xs, scaling=scaling, kind=kind, public=public)
    out = {k: scaling.apply(x, mode=mode) for k, x in xs.items()}
    steps = {
        "public": [f"clipped into public bounds, then (x - center) / scale with public constants ({scaling.source})"],
        "unit": [f"clipped into public bounds and min-max scaled to [0, 1] with them ({scaling.source})"],
        "none": ["no scaling (values as parsed): scale them with public constants before training"],
    }[mode]
    return out, steps, public, private


def _standardise_with_training_statistics(xs, *, scaling: PublicScaling, kind: str, public: dict):
    warnings.warn(
        "scaling='data' standardises features with the mean/std of the PRIVATE training split: this "
        "is not differentially private (one record moves every record's scaling) and voids the run's "
        "privacy guarantee. Use the default scaling='public' (public constants).",
        PrivatePreprocessingWarning,
        stacklevel=4,
    )
    clipped = {k: scaling.apply(x, mode="unit") for k, x in xs.items()}  # bounded first
    axes = (0, 2, 3) if kind == "image" else (0,)
    mean = clipped["train"].mean(axis=axes, keepdims=True, dtype=np.float64)
    std = clipped["train"].std(axis=axes, keepdims=True, dtype=np.float64)
    std = np.where(std < 1e-12, 1.0, std)
    out = {k: ((x - mean) / std).astype(np.float32) for k, x in clipped.items()}
    unit = "channel" if kind == "image" else "feature"
    steps = [
        f"clipped into public bounds and scaled to [0, 1] ({scaling.source})",
        f"NOT PRIVATE: standardised per {unit} with the training split's mean/std",
    ]
    stats = {"standardization": {"mean": mean.ravel().tolist(), "std": std.ravel().tolist()}}
    return out, steps, {**public, "private_preprocessing": True}, stats
