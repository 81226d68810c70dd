"""Baselines of Paper A besides the primal–dual reconstructions: DP-SGD on (x, η), and ERM.

* ``dp-sgd-joint``: DP-SGD on ``z = (x, η)`` for the ψ-dual objective, clipping the concatenated
  per-sample gradient ``(∇_x L, ∇_η L)`` as one vector.
* ``erm``: the non-private ERM reference (minibatch SGD on the mean loss).

``dp-sgda`` and ``private-diff`` live in :mod:`privopt.algorithms.dro_primal_dual` (re-exported
here). See ``docs/algorithms/dro.md`` ("Baselines").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import finite_or_none, mapping, param, positive, positive_int, text
from privopt.algorithms.dpsgd import SGD, DPSGDConfig, SGDConfig, _BatchAlgorithm
from privopt.algorithms.dro_common import dual_objective, weight_cap_value
from privopt.algorithms.dro_primal_dual import DPSGDA, PrivateDiff, project_mean_one
from privopt.algorithms.releases import ReleasePlan
from privopt.grads.engine import resolve_scale
from privopt.grads.flat import num_trainable
from privopt.grads.sums import BoundedSum
from privopt.objectives.divergences import get_divergence

__all__ = ["DPSGDA", "PrivateDiff", "DPSGDJoint", "DPSGDJointConfig", "ERM", "ERMConfig", "project_mean_one"]


@dataclass(frozen=True)
class DPSGDJointConfig(DPSGDConfig):
    """DP-SGD on (x, η): DP-SGD's fields plus ψ, λ, the η step and η_0 (default ``B/2``)."""

    epochs: float = param(20, positive, role="epochs")
    batch_size: int = param(128, positive_int, role="batch")
    divergence: str = param("kl", text)
    divergence_params: Mapping[str, Any] = param({}, mapping)
    lam: float = param(1e-3, positive, role="penalty")
    g_eta: float = param(1.0, positive)
    eta_lr: float = param(0.1, positive)
    eta_init: float | None = param(None, finite_or_none)
    loss_bound: float = param(10.0, positive)
    weight_cap: float = param(1e6, weight_cap_value, role="weight_cap")
    chunk_size: int = param(256, positive_int)

    def check(self) -> None:
        get_divergence(self.divergence, **self.divergence_params)


@register_algorithm
class DPSGDJoint(_BatchAlgorithm):
    """DP-SGD on the joint variable ``z = (x, η)`` of the ψ-dual objective.

    Per sample, ``(∇_x L, ∇_η L) = (a_i ∇ℓ_i, g_η(1 − a_i))`` with ``a_i = (ψ*)'((ℓ_i − g_η η)/λ)``
    is clipped as ONE (d+1)-vector to ``clip``; one Gaussian release per Poisson batch. x moves with
    a torch SGD step (``lr``, momentum, weight decay), η with ``eta_lr``.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> get_algorithm("dp-sgd-joint", epochs=2, batch_size=100).inventory(n=1000).steps[0].count
        20
    """

    name = "dp-sgd-joint"
    summary = "DP-SGD on (x, eta) for the psi-dual DRO objective"
    Config = DPSGDJointConfig

    def release_plan(self, n: int) -> ReleasePlan:
        return self._grad_plan(n, self.config.clip)

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self._objective = dual_objective(self.config)
        eta0 = self.config.eta_init
        self._eta = float(eta0) if eta0 is not None else self.config.loss_bound / 2  # default: mid loss range

    @property
    def eta(self) -> float:
        return float(self._eta)

    def joint_grad_sum(self, idx: torch.Tensor, *, eta: float, clip: float) -> BoundedSum:
        """``Σ_{i∈idx} Clip((∇_x L(x,η;ξ_i), ∇_η L(x,η;ξ_i)), C)`` as one float64 (d+1)-vector."""
        ctx, obj, chunk = self._ctx, self._objective, self.config.chunk_size
        total = torch.zeros(num_trainable(ctx.model) + 1, dtype=torch.float64)

        # One engine pass per chunk: the norm of the x-part a_i·∇ℓ_i and the loss give the joint
        # (d+1)-vector's norm, so its clip factor f_i scales the x-part after the pass
        # (GradEngine.scaled_sum) and the η-part b_i·f_i here.
        def joint_factors(losses: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
            b = obj.eta_grads(losses, eta).to(torch.float64)
            return torch.clamp(clip / torch.sqrt(norms.to(torch.float64).pow(2) + b.pow(2)).clamp_min(1e-300), max=1.0)

        for s in range(0, idx.numel(), chunk):
            sub = idx[s : s + chunk]
            res = ctx.engine.scaled_sum(
                ctx.model,
                ctx.loss_fn,
                ctx.x_train[sub],
                ctx.y_train[sub],
                scale=joint_factors,
                weights=lambda losses: obj.x_weights(losses, eta),
            )
            f = resolve_scale(joint_factors, res.losses, res.norms)
            total[:-1] += res.total.to(torch.float64)
            # f = 0 drops the record (non-finite norm or η-part): 0·NaN would be NaN, not 0.
            total[-1] += torch.where(f > 0, obj.eta_grads(res.losses, eta).to(torch.float64) * f, 0.0).sum()
        return BoundedSum(total, bound=clip)

    def step(self, t: int) -> dict[str, float]:
        eta = self._eta
        g = self.releases.phase("step").release("grad", lambda idx, c: self.joint_grad_sum(idx, eta=eta, clip=c))
        self._apply(g[:-1].to(torch.float32), t)
        self._eta = self._eta - self.config.eta_lr * float(g[-1])
        return {"eta": self._eta, "g_norm": float(g.norm())}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "eta": self._eta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._eta = float(state["eta"])


@dataclass(frozen=True)
class ERMConfig(SGDConfig):
    """The ERM reference's schedule (same fields as SGD, Paper A's defaults)."""

    epochs: float = param(20, positive, role="epochs")
    batch_size: int = param(128, positive_int, role="batch")


@register_algorithm
class ERM(SGD):
    """Non-private ERM reference: minibatch SGD on the mean loss (Poisson batches)."""

    name = "erm"
    private = False
    summary = "non-private ERM reference (minibatch SGD on the mean loss)"
    Config = ERMConfig
