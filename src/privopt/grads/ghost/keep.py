"""Per-sample blocks kept from the capture for the clipped sum, within a memory budget.

Where the norm pass would materialise a parameter's per-sample gradients anyway, materialising them
as soon as that parameter's pieces of one point are in (inside the backward pass) lets the engine
drop the layer's input and output-gradient right away, and turns the clipped sum into one cheap
``coef @ block``. A kept block is also the float-safest form of a per-record term: its norm is
computed from the very vector that is summed (``docs/engines.md``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from privopt.grads.ghost.pieces import Piece, combine, sum_dense
from privopt.grads.ghost.tuning import TUNING

__all__ = ["Keep", "condense", "gram_is_cheaper"]


class Keep:
    """Budget (in elements) for kept per-sample gradient blocks, and the blocks by parameter name.

    ``extra`` is a separate budget for blocks *bigger* than the activations they replace (each
    costs its excess): they raise peak memory, but spare the clipped sum a second
    materialisation. It is set from the batch's activations by :meth:`allow_extra`.
    """

    def __init__(self, elems: int, extra: int = 0):
        self.left, self.extra = elems, extra
        self.extra_set = False
        self.activations = 0  # captured activations of the latest point
        self.blocks: dict[str, torch.Tensor] = {}

    def allow_extra(self, activations: int, n_points: int) -> None:
        """Set the excess budget once per query, a fraction of the activations of its first point
        (called at every point: the latest point's activations are recorded for :meth:`after_backward`)."""
        self.activations = activations
        if not self.extra_set:
            self.extra_set = True
            self.extra = int(TUNING.extra_keep_fraction[min(n_points, 2) - 1] * activations)

    def after_backward(self) -> None:
        """Widen the excess budget once the last backward pass is over: its activations are freed
        by then, so blocks formed from the retained captures (for the sum's terms) up to
        ``TUNING.after_keep_fraction`` of them stay below the backward pass's peak, and each one
        spares the clipped sum a second materialisation (two per difference query)."""
        self.extra += int(TUNING.after_keep_fraction * self.activations)

    def offer(
        self, name: str, make: Callable[[], torch.Tensor], numel: int, captured: int | None = None
    ) -> torch.Tensor | None:
        excess = 0 if captured is None else max(0, numel - max(captured, TUNING.small_keep_elems))
        # A block bigger than its captures draws on the excess budget only, so that it never
        # crowds out the (memory-neutral) blocks of the lower layers that come after it.
        if (excess and excess > self.extra) or (not excess and numel > self.left):
            return None
        if excess:
            self.extra -= excess
        else:
            self.left -= numel
        block = make()
        self.blocks[name] = block
        return block


def gram_is_cheaper(tokens: int, p: int, q: int) -> bool:
    """Whether norms from the captures (Gram matrices, ~T^2 (p+q) per group) beat materialising
    the per-sample gradient (~T p q), for ``tokens`` outer products per sample."""
    return tokens * (p + q) <= p * q


def condense(n: str, pieces: dict[str, list[Piece]], keep: Keep, B: int, n_points: int) -> None:
    """Once all of one point's pieces of parameter ``n`` are in, turn them into a kept per-sample
    block if the norm pass would materialise it anyway (added into the first point's block for a
    difference query) and drop their activations/output-gradients. Called from inside the backward
    pass, so a layer's captures are released as soon as its block exists, and a difference query
    never holds both points' activations at once."""
    lst = pieces[n]
    if all(pc.kind == "dense" for pc in lst):
        # clone: a lone unscaled dense piece may alias an autograd output that is later added to
        make = lambda: sum_dense(lst).clone()
    elif all(pc.kind == "pair" for pc in lst) and len({pc.key for pc in lst}) == 1:
        _g, p, q = lst[0].key
        if gram_is_cheaper(n_points * sum(pc.T for pc in lst), p, q):
            return  # keep the captures
        make = lambda: combine(lst, slice(None))
    else:
        return
    if n in keep.blocks:
        keep.blocks[n].add_(make())
    elif keep.offer(n, make, B * int(lst[0].shape.numel()), sum(pc.captured for pc in lst)) is None:
        return
    del pieces[n]
