"""Per-group sample oracles that draw records without replacement and never hand one out twice.

The worst-group algorithms (``docs/algorithms/worst_group.md``) touch each training record at most
once, and their privacy rests on it: releases made from disjoint records compose in parallel. A
:class:`GroupOracles` gives every training record of group ``i`` an independent secret uniform
*key* in ``[0, 1)`` (drawn from the run's sampling source). Sorted by key, a group's records are
a uniformly random order; a draw of *width* ``w`` from group ``i`` hands out the records whose keys
lie in the next interval ``[c_i, c_i + w)`` of that group and moves the cursor ``c_i`` past it.

Why intervals of keys rather than "the next k records": a record's fate then depends on its own
key alone. Adding or removing one record changes exactly one draw (the one whose interval holds
its key) by that record and no other draw, so releases made from different draws compose in
parallel under add/remove neighbours (the project's relation, docs/data.md). Cutting the order
after a fixed number of records would shift every later draw by one when a record is inserted.
A draw of width ``w`` holds ``Binomial(n_i, w)`` records in expectation ``w·n_i``; algorithms
normalise by a public expected size, never by the realised count.

Every index handed out is remembered; a second hand-out of any record raises
:class:`~privopt.errors.ConfigError` (a defensive check: intervals never overlap). A group whose
cursor reached 1 is *exhausted* (public: cursors move by public widths).

Example:
    >>> import torch
    >>> groups = torch.tensor([0, 0, 1, 1, 1, 0, 1, 0])
    >>> oracles = GroupOracles(groups, num_groups=2, rng=torch.Generator().manual_seed(0))
    >>> first = oracles.draw(0, width=0.5)
    >>> second = oracles.draw(0, width=0.5)
    >>> sorted(first.tolist() + second.tolist())   # group 0, each record once
    [0, 1, 5, 7]
    >>> oracles.exhausted(0), oracles.remaining(1)
    (True, 1.0)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from privopt.errors import ConfigError
from privopt.rng import as_source

__all__ = ["GroupOracles"]

# Cursor arithmetic tolerance: a group counts as exhausted once less than this much of it remains.
_EPS = 1e-12


class GroupOracles:
    """Sample oracles ``C_1..C_p`` over the training records of each group (see the module docstring).

    Args:
        groups: group id of every training record (``[n]`` integer tensor, ids ``0..num_groups-1``).
        num_groups: number of groups p (public; a group may have no records).
        rng: the run's sampling source (:class:`privopt.rng.RandomSource`; a ``torch.Generator``
            is wrapped, insecure). The keys are secret: they decide which records each draw holds.
    """

    def __init__(self, groups: torch.Tensor, *, num_groups: int, rng):
        g = torch.as_tensor(groups)
        if g.dim() != 1 or g.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ConfigError(f"groups must be a 1-D integer tensor, got shape {tuple(g.shape)} and {g.dtype}")
        if not (isinstance(num_groups, int) and num_groups >= 1):
            raise ConfigError(f"num_groups must be an integer >= 1, got {num_groups!r}")
        if g.numel() and (int(g.min()) < 0 or int(g.max()) >= num_groups):
            raise ConfigError(f"group ids must lie in [0, {num_groups - 1}]")
        self.num_groups = num_groups
        self.n = int(g.numel())
        keys = as_source(rng).uniform(self.n).to(torch.float64)
        self._members: list[torch.Tensor] = []
        self._keys: list[torch.Tensor] = []
        for i in range(num_groups):
            idx = torch.nonzero(g == i).squeeze(1)
            k, order = torch.sort(keys[idx], stable=True)
            self._members.append(idx[order])
            self._keys.append(k)
        self._cursor = [0.0] * num_groups
        self._used = torch.zeros(self.n, dtype=torch.bool)

    def remaining(self, group: int) -> float:
        """Share of group ``group``'s key interval not yet drawn (public)."""
        return max(0.0, 1.0 - self._cursor[self._check_group(group)])

    def exhausted(self, group: int) -> bool:
        """True once the group's whole key interval has been drawn."""
        return self.remaining(group) <= _EPS

    def can_draw(self, group: int, width: float) -> bool:
        """Whether a draw of ``width`` fits in what remains of the group."""
        return width <= self.remaining(group) + _EPS

    def draw(self, group: int, *, width: float) -> torch.Tensor:
        """Indices of the group's records with keys in the next interval of ``width``.

        Raises:
            ConfigError: ``width`` outside ``(0, 1]``, the draw does not fit in what remains of
                the group, or (never, by construction) a record would be handed out twice.
        """
        i = self._check_group(group)
        if not (isinstance(width, (int, float)) and math.isfinite(width) and 0 < width <= 1 + _EPS):
            raise ConfigError(f"draw width must be in (0, 1], got {width!r}")
        if not self.can_draw(i, width):
            raise ConfigError(
                f"group {i} is exhausted: a draw of width {width:.6g} was asked, {self.remaining(i):.6g} remains "
                "(records are never reused)"
            )
        lo, hi = self._cursor[i], min(1.0, self._cursor[i] + width)
        if hi >= 1.0 - _EPS:
            hi = 1.0 + _EPS  # the last draw takes everything left (keys are < 1)
        a, b = torch.searchsorted(self._keys[i], torch.tensor([lo, hi], dtype=torch.float64)).tolist()
        idx = self._members[i][a:b]
        if bool(self._used[idx].any()):
            raise ConfigError("a record would be drawn twice: parallel composition would not hold")
        self._used[idx] = True
        self._cursor[i] = min(1.0, hi)
        return idx

    def drawn_mask(self) -> torch.Tensor:
        """Which records were handed out so far (diagnostics and tests; never released)."""
        return self._used.clone()

    def _check_group(self, group: int) -> int:
        if not (isinstance(group, int) and 0 <= group < self.num_groups):
            raise ConfigError(f"group must be an integer in [0, {self.num_groups - 1}], got {group!r}")
        return group

    def state_dict(self) -> dict[str, Any]:
        """Cursors, keys' order and the used mask (SECRET: it says which records each draw held)."""
        return {
            "members": [m.clone() for m in self._members],
            "keys": [k.clone() for k in self._keys],
            "cursor": list(self._cursor),
            "used": self._used.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._members = [m.clone() for m in state["members"]]
        self._keys = [k.clone() for k in state["keys"]]
        self._cursor = [float(c) for c in state["cursor"]]
        self._used = state["used"].clone()
