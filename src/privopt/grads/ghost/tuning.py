"""Memory knobs of the ghost engine, in one mutable object so that tests (and users) can change them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TUNING", "Tuning"]


@dataclass
class Tuning:
    """Limits trading memory for speed. None of them changes the numbers the engine returns.

    Attributes:
        chunk_elems: upper bound on the elements of one temporary (Gram matrix, materialised
            block, unfolded patches) per batch chunk; keeps peak memory close to a plain step.
        keep_elems: budget (elements, all parameters together) for per-sample gradient blocks
            that the norm pass materialises anyway and keeps for the clipped sum.
        small_keep_elems: blocks larger than the activations they replace are kept only below
            this size.
        extra_keep_fraction: excess budget for kept blocks bigger than the activations they
            replace (sparing the sum a second materialisation), as a fraction of the batch's
            activations (inputs of the captured layer calls): for one point, and for a
            difference query (whose first point's blocks are held through the second pass; measured
            over the 1.5x memory limit already at 0.1, so 0).
        after_keep_fraction: excess budget added once every backward pass is over, as a fraction
            of the last point's activations (freed by then, so blocks formed from the retained
            captures for the sum stay below the backward pass's peak).
        in_backward: process each layer call inside the backward pass as its output-gradient
            arrives; ``False`` requests every output-gradient and processes them afterwards (same
            numbers, about twice the activation memory).
    """

    chunk_elems: int = 1 << 24
    keep_elems: int = 1 << 25
    small_keep_elems: int = 1 << 20
    extra_keep_fraction: tuple[float, float] = (0.3, 0.0)
    after_keep_fraction: float = 0.5
    in_backward: bool = True


TUNING = Tuning()
