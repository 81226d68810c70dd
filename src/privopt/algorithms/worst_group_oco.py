"""Worst-group risk minimisation with a DP online learner against EXP3 (``dp-oco-exp3``).

A zero-sum game between the model (w-player) and the group weights (λ-player), played over one
pass of fresh records. Round ``t`` picks a group ``i_t ~ λ_t`` and draws two disjoint fresh
batches from it with the group oracle (:class:`privopt.group_sampling.GroupOracles`; expected
``batch_size`` records each):

* the w-player runs DP-FTRL (tree aggregation): the batch ``x_t^-``'s sum of per-sample clipped
  gradients at ``w_t`` is leaf ``t`` of a tree of noisy prefix sums, and
  ``w_{t+1} = Proj_W(w_1 − γ·Σ̂_t / m)``;
* the λ-player runs EXP3 on the bandit feedback ``ℓ̃_t = U − ℓ̂_t``, ``ℓ̂_t`` the mean loss of the
  batch ``x_t^+`` at ``w_t`` (clamped to ``[0, B]``) privatised with Laplace noise;
  ``λ_{i_t} ← λ_{i_t}·exp(−η ℓ̃_t / λ_{i_t})``, normalised (:func:`exp3_step`).

Each draw takes the same share ``w = batch_size·p/n`` of the chosen group's records (a group of
average size n/p gives ``batch_size`` records), so every group can be chosen in about ``T/p``
rounds before its records are used up. Leaves are divided by ``m = batch_size`` for every group
(the tree's noise is calibrated to one per-leaf bound, so leaves cannot carry group-dependent
normalisers): group i's gradient is scaled by n̂_i·p/n, as in Noisy-SGD-MGR's ``"common"`` mode.

Every record is used at most once: in one tree leaf or in one Laplace release. The tree is one
``TreeAggregation`` event; the Laplace releases, on disjoint records, are ONE Laplace event
(parallel composition); the two streams are composed (conservative: a record is only ever in
one of them). The paper's oracles never run dry; ours hold each group's records once, so the game
ENDS the first time the chosen group has no two draws left (a public event: cursors move by
public widths) and the remaining rounds do nothing. Output: the average of the iterates played.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privopt.algorithms.base import RunContext, register_algorithm
from privopt.algorithms.config import one_of, optional_positive, param, positive, positive_int
from privopt.algorithms.releases import DrawnBatch, Fixed, Phase, Query
from privopt.algorithms.worst_group_common import WorstGroupAlgorithm, WorstGroupConfig, exp3_step
from privopt.grads.flat import num_trainable
from privopt.grads.sums import BoundedSum, batch_losses, clamped_losses
from privopt.group_sampling import GroupOracles

__all__ = ["DPOCOEXP3", "DPOCOEXP3Config"]

TREE, BANDIT = "ftrl-tree", "bandit-loss"


def _optional_int(name: str, value: Any) -> int | None:
    return None if value is None else positive_int(name, value)


@dataclass(frozen=True)
class DPOCOEXP3Config(WorstGroupConfig):
    """Hyper-parameters of DP-OCO + EXP3.

    Attributes:
        lr: DP-FTRL's step γ.
        clip: per-sample gradient clip threshold (the Lipschitz constant L).
        batch_size: expected records per round and stream for a group of average size (width ``batch_size·p/n``).
        rounds: T (``None``: ⌊n / (2·batch_size)⌋, one pass over the data in expectation).
        lam_lr: EXP3's step (``None``: ``√(ln p / (p T U²))``, ``U = B + 2·(Laplace scale of ℓ̂)·ln T``).
        loss_noise_ratio: the Laplace multiplier over the tree's (``None``: ``1/√depth``, depth =
            ⌈log2(T+1)⌉ nodes per leaf, which equalises the two streams' Rényi divergences to first order).
        output: ``"average"`` (the paper) or ``"last"``.
    """

    lr: float = param(0.1, positive, role="lr")
    clip: float = param(1.0, positive, role="clip")
    batch_size: int = param(32, positive_int, role="batch")
    rounds: int | None = param(None, _optional_int)
    lam_lr: float | None = param(None, optional_positive)
    loss_noise_ratio: float | None = param(None, optional_positive)
    output: str = param("average", one_of("average", "last"), role="output")


@register_algorithm
class DPOCOEXP3(WorstGroupAlgorithm):
    """DP-OCO (DP-FTRL with tree aggregation) against EXP3 (see the module docstring).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("dp-oco-exp3", batch_size=10, group_sizes="public")
        >>> [(s.mechanisms[0][0], s.count) for s in algo.inventory(n=1000).steps]
        [('ftrl-tree', 1), ('bandit-loss', 1)]
    """

    name = "dp-oco-exp3"
    summary = "DP-OCO + EXP3: DP-FTRL (tree aggregation) model player, EXP3 on Laplace-noised losses"
    Config = DPOCOEXP3Config

    def steps_for(self, *, n: int) -> int:
        c = self.config
        return c.rounds if c.rounds is not None else max(1, n // (2 * c.batch_size))

    def _release_phases(self, n: int) -> tuple[Phase, ...]:
        c, T = self.config, self.steps_for(n=n)
        depth = math.ceil(math.log2(T + 1))
        ratio = c.loss_noise_ratio or 1.0 / math.sqrt(depth)
        tree = Query(TREE, Fixed(c.clip), batch=DrawnBatch(n), mechanism="tree", tree_steps=T)
        bandit = Query(
            BANDIT, Fixed(c.loss_bound), batch=DrawnBatch(n), mechanism="laplace", disjoint=True, ratio=ratio
        )
        return (Phase("ftrl", 1, (tree,)), Phase("round", T, (bandit,)))

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.oracles = GroupOracles(self.groups, num_groups=self.num_groups, rng=ctx.sampler_rng)
        self.lam = np.full(self.num_groups, 1.0 / self.num_groups)
        self.tree = None
        self.rounds_played = 0
        self.stopped = False

    def _exp3_constants(self) -> tuple[float, float]:
        """(EXP3's step η, the shift U that keeps the noisy bandit losses non-negative w.h.p.)."""
        c = self.config
        T, p = self.num_steps(), self.num_groups
        smallest = self._width() * float(self.group_sizes().min())  # expected + batch of the smallest group
        scale = self.releases.multiplier(BANDIT) * c.loss_bound / smallest if self.private else 0.0
        U = c.loss_bound + 2.0 * scale * math.log(max(T, 2))
        step = c.lam_lr if c.lam_lr is not None else math.sqrt(math.log(max(p, 2)) / (p * T * U**2))
        return step, U

    def _width(self) -> float:
        """The share of a group's records one draw takes (public: batch_size, p and n)."""
        return min(0.5, self.config.batch_size * self.num_groups / self._ctx.n)

    def _pick(self) -> tuple[int, float] | None:
        """``i_t ~ λ_t`` with its probability, or None once the game has ended: the paper's oracles
        never run dry, so the game stops the first time the chosen group has no two draws left."""
        if self.stopped:
            return None
        u = float(self._ctx.sampler_rng.uniform(1))
        group = min(int(np.searchsorted(np.cumsum(self.lam), u, side="right")), self.num_groups - 1)
        if not self.oracles.can_draw(group, 2 * self._width()):
            self.stopped = True  # public: cursors move by public widths
            return None
        return group, float(self.lam[group])

    def step(self, t: int) -> dict[str, float]:
        c, ctx = self.config, self._ctx
        if self.tree is None:
            self.tree = self.releases.tree(TREE, bound=c.clip, dim=num_trainable(ctx.model))
        picked = self._pick()
        if picked is None:
            return {}
        group, prob = picked
        minus, plus = self.oracles.draw(group, width=self._width()), self.oracles.draw(group, width=self._width())
        w = self._w()
        self._accumulate(w)
        leaf = self._grad_sum(minus, clip=c.clip) if minus.numel() else BoundedSum(torch.zeros(w.numel()), c.clip)
        prefix = self.tree.add(leaf, indices=minus)
        noisy_sum = float(self.releases.laplace(BANDIT, self._loss_sum(plus), indices=plus))
        loss_hat = noisy_sum / (self._width() * float(self.group_sizes()[group]))  # the batch's mean loss
        self._set_w(self._project(self._w0 - c.lr * (prefix / c.batch_size).to(w.dtype)))
        step, shift = self._exp3_constants()
        self.lam = exp3_step(self.lam, arm=group, loss=shift - loss_hat, prob=prob, step=step)
        self.rounds_played += 1
        return {"group": float(group), **{f"lambda_{i}": float(v) for i, v in enumerate(self.lam)}}

    def _loss_sum(self, idx: torch.Tensor) -> BoundedSum:
        ctx, B = self._ctx, self.config.loss_bound
        losses = batch_losses(ctx.model, ctx.loss_fn, ctx.x_train[idx], ctx.y_train[idx], chunk=self.config.chunk_size)
        return BoundedSum(clamped_losses(losses, B).sum().reshape(1), bound=B)

    def finalize(self) -> None:
        if self.config.output == "average":
            self._set_w(self.average_iterate())

    def _state(self) -> dict[str, Any]:
        return {
            "oracles": self.oracles.state_dict(),
            "lam": self.lam.copy(),
            "tree": None if self.tree is None else self.tree.state_dict(),
            "rounds_played": self.rounds_played,
            "stopped": self.stopped,
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self.oracles.load_state_dict(state["oracles"])
        self.lam = np.asarray(state["lam"], dtype=np.float64)
        self.rounds_played, self.stopped = int(state["rounds_played"]), bool(state["stopped"])
        if state["tree"] is not None:  # reopened as checkpointed: recorded once, before the checkpoint
            self.tree = self.releases.tree(
                TREE, bound=self.config.clip, dim=num_trainable(self._ctx.model), state=state["tree"]
            )
