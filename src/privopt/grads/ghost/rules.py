"""Per-layer rules, registered by layer type: how one captured layer call becomes pieces.

A rule receives the layer module, its input and the gradient of ``sum_i l_i`` with respect to its
output, both with the batch along dimension 0 (the engine establishes where the batch is and moves
it there), and returns one piece per parameter it handles, by the parameter's local name. A rule
may return a plain ``[B, *param.shape]`` tensor of per-sample gradients; it is wrapped in
:class:`DenseGrads`. Layers without a rule fall back to the vmap rule (per-sample gradients of
that layer by ``torch.func.vmap``). Extending the engine: ``docs/engines.md``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Scale(nn.Module):  # y = x * s, one weight per feature
    ...     def __init__(self, n):
    ...         super().__init__()
    ...         self.s = nn.Parameter(torch.ones(n))
    ...     def forward(self, x):
    ...         return x * self.s
    >>> @register_layer_rule(Scale, trailing_dims=1)
    ... def scale_rule(module, x, grad_out):
    ...     return {"s": (x * grad_out).reshape(x.shape[0], -1, x.shape[-1]).sum(1)}
    >>> rule_for(Scale(3)).fn is scale_rule
    True
    >>> unregister_layer_rule(Scale)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from privopt.grads.ghost.pieces import (
    ConvOuterProducts,
    DenseGrads,
    EmbeddingGrads,
    LinearBiasGrads,
    OuterProductGrads,
    Piece,
)

__all__ = ["LayerRule", "Unsupported", "register_layer_rule", "rule_for", "rules_generation", "unregister_layer_rule"]

RuleFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], dict[str, "Piece | torch.Tensor"]]


UNSUPPORTED_LAYER_CALL = "a layer call the ghost engine cannot attribute to samples"


class Unsupported(Exception):
    """A capture cannot be attributed to samples; the query is answered by the vmap engine.

    ``reason`` goes into the run record (``engine_fallback``): it must be structural (layer types,
    parameter names), never a shape (the batch size is secret under Poisson sampling); the default is
    a fixed category, so a layer rule of a plugin that raises with its own message writes no more.
    """

    def __init__(self, message: str, *, reason: str = UNSUPPORTED_LAYER_CALL):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class LayerRule:
    """A registered rule.

    Attributes:
        layer_type: the module class it handles (subclasses too, unless they override ``forward``).
        fn: ``fn(module, input, grad_output) -> {local parameter name: piece or [B, ...] tensor}``.
        accepts: extra predicate on the module (e.g. an Embedding with ``max_norm`` is refused).
        trailing_dims: how many trailing dimensions the layer computes over; the batch may then be
            any other dimension. ``None``: the layer itself treats dimension 0 as the batch
            (convolutions, GroupNorm), so the batch must be there.
        takes_node: ``fn(module, input, grad_output, node)`` also receives the autograd node of
            the call's output (built-in rules that reuse what the forward saved), or ``None``.
    """

    layer_type: type
    fn: RuleFn
    accepts: Callable[[nn.Module], bool]
    trailing_dims: Callable[[nn.Module], int] | None
    takes_node: bool = False

    def pieces(self, module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, node=None) -> dict[str, Piece]:
        got = self.fn(module, x, grad_out, node) if self.takes_node else self.fn(module, x, grad_out)
        return {k: v if isinstance(v, Piece) else DenseGrads(v) for k, v in got.items()}


_RULES: dict[type, LayerRule] = {}
_GENERATION = [0]  # bumped on every (un)registration: what a cached routing decision depends on


def rules_generation() -> int:
    return _GENERATION[0]


def register_layer_rule(
    layer_type: type,
    *,
    accepts: Callable[[nn.Module], bool] | None = None,
    trailing_dims: int | Callable[[nn.Module], int] | None = None,
    takes_node: bool = False,
) -> Callable[[RuleFn], RuleFn]:
    """Decorator: use ``fn`` for every module of ``layer_type`` (replacing an earlier rule); with
    ``takes_node``, ``fn`` also receives the autograd node of the call's output (or ``None``)."""
    dims = trailing_dims if callable(trailing_dims) or trailing_dims is None else (lambda m, k=trailing_dims: k)

    def deco(fn: RuleFn) -> RuleFn:
        _RULES[layer_type] = LayerRule(layer_type, fn, accepts or (lambda m: True), dims, takes_node)
        _GENERATION[0] += 1
        return fn

    return deco


def unregister_layer_rule(layer_type: type) -> None:
    _RULES.pop(layer_type, None)
    _GENERATION[0] += 1


def rule_for(module: nn.Module) -> LayerRule | None:
    """The rule for ``module``: the nearest registered class in its MRO, if the module keeps that
    class's ``forward`` and the rule accepts it; otherwise ``None`` (the vmap rule)."""
    for cls in type(module).__mro__:
        rule = _RULES.get(cls)
        if rule is not None:
            return rule if type(module).forward is cls.forward and rule.accepts(module) else None
    return None


# --------------------------------------------------------------------------------------------
# Built-in rules.
# --------------------------------------------------------------------------------------------


@register_layer_rule(nn.Linear, trailing_dims=1)
def _linear(m: nn.Linear, x, gout):
    weight = OuterProductGrads.from_tokens(gout, x, m.weight.shape)
    out = {"weight": weight}
    if m.bias is not None and gout.dim() == 2:  # no tokens: the bias's gradient is the weight's g_i
        out["bias"] = LinearBiasGrads(gout, weight)
    elif m.bias is not None:
        out["bias"] = DenseGrads(gout.reshape(gout.shape[0], -1, gout.shape[-1]).sum(1))
    return out


def _conv(m: nn.modules.conv._ConvNd, x, gout):
    dim = m.weight.dim() - 2
    if x.dim() != dim + 2:
        # Not the shape: its first dimension may be the (secret) batch size.
        what = f"{type(m).__name__}: unbatched input"
        raise Unsupported(f"{what} ({x.dim()}-D, expected {dim + 2}-D: batch, channels, ...)", reason=what)
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        # Pad explicitly, as _ConvNd does for these modes ('same' may pad asymmetrically), then
        # treat the layer as an unpadded convolution.
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        x = F.pad(x, m._reversed_padding_repeated_twice, mode=mode)
        padding = (0,) * dim
    else:
        padding = tuple(m.padding)
    out = {"weight": ConvOuterProducts(x, gout, m.weight, tuple(m.stride), tuple(m.dilation), padding, m.groups)}
    if m.bias is not None:
        out["bias"] = DenseGrads(gout.reshape(gout.shape[0], gout.shape[1], -1).sum(2))
    return out


register_layer_rule(nn.Conv1d)(_conv)
register_layer_rule(nn.Conv2d)(_conv)


@register_layer_rule(nn.Embedding, accepts=lambda m: m.max_norm is None and not m.scale_grad_by_freq, trailing_dims=0)
def _embedding(m: nn.Embedding, x, gout):
    return {"weight": EmbeddingGrads(x, gout, m.num_embeddings, m.padding_idx)}


def _affine(normalised: torch.Tensor, gout: torch.Tensor, reduce_dims: tuple, has_bias: bool):
    out = {"weight": DenseGrads((gout * normalised).sum(reduce_dims) if reduce_dims else gout * normalised)}
    if has_bias:
        out["bias"] = DenseGrads(gout.sum(reduce_dims) if reduce_dims else gout)
    return out


@register_layer_rule(nn.LayerNorm, trailing_dims=lambda m: len(m.normalized_shape))
def _layer_norm(m: nn.LayerNorm, x, gout):
    xn = F.layer_norm(x, m.normalized_shape, None, None, m.eps)
    return _affine(xn, gout, tuple(range(1, x.dim() - len(m.normalized_shape))), m.bias is not None)


if hasattr(nn, "RMSNorm"):

    @register_layer_rule(nn.RMSNorm, trailing_dims=lambda m: len(m.normalized_shape))
    def _rms_norm(m, x, gout):
        xn = F.rms_norm(x, m.normalized_shape, None, m.eps)
        return _affine(xn, gout, tuple(range(1, x.dim() - len(m.normalized_shape))), False)


def _saved_group_stats(node, x: torch.Tensor, groups: int):
    """The per-(sample, group) mean and rstd that GroupNorm's forward saved for its backward, if
    ``node`` is that forward's node on exactly ``x``; else None (they are then recomputed)."""
    try:
        if type(node).__name__ != "NativeGroupNormBackward0" or node._saved_group != groups:
            return None
        saved = node._saved_input
        if saved.data_ptr() != x.data_ptr() or saved.shape != x.shape or saved.stride() != x.stride():
            return None
        mean, rstd = node._saved_result1, node._saved_result2
    except (AttributeError, RuntimeError):  # a node without (or with freed) saved tensors
        return None
    return mean.reshape(1, -1), rstd.reshape(1, -1)


@register_layer_rule(nn.GroupNorm, takes_node=True)
def _group_norm(m: nn.GroupNorm, x, gout, node=None):
    # A batch of B samples is one sample of B*C channels in B*groups groups (groups never straddle
    # samples), so the fused GroupNorm backward kernel of that folded layer returns the per-sample
    # affine gradients in one pass over x and grad_out, with the very statistics the forward used:
    # read from its autograd node when available (recomputing them was a whole extra GroupNorm
    # forward, about 8 % of a cnn DP step at B = 512), else recomputed.
    B, C = x.shape[:2]
    hw = x[0, 0].numel()
    folded = x.reshape(1, B * C, hw)
    stats = _saved_group_stats(node, x, m.num_groups)
    if stats is None:
        _, mean, rstd = torch.native_group_norm(folded, None, None, 1, B * C, hw, B * m.num_groups, m.eps)
    else:
        mean, rstd = stats
    ones = x.new_ones(B * C)  # the affine weight does not enter its own (or the bias's) gradient
    mask = [False, True, m.bias is not None]
    _, dw, db = torch.ops.aten.native_group_norm_backward(
        gout.reshape(1, B * C, hw), folded, mean, rstd, ones, 1, B * C, hw, B * m.num_groups, mask
    )
    out = {"weight": DenseGrads(dw.reshape(B, C))}
    if m.bias is not None:
        out["bias"] = DenseGrads(db.reshape(B, C))
    return out
