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
from privopt.grads.release import PrivateBatch, ReleaseEvent, observe_releases
from privopt.grads.sums import BoundedSum, as_bounded
from privopt.grads.validate import validate_model

__all__ = [
    "BoundedSum",
    "ClippedSum",
    "GhostEngine",
    "GradEngine",
    "PrivateBatch",
    "ReleaseEvent",
    "VmapEngine",
    "as_bounded",
    "available_engines",
    "clip_factors",
    "current_params",
    "flat_param_names",
    "get_engine",
    "observe_releases",
    "register_engine",
    "resolve_weights",
    "validate_model",
]
