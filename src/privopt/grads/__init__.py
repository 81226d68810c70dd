"""Per-sample gradients, clipping and clipped (noisy) sums behind one engine interface."""

from privopt.grads.engine import (
    ClippedSum,
    GradEngine,
    VmapEngine,
    available_engines,
    clip_factors,
    current_params,
    flat_param_names,
    get_engine,
    register_engine,
    resolve_weights,
)
from privopt.grads.ghost import GhostEngine
from privopt.grads.validate import validate_model

__all__ = [
    "ClippedSum",
    "GhostEngine",
    "GradEngine",
    "VmapEngine",
    "available_engines",
    "clip_factors",
    "current_params",
    "flat_param_names",
    "get_engine",
    "register_engine",
    "resolve_weights",
    "validate_model",
]
