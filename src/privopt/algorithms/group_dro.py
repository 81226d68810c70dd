"""Online group DRO (Sagawa et al. 2020), the NON-PRIVATE worst-group reference (``group-dro``).

Each step samples a Poisson minibatch of the whole training set, computes every group's mean loss
on it, moves the group weights by multiplicative weights towards the groups with high loss
(``q_g ∝ q_g·exp(η_q·ℓ̂_g)``, :func:`~privopt.algorithms.worst_group_common.hedge_step`), and takes
an SGD step on ``Σ_g q_g ℓ̂_g``. It reads the data without noise: a reference for what the DP
worst-group methods give up (``docs/algorithms/worst_group.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import RunContext, register_algorithm
from privopt.algorithms.config import param, positive
from privopt.algorithms.dpsgd import SGD, SGDConfig
from privopt.algorithms.worst_group_common import group_ids, hedge_step

__all__ = ["GroupDRO", "GroupDROConfig"]


@dataclass(frozen=True)
class GroupDROConfig(SGDConfig):
    """SGD's hyper-parameters plus ``group_lr`` (η_q, the group weights' step; Sagawa et al.: 0.01)."""

    group_lr: float = param(0.01, positive)


@register_algorithm
class GroupDRO(SGD):
    """Sagawa et al.'s online group DRO (non-private).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> get_algorithm("group-dro", group_lr=0.1).private
        False
    """

    name = "group-dro"
    summary = "online group DRO of Sagawa et al. (non-private worst-group reference)"
    Config = GroupDROConfig

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.groups, self.num_groups = group_ids(ctx)
        self.q = np.full(self.num_groups, 1.0 / self.num_groups)

    def step(self, t: int) -> dict[str, float]:
        ctx = self._ctx
        idx = self._sampler.sample()
        if idx.numel() == 0:
            return {}
        losses = ctx.loss_fn(ctx.model(ctx.x_train[idx]), ctx.y_train[idx])
        g = self.groups[idx]
        counts = torch.bincount(g, minlength=self.num_groups).clamp_min(1).to(losses.dtype)
        means = torch.zeros(self.num_groups, dtype=losses.dtype).index_add(0, g, losses) / counts
        self.q = hedge_step(self.q, means.detach().double().numpy(), step=self.config.group_lr)
        weights = torch.as_tensor(self.q, dtype=losses.dtype)
        objective = (weights[g] * losses / counts[g]).sum()
        self._schedule_lr(t)
        self._opt.zero_grad(set_to_none=True)
        objective.backward()
        self._opt.step()
        return {"batch_objective": float(objective.detach())}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "q": self.q.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.q = np.asarray(state["q"], dtype=np.float64)
