"""The vmap rule: per-sample gradients of one layer without a registered rule.

With the batch dimension of every tensor of the call known (:mod:`privopt.grads.ghost.layout`),
the layer alone is re-run per sample under ``torch.func.vmap`` and pulled back through its
output-gradient. When the batch dimension of the call is not known, the layer's parameters get
their per-sample gradients from a vmap over the whole model instead (exact, slower).

A re-run that draws random numbers (dropout inside the layer, in training mode) would not
reproduce the forward's draws, so its gradients would not be those of the loss: it raises
:class:`~privopt.grads.ghost.rules.Unsupported` and the query goes to the vmap engine.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from privopt.grads.ghost.pieces import DenseGrads
from privopt.grads.ghost.rules import Unsupported

__all__ = ["layer_vmap_grads", "rng_states", "unchanged_randomness"]


def rng_states() -> list[torch.Tensor]:
    """The states of torch's global generators (CPU, and CUDA once initialised)."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.extend(torch.cuda.get_rng_state_all())
    return states


def unchanged_randomness(before: list[torch.Tensor], what: str) -> None:
    """Raise :class:`Unsupported` if a global generator moved since ``before``: ``what`` drew
    random numbers that a re-run does not reproduce."""
    after = rng_states()
    if len(after) != len(before) or any(not torch.equal(a, b) for a, b in zip(after, before)):
        raise Unsupported(
            f"{what} draws random numbers (e.g. dropout in training mode), which its per-sample re-run "
            "would not reproduce",
            reason=f"{what} draws random numbers",
        )


def layer_vmap_grads(
    module: nn.Module,
    values: dict[str, torch.Tensor],
    call_inputs: tuple,
    local: list[str],
    grad_out: torch.Tensor,
    in_dims: tuple[int | None, ...],
    out_dim: int,
) -> dict[str, DenseGrads]:
    """Per-sample gradients of the parameters ``local`` of ``module``.

    Args:
        module: the layer.
        values: its parameters and buffers at the point of the call, by local name.
        call_inputs: ``(args, kwargs)`` of the call.
        local: local names of the parameters wanted.
        grad_out: gradient of the summed loss with respect to the call's output.
        in_dims: batch dimension of each tensor of ``tree_flatten(call_inputs)`` (``None``: shared).
        out_dim: batch dimension of the output.
    """
    flat, spec = tree_flatten(call_inputs)
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

    def one(tensors, g):
        items = list(flat)
        for i, t, d in zip(positions, tensors, in_dims):
            items[i] = t if d is None else t.unsqueeze(d)  # a batch of one, where the batch was
        args, kwargs = tree_unflatten(items, spec)

        def f(own):
            return functional_call(module, {**values, **own}, args, kwargs)

        _, pull = vjp(f, {n: values[n] for n in local})
        return pull(g.unsqueeze(out_dim))[0]

    before = rng_states()
    grads = vmap(one, in_dims=(tuple(in_dims), out_dim), randomness="different")(
        tuple(flat[i] for i in positions), grad_out
    )
    unchanged_randomness(before, f"layer {type(module).__name__} (no ghost rule)")
    return {n: DenseGrads(grads[n]) for n in local}
