"""Capture at one parameter point: a forward pass with hooks, one backward pass, pieces per parameter.

One forward pass records, for every call of a parameter-owning layer, its inputs and (through the
autograd edge of its output) where the gradient of ``sum_i l_i`` with respect to that output will
arrive. Each call is routed by the batch layout established for the model
(:mod:`privopt.grads.ghost.layout`): to its layer rule, to the per-layer vmap rule, or — when the
call's batch dimension is not known — its parameters get per-sample gradients from a vmap over the
whole model.

Memory: each routed call is processed *inside* the backward pass, in a pre-hook on its output's
autograd node, as soon as its output-gradient arrives; once all of a parameter's calls at a point
are in, its pieces condense into a kept per-sample block where the norm pass would materialise one
anyway (:mod:`privopt.grads.ghost.keep`), and the engine drops its references to that layer's
input and output-gradient. Only the lowest layers (nothing handled below them; their nodes would
not otherwise run) and vmap-rule layers have their output-gradients requested from
``autograd.grad`` and are processed after it. See ``docs/engines.md``.
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

from privopt.errors import ConfigError, ModelError
from privopt.grads.engine import flat_param_names, resolve_weights, vmap_grads
from privopt.grads.ghost.escape import escaped_parameters
from privopt.grads.ghost.fallback import layer_vmap_grads, rng_states, unchanged_randomness
from privopt.grads.ghost.keep import Keep, condense
from privopt.grads.ghost.layout import CallLayout, probe_layout
from privopt.grads.ghost.pieces import DenseGrads, Piece
from privopt.grads.ghost.rules import Unsupported, rule_for, rules_generation
from privopt.grads.ghost.tuning import TUNING

__all__ = ["Capture", "Structure", "structure"]


class Structure:
    """What the capture needs to know about a model, computed once per model and reused while the
    module tree and its parameters (objects and ``requires_grad``) are unchanged: parameter names,
    which module owns which parameter, and the batch layout per input shape."""

    def __init__(self, model: nn.Module, signature):
        self.signature = signature
        self.own = dict(model.named_parameters())
        self.names = flat_param_names(model)
        self.numels = {n: p.numel() for n, p in self.own.items()}
        # module -> {local name: flat name}; tied parameters map to their first (flat) name
        by_obj = {id(p): n for n, p in self.own.items()}
        trainable = set(self.names)
        self.local_map: dict[int, dict[str, str]] = {}
        self.modules: list[nn.Module] = []
        for mod in model.modules():
            own = {ln: by_obj[id(p)] for ln, p in mod.named_parameters(recurse=False) if by_obj.get(id(p)) in trainable}
            if own:
                self.local_map[id(mod)] = own
                self.modules.append(mod)
        self.buffers = [(f"{mn}.{k}" if mn else k, m, k) for mn, m in model.named_modules() for k in m._buffers]
        self._layouts: dict[tuple, list[CallLayout] | None] = {}
        self._escaped: dict[tuple, list[str]] = {}
        # Why the ghost path failed, per layout key: later queries go to the vmap engine at once
        # instead of paying a capture that fails again (e.g. nn.MultiheadAttention's out_proj).
        self.unsupported: dict[tuple, tuple[str, str]] = {}  # failure key -> (message, public reason)

    @staticmethod
    def signature_of(model: nn.Module):
        # Holding the structure keeps these objects alive, so their ids cannot be reused.
        return tuple(
            (
                id(m),
                tuple((k, id(v), v.requires_grad) for k, v in m._parameters.items() if v is not None),
                tuple(m._buffers),
            )
            for m in model.modules()
        )

    def buffer_versions(self) -> dict[str, int]:
        return {name: m._buffers[k]._version for name, m, k in self.buffers if m._buffers[k] is not None}

    @staticmethod
    def key(model: nn.Module, inputs: torch.Tensor) -> tuple:
        """What a layout is cached by: the per-sample input and the mode (for a failure of the ghost
        path, see :meth:`failure_key`)."""
        return (tuple(inputs.shape[1:]), inputs.dtype, inputs.device, model.training)

    def failure_key(self, model: nn.Module, inputs: torch.Tensor) -> tuple:
        """A layout's key and the layer rules registered (a new rule may make the model supported)."""
        return (*self.key(model, inputs), rules_generation())

    def layout(self, model: nn.Module, inputs: torch.Tensor, params: dict | None) -> list[CallLayout] | None:
        key = self.key(model, inputs)
        if key not in self._layouts:
            self._layouts[key] = probe_layout(model, self.modules, inputs, params)
        return self._layouts[key]

    def escaped(self, model: nn.Module, inputs: torch.Tensor, params: dict | None) -> list[str]:
        """Parameters used outside their owning modules' forward (:mod:`~privopt.grads.ghost.escape`)."""
        key = self.key(model, inputs)
        if key not in self._escaped:
            rows = inputs[torch.arange(2, device=inputs.device) % inputs.shape[0]] if inputs.shape[0] else inputs
            self._escaped[key] = escaped_parameters(model, self.local_map, self.names, rows, params)
        return self._escaped[key]


_STRUCTURES: weakref.WeakKeyDictionary[nn.Module, Structure] = weakref.WeakKeyDictionary()


def structure(model: nn.Module) -> Structure:
    sig = Structure.signature_of(model)
    st = _STRUCTURES.get(model)
    if st is None or st.signature != sig:
        st = _STRUCTURES[model] = Structure(model, sig)
    return st


def _route(module: nn.Module, flat: list, output, layout: CallLayout, B: int) -> tuple | None:
    """How a call becomes per-sample gradients: ``("rule", rule, position, in_axis, out_axis)``,
    ``("layer", in_dims, out_axis)`` (the vmap rule), or ``None`` (batch dimension unknown: the
    layer's parameters go through a vmap over the whole model)."""
    if not isinstance(output, torch.Tensor) or not output.requires_grad or len(layout.inputs) != len(flat):
        return None
    out = layout.output
    if out is None or out.axis is None or not out.matches(output, B):
        return None
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    if any(layout.inputs[i] is None or not layout.inputs[i].matches(flat[i], B) for i in positions):
        return None
    axes = tuple(layout.inputs[i].axis for i in positions)
    rule = rule_for(module)
    if rule is not None and len(positions) == 1 and axes[0] is not None:
        dims, k = rule.trailing_dims, axes[0]
        if (k == 0 and out.axis == 0) if dims is None else k < flat[positions[0]].dim() - dims(module):
            return ("rule", rule, positions[0], k, out.axis)
    if any(a is not None for a in axes):
        return ("layer", axes, out.axis)
    return None


def _batch_first(t: torch.Tensor, axis: int) -> torch.Tensor:
    return t if axis == 0 else t.movedim(axis, 0)


class _Call:
    """One call of a parameter-owning layer, as captured by the forward hook."""

    __slots__ = ("edge", "flat", "inputs", "module", "route", "values", "versions")

    def __init__(self, module, args, kwargs, output, layout: CallLayout, B: int):
        self.module, self.inputs = module, (args, kwargs)
        plain = not kwargs and all(isinstance(a, torch.Tensor) for a in args)  # what tree_flatten would give
        self.flat = list(args) if plain else tree_flatten(self.inputs)[0]
        self.route = _route(module, self.flat, output, layout, B)
        self.edge = get_gradient_edge(output) if self.route is not None else None
        self.values = None
        if self.route is not None and self.route[0] == "layer":  # the vmap rule re-runs the layer at this point
            self.values = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        self.versions = [a._version for a in self.flat if isinstance(a, torch.Tensor)]

    @property
    def routed(self) -> bool:
        return self.route is not None

    def modified_in_place(self) -> bool:
        return [a._version for a in self.flat if isinstance(a, torch.Tensor)] != self.versions

    def pieces(self, g: torch.Tensor, local: list[str]) -> dict[str, Piece]:
        if self.route[0] == "rule":
            _, rule, pos, axis, out_axis = self.route
            x = self.flat[pos].detach()
            return rule.pieces(self.module, _batch_first(x, axis), _batch_first(g, out_axis), self.edge.node)
        _, in_dims, out_axis = self.route
        return layer_vmap_grads(self.module, self.values, self.inputs, local, g, in_dims, out_axis)

    def release(self) -> None:
        self.inputs = self.flat = self.values = None  # our references to its activations


def _point_scale(weights, losses: torch.Tensor, sign: int) -> torch.Tensor | None:
    """Per-sample factor of one point's pieces: its weights, negated for a difference's second point."""
    w = resolve_weights(weights, losses)
    if w is not None:
        return w if sign > 0 else -w
    return -torch.ones_like(losses.detach()) if sign < 0 else None


class _Collector:
    """Pieces per parameter at one point; condenses a parameter once all its calls are in."""

    def __init__(self, st: Structure, calls, scale, keep: Keep | None, B: int, n_points: int, skip: set[str]):
        self.st, self.scale, self.keep, self.B, self.n_points, self.skip = st, scale, keep, B, n_points, skip
        self.pieces: dict[str, list[Piece]] = {}
        self.done: set[str] = set()
        self.arrived: Counter = Counter()
        self.uses = Counter(n for c in calls if c.routed for n in st.local_map[id(c.module)].values() if n not in skip)

    def add(self, name: str, piece: Piece) -> None:
        piece.scale = self.scale
        self.pieces.setdefault(name, []).append(piece)

    def process(self, call: _Call, g: torch.Tensor) -> None:
        own = self.st.local_map[id(call.module)]
        got = call.pieces(g.detach(), list(own))
        call.release()
        for ln, piece in got.items():
            if own.get(ln) is not None and own[ln] not in self.skip:
                self.add(own[ln], piece)
        if self.keep is None:
            return
        for n in own.values():
            self.arrived[n] += 1
            if n not in self.skip and self.arrived[n] == self.uses[n] and n in self.pieces:
                self._condense(n)

    def _condense(self, n: str) -> None:
        self.done.add(n)
        with torch.no_grad():
            condense(n, self.pieces, self.keep, self.B, self.n_points)

    def finish(self) -> None:
        """Condense parameters whose calls did not all receive a gradient."""
        if self.keep is not None:
            for n in list(self.pieces):
                if n not in self.done:
                    self._condense(n)


def _target_below(start, targets: set, clear: set) -> bool:
    """Whether a node of ``targets`` lies strictly below autograd node ``start`` (iterative walk:
    graphs can be deeper than Python's recursion limit). ``clear`` collects nodes known to have
    no target at or below them, shared between calls."""
    stack = [k for k, _ in start.next_functions if k is not None]
    visited = set()
    while stack:
        node = stack.pop()
        if node in targets:
            return True
        if node in clear or node in visited:
            continue
        visited.add(node)
        stack.extend(k for k, _ in node.next_functions if k is not None)
    clear.update(visited)  # fully explored without meeting a target
    return False


def attach(total: torch.Tensor, calls: list[_Call], process, errors: list, prehooks: list) -> list[_Call]:
    """Register an output-gradient pre-hook on every rule-routed call that the backward pass
    executes anyway, and return the calls whose output-gradients must be requested.

    A node runs in ``autograd.grad`` only if a requested gradient lies below it, and every
    requested gradient is held until the call returns. So only the *lowest* rule-routed calls
    (no other one below them, e.g. the first layer) and the vmap-rule calls are requested; every
    other call sits above one of them, runs, and is processed in its pre-hook, its
    output-gradient released after the node has run."""
    if not TUNING.in_backward:  # every output-gradient requested, processed after the backward
        return list(calls)
    targets, clear = {c.edge.node for c in calls if c.route[0] == "rule"}, set()
    direct = []
    for c in calls:
        if c.route[0] != "rule" or not _target_below(c.edge.node, targets, clear):
            direct.append(c)
            continue

        def pre(grad_outputs, c=c, k=c.edge.output_nr):
            g = grad_outputs[k]
            if g is not None and not errors:
                try:
                    process(c, g)
                except Exception as e:
                    errors.append(e)

        prehooks.append(c.edge.node.register_prehook(pre))
    return direct


class Capture:
    """Forward + one backward at one parameter point; collects per-parameter pieces."""

    def __init__(self, model: nn.Module, st: Structure, params: dict | None):
        self.model, self.st, self.params = model, st, params

    def run(self, loss_fn, inputs, targets, *, weights=None, sign: int = 1, keep: Keep | None = None, n_points=1):
        """Per-sample losses ``[B]`` and ``{parameter name: pieces}`` (condensed ones in ``keep``)."""
        B = inputs.shape[0]
        layouts = self.st.layout(self.model, inputs, self.params)
        escaped = self.st.escaped(self.model, inputs, self.params)
        if escaped:  # its layer calls miss a term of its gradient: their norms would be too small
            name = escaped[0]
            raise _escaped(self.model, name)
        calls, losses = self._forward(loss_fn, inputs, targets, layouts)
        # Weights are known once the losses are: pieces are scaled (and negated) as they arrive.
        scale = _point_scale(weights, losses, sign)
        skip = {n for c in calls if not c.routed for n in self.st.local_map[id(c.module)].values()}
        if keep is not None:
            keep.allow_extra(
                sum(a.numel() for c in calls if c.routed for a in c.flat if isinstance(a, torch.Tensor)), n_points
            )
        col = _Collector(self.st, calls, scale, keep, B, n_points, skip)
        self._backward(losses, [c for c in calls if c.routed], col)
        if skip:  # batch dimension unknown somewhere: those parameters by a vmap over the model
            values = {n: t.detach() for n, t in (self.params or self.st.own).items()}
            before = rng_states()
            _, grads = vmap_grads(self.model, loss_fn, inputs, targets, values, wrt=sorted(skip))
            unchanged_randomness(before, "the model")  # its re-run's draws are not the forward's
            for n, g in grads.items():
                col.add(n, DenseGrads(g))
        col.finish()
        missing = [n for n in self.st.names if n not in col.pieces and n not in col.done]
        if missing:
            self._check_unreachable(losses, missing)
        return losses.detach(), col.pieces

    def _forward(self, loss_fn, inputs, targets, layouts):
        B, calls, active = inputs.shape[0], [], [True]

        def hook(module, args, kwargs, output):
            if not active[0]:
                return
            k = len(calls)
            if layouts is None or k >= len(layouts) or layouts[k].module_id != id(module):
                raise Unsupported(_CALLS_DIFFER, reason=_CALLS_DIFFER)
            calls.append(_Call(module, args, kwargs, output, layouts[k], B))

        handles = [m.register_forward_hook(hook, with_kwargs=True) for m in self.st.modules]
        buffers = self.st.buffer_versions()
        try:
            out = self.model(inputs) if self.params is None else functional_call(self.model, self.params, (inputs,))
            losses = loss_fn(out, targets)
        finally:
            active[0] = False
            for h in handles:
                h.remove()
        if not isinstance(losses, torch.Tensor) or losses.shape != (B,):
            # Not the shapes: the batch's size is the secret sampling's.
            got = f"{losses.dim()}-D tensor" if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise ConfigError(f"loss_fn must return per-sample losses (1-D, one per example of the batch), got {got}")
        if layouts is not None and len(calls) != len(layouts):
            raise Unsupported(_CALLS_DIFFER, reason=_CALLS_DIFFER)
        _check_forward_side_effects(self.st, calls, buffers)
        return calls, losses

    def _backward(self, losses, calls: list[_Call], col: _Collector) -> None:
        total, errors, prehooks = losses.sum(), [], []
        try:
            direct = attach(total, calls, col.process, errors, prehooks)
            if direct:
                gouts = torch.autograd.grad(total, [c.edge for c in direct], allow_unused=True)
                for h in prehooks:
                    h.remove()
                if errors:
                    raise errors[0]
                for c, g in zip(direct, gouts):
                    if g is not None:
                        col.process(c, g)
        finally:
            for h in prehooks:
                h.remove()

    def _check_unreachable(self, losses, missing):
        """A parameter with no captured use must not influence the loss (else it is used outside
        its owning module, e.g. ``nn.MultiheadAttention.out_proj``)."""
        source = self.st.own if self.params is None else self.params
        leaves = {id(source[n]): n for n in missing}
        seen, stack = set(), [losses.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            var = getattr(fn, "variable", None)
            if var is not None and id(var) in leaves:
                raise _escaped(self.model, leaves[id(var)])
            stack.extend(nf for nf, _ in fn.next_functions)


_CALLS_DIFFER = "the model's layer calls differ from those of the layout probe"


def _escaped(model: nn.Module, name: str) -> Unsupported:
    what = f"parameter {name!r} is used outside its module's forward"  # a name of the architecture: public
    return Unsupported(what + _user_hint(model, name), reason=what)


def _user_hint(model: nn.Module, name: str) -> str:
    """What to change when the parameter belongs to a torch layer known to do this."""
    parts = name.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        if isinstance(model.get_submodule(".".join(parts[:depth])), nn.MultiheadAttention):
            return (
                " (nn.MultiheadAttention computes with out_proj's parameters without calling out_proj): "
                "privopt.models.attention.MultiheadAttention is a drop-in replacement that the ghost engine "
                'handles (docs/models.md, "Attention")'
            )
    return ""


def _check_forward_side_effects(st: Structure, calls: list[_Call], buffer_versions: dict[str, int]) -> None:
    for c in calls:
        if c.routed and c.modified_in_place():
            # Plain autograd would reject this too (the weight gradient reads that input).
            raise ModelError(
                f"the input of layer {type(c.module).__name__} was modified in place after the layer "
                "read it; per-sample gradients (and ordinary backward) would be wrong — avoid the in-place op"
            )
    for name, version in st.buffer_versions().items():
        if version != buffer_versions.get(name, version):
            raise ModelError(
                f"buffer {name!r} was updated during the forward pass (a running statistic?): it would learn "
                "from the private batch and be released without noise; use layers without running statistics "
                "(nn.GroupNorm, nn.LayerNorm, track_running_stats=False)"
            )
