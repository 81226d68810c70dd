"""Objectives: ψ-divergences, the DRO dual ``L(x, η)`` and the KL compositional ``Ψ(x, λ)``.

These modules handle only per-sample *scalars* (losses → weights, dual-variable gradients,
values); per-sample parameter gradients come from :mod:`privopt.grads` via ``weights=``.
"""

from privopt.objectives.compositional import KLCompositional
from privopt.objectives.divergences import (
    KL,
    ChiSquare,
    CressieRead,
    CVaR,
    Divergence,
    KLRegularizedCVaR,
    available_divergences,
    check_divergence,
    get_divergence,
    register_divergence,
)
from privopt.objectives.dual import DualObjective

__all__ = [
    "CVaR",
    "ChiSquare",
    "CressieRead",
    "Divergence",
    "DualObjective",
    "KL",
    "KLCompositional",
    "KLRegularizedCVaR",
    "available_divergences",
    "check_divergence",
    "get_divergence",
    "register_divergence",
]
