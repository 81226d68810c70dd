"""Reuse, within one iteration, of a batch's rows and of its per-sample losses.

The DRO algorithms make several releases on one batch at one point (e.g. Recursive-SPIDER's v, s
and u refreshes at ``(x_t, λ_t)``): gathering the batch's rows and computing its losses once instead
of once per release changes no value (the same rows, the same losses), only the time. On a linear
head over 3,969 features, gathers and forward passes were most of a step.

Entries are keyed by the batch's *identity* (the index tensor the release hands to every statistic
of its group) and by the parameters' state: their storage and in-place version counters for the
model's own parameters, the identity and version of a flat vector otherwise. Any update of the
model, in place or not, therefore misses the memo. Nothing here is released or logged.
"""

from __future__ import annotations

import torch
from torch import nn

from privopt.grads.flat import trainable_parameters

__all__ = ["BatchMemo"]


class BatchMemo:
    """The last batch's rows and its losses at the last point they were computed at.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> memo = BatchMemo()
        >>> model, x, y = nn.Linear(2, 1), torch.randn(4, 2), torch.arange(4)
        >>> idx = torch.tensor([0, 2])
        >>> xb, _ = memo.rows(idx, x, y)
        >>> memo.rows(idx, x, y)[0] is xb
        True
        >>> memo.store_losses(idx, model, None, torch.zeros(2))
        >>> memo.losses(idx, model, None)
        tensor([0., 0.])
        >>> with torch.no_grad():
        ...     _ = model.weight.add_(1.0)  # the model moved: the losses are stale
        >>> memo.losses(idx, model, None) is None
        True
    """

    def __init__(self) -> None:
        self._rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # The batch whose losses are held, and per point key: (the flat vector, kept alive so that
        # its id is not reused; the losses). A correction holds two points, x_t and x_{t-1}.
        self._batch: torch.Tensor | None = None
        self._losses: dict[tuple, tuple[torch.Tensor | None, torch.Tensor]] = {}

    def rows(self, idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x[idx], y[idx])``, gathered once per batch."""
        if self._rows is None or self._rows[0] is not idx:
            self._rows = (idx, x[idx], y[idx])
        return self._rows[1], self._rows[2]

    def losses(self, idx: torch.Tensor, model: nn.Module, flat: torch.Tensor | None) -> torch.Tensor | None:
        """The losses stored for this batch at this point, or None."""
        if self._batch is not idx:
            return None
        got = self._losses.get(_state(model, flat))
        return None if got is None else got[1]

    def store_losses(
        self, idx: torch.Tensor, model: nn.Module, flat: torch.Tensor | None, losses: torch.Tensor
    ) -> None:
        """Remember ``losses`` of batch ``idx`` at ``flat`` (``None``: the model's parameters); a new
        batch forgets the previous one's."""
        if self._batch is not idx:
            self._batch, self._losses = idx, {}
        self._losses[_state(model, flat)] = (flat, losses.detach())


def _state(model: nn.Module, flat: torch.Tensor | None) -> tuple:
    if flat is not None:
        return ("flat", id(flat), flat._version)
    return ("model", *((p.data_ptr(), p._version) for p in trainable_parameters(model)))
