"""Where the batch is in every layer call, established from the model's structure, not guessed.

Guessing "the dimension of size B is the batch" is wrong whenever another dimension also has size
B (a sequence-first layer whose sequence length equals the batch size). Instead the engine runs
the model twice, without gradients, on probe batches of two different sizes built from the first
rows of the real input, and records the shape of every tensor entering and leaving every
parameter-owning layer call. A dimension that has the first probe size in the first run, the
second in the second, while every other dimension is unchanged, *is* that tensor's batch
dimension; a tensor whose shape does not change does not depend on the batch. Anything else
(batch folded into another dimension, shapes that change otherwise) is unknown, and that layer
falls back to the vmap rule. The result is cached per model structure and per-sample input shape;
each real call is checked against it (sequence of layer calls and every shape). See
``docs/engines.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

__all__ = ["PROBE_SIZES", "UNKNOWN", "CallLayout", "TensorLayout", "probe_layout"]

PROBE_SIZES = (2, 3)


@dataclass(frozen=True)
class TensorLayout:
    """Layout of one tensor of a layer call.

    Attributes:
        shape: its shape in the first probe (batch size ``PROBE_SIZES[0]`` along ``axis``).
        axis: the batch dimension, or ``None`` when the tensor does not depend on the batch.
        known: ``False`` when the batch dimension could not be established.
    """

    shape: tuple[int, ...]
    axis: int | None
    known: bool = True

    def expected(self, batch_size: int) -> tuple[int, ...]:
        if self.axis is None:
            return self.shape
        return (*self.shape[: self.axis], batch_size, *self.shape[self.axis + 1 :])

    def matches(self, t: torch.Tensor, batch_size: int) -> bool:
        return self.known and tuple(t.shape) == self.expected(batch_size)


UNKNOWN = TensorLayout((), None, known=False)


@dataclass(frozen=True)
class CallLayout:
    """Layouts of one layer call: ``inputs`` in the order of ``tree_flatten((args, kwargs))``
    (``None`` for entries that are not tensors), ``output`` (``None`` if not a tensor)."""

    module_id: int
    inputs: tuple[TensorLayout | None, ...]
    output: TensorLayout | None


def _shape(a) -> tuple[int, ...] | None:
    return tuple(a.shape) if isinstance(a, torch.Tensor) else None


def _record(model: nn.Module, modules: list[nn.Module], rows: torch.Tensor, params: dict | None):
    """Shapes entering and leaving every call of ``modules`` in a no-grad forward on ``rows``."""
    calls = []

    def hook(module, args, kwargs, output):
        flat = tree_flatten((args, kwargs))[0]
        calls.append((id(module), tuple(_shape(a) for a in flat), _shape(output)))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in modules]
    # Cloned buffers absorb any in-place update; the forked generator leaves dropout streams as they were.
    state = {**(params or {}), **{n: b.clone() for n, b in model.named_buffers()}}
    devices = [] if rows.device.type == "cpu" else [rows.device]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            functional_call(model, state, (rows,))
    except Exception:  # a model that cannot run on a small batch: layout unknown
        return None
    finally:
        for h in handles:
            h.remove()
    return calls


def _combine(s1: tuple | None, s2: tuple | None) -> TensorLayout | None:
    if s1 is None or s2 is None:
        return None if s1 is None and s2 is None else UNKNOWN
    if s1 == s2:
        return TensorLayout(s1, None)
    changed = [k for k in range(len(s1)) if len(s1) == len(s2) and s1[k] != s2[k]]
    b1, b2 = PROBE_SIZES
    if len(s1) == len(s2) and len(changed) == 1 and (s1[changed[0]], s2[changed[0]]) == (b1, b2):
        return TensorLayout(s1, changed[0])
    return UNKNOWN


def probe_layout(
    model: nn.Module, modules: list[nn.Module], inputs: torch.Tensor, params: dict | None
) -> list[CallLayout] | None:
    """Batch layout of every call of ``modules`` when ``model`` runs on ``inputs`` (batch-first);
    ``None`` when the two probes call different layers (control flow depends on the batch)."""
    if inputs.shape[0] == 0:
        return None
    runs = []
    for b in PROBE_SIZES:
        rows = inputs[torch.arange(b, device=inputs.device) % inputs.shape[0]]
        runs.append(_record(model, modules, rows, params))
    first, second = runs
    if first is None or second is None or [c[0] for c in first] != [c[0] for c in second]:
        return None
    layouts = []
    for (mid, ins1, out1), (_, ins2, out2) in zip(first, second):
        if len(ins1) != len(ins2):
            ins = (UNKNOWN,) * len(ins1)
        else:
            ins = tuple(_combine(a, b) for a, b in zip(ins1, ins2))
        layouts.append(CallLayout(mid, ins, _combine(out1, out2)))
    return layouts
