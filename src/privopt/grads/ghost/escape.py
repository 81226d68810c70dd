"""Parameters used outside the forward of every module that owns them.

The ghost engine takes a parameter's per-sample gradient from the calls of the layers that own it.
A use anywhere else — tied weights such as ``h @ self.embed.weight.T`` or
``F.linear(h, self.fc.weight)`` in a parent's ``forward`` while ``self.embed`` / ``self.fc`` run
too, or ``nn.MultiheadAttention`` computing with ``out_proj``'s weight without calling ``out_proj``
— adds a gradient term no layer call sees: the per-sample norms would come out too small and
records would pass the clipping above the bound. One small forward pass per model structure and
input shape finds such uses: an op that takes a trainable parameter, while none of the modules
owning it is running, and whose result carries its gradient.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

__all__ = ["escaped_parameters"]


class _Uses(TorchFunctionMode):
    def __init__(self, owners: dict[int, tuple[str, set[int]]], running: dict[int, int], found: list[str]):
        super().__init__()
        self.owners, self.running, self.found = owners, running, found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.found:
            return out
        for a in tree_flatten((args, kwargs or {}))[0]:
            hit = self.owners.get(id(a)) if isinstance(a, torch.Tensor) else None
            if hit is not None and not any(self.running.get(m, 0) for m in hit[1]) and _carries_grad(out):
                self.found.append(hit[0])
                break
        return out


def _carries_grad(out) -> bool:
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten(out)[0])


def escaped_parameters(
    model: nn.Module, local_map: dict[int, dict[str, str]], names: list[str], rows: torch.Tensor, params: dict | None
) -> list[str]:
    """Names of trainable parameters (of ``names``) that ``model`` uses on ``rows`` outside the
    forward of every module owning them (``local_map``: module id -> {local name: flat name}).

    Only direct uses of the parameter tensor are seen (not a tensor a module computed from it and
    handed out). A model that fails on ``rows`` finds nothing here: the capture reports it.
    """
    tensors = {n: (params or {}).get(n) for n in names}
    mods = {id(m): m for m in model.modules() if id(m) in local_map}
    owners: dict[int, tuple[str, set[int]]] = {}
    for mid, local in local_map.items():
        for ln, flat in local.items():
            if flat in tensors:
                t = tensors[flat] if tensors[flat] is not None else mods[mid]._parameters[ln]
                owners.setdefault(id(t), (flat, set()))[1].add(mid)
    running: dict[int, int] = {}

    def enter(m, *_):
        running[id(m)] = running.get(id(m), 0) + 1

    def leave(m, *_):
        running[id(m)] -= 1

    handles = [h for m in mods.values() for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    state = {**(params or {}), **{n: b.clone() for n, b in model.named_buffers()}}
    devices = [] if rows.device.type == "cpu" else [rows.device]
    found: list[str] = []
    try:
        with torch.enable_grad(), torch.random.fork_rng(devices=devices), _Uses(owners, running, found):
            functional_call(model, state, (rows,))
    except Exception:
        pass  # the capture runs the model again and reports its error
    finally:
        for h in handles:
            h.remove()
    return found
