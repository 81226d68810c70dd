"""Ghost-norm engine: per-sample clipping without materialising ``[B, d]`` per-sample gradients.

One forward pass records, for every layer call, the layer's input activation ``A`` and (through
the autograd edge of its output) the gradient ``G`` of ``sum_i l_i`` with respect to the layer's
output. Because each sample's loss depends only on its own output (BatchNorm is banned), the
per-sample gradient of a Linear weight is ``G_i^T A_i`` (``G_i``/``A_i``: one row per token), so

* its squared norm is ``<G_i G_i^T, A_i A_i^T>`` (the "ghost norm") or, when that Gram matrix is
  larger than the gradient itself, the squared norm of the materialised ``G_i^T A_i`` — whichever
  is cheaper;
* the clipped sum ``sum_i c_i G_i^T A_i`` is one matmul of the rescaled captures ("book-keeping"),
  so no second backward pass is needed.

A *difference* ``w_i grad l(w; x_i) - w'_i grad l(w'; x_i)`` is the same bilinear form with the
tokens of both points concatenated and the second point's output-gradients negated, which yields
``||g||^2||a||^2 + ||g'||^2||a'||^2 - 2 (g.g')(a.a')`` for a plain Linear layer without ever forming
either gradient. Convolutions are Linear layers over input patches: the Gram route uses strided
patch views, the materialising route computes all per-sample weight gradients with one grouped
convolution-backward call (samples folded into groups), which on CPU is far faster than
``F.unfold`` + ``bmm``. Embedding uses the token-index equality pattern; the affine parameters of
LayerNorm/GroupNorm/RMSNorm have small per-sample gradients that are materialised directly. Any
other layer that owns parameters falls back to ``vmap`` over that layer only.

Per-sample blocks that the norm pass materialises anyway are kept (up to ``_KEEP_ELEMS`` elements,
and only when smaller than the activations they replace) so that their clipped sum is a cheap
``coef @ block``; for a difference query they are formed right after each point's capture, so the
first point's activations are released before the second forward pass.

Whenever the capture cannot be attributed to samples (a parameter used outside its module, a layer
whose input is not batch-first, a layer output that is not a tensor, ...) the
query is answered by :class:`~privopt.grads.engine.VmapEngine` instead, with a warning: slower but
exact.

Limitations: a parameter must be used only inside the ``forward`` of the module that owns it (a
use outside an owning module that is *also* called, e.g. ``F.linear(h, self.embed.weight)`` in a
parent while ``self.embed`` runs too, cannot be detected cheaply and would be missed); with dropout
in train mode the two points of a difference query draw different masks (as with any two forward
passes).

Memory: each layer call is processed *inside* the backward pass, in a pre-hook on its output's
autograd node, as soon as its output-gradient arrives; once all of a parameter's calls at a point
are in, its pieces condense into a kept per-sample block where the norm pass would materialise one
anyway, and the engine drops its references to that layer's input and output-gradient (the graph
frees them after the node runs). Only the lowest layers (nothing handled below them; their nodes
would not otherwise run) and vmap-fallback layers have their output-gradients requested from
``autograd.grad`` and are processed after it. Measured peak of a DP step: ~1.05x a plain step on
the CNN/ResNet20-GN benchmarks (a difference query ~1.15-1.45x), instead of ~2x when every
output-gradient was held to the end. Layers on the Gram route (long sequences, few features) still
keep their input and output-gradient for the book-keeping sum; a model made mostly of those would
need the two-pass scheme (norms, then a backward of ``sum_i c_i l_i``), not implemented.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.func import functional_call, vjp, vmap

from privopt.errors import ConfigError, ModelError
from privopt.grads.engine import (
    ClippedSum,
    GradEngine,
    VmapEngine,
    clip_factors,
    flat_param_names,
    register_engine,
    resolve_weights,
)

__all__ = ["GhostEngine"]

# Upper bound on the elements of one temporary (Gram matrix, materialised block, unfolded patches)
# per batch chunk; keeps peak memory close to that of a plain backward pass.
_CHUNK_ELEMS = 1 << 24
# Budget (elements, all parameters together) for per-sample gradient blocks that the norm pass
# materialises anyway and keeps for the clipped sum (128 MiB in float32).
_KEEP_ELEMS = 1 << 25
# Process each layer call inside the backward pass as its output-gradient arrives (releasing its
# captures once condensed into a kept block). False requests every output-gradient and processes
# them after the backward pass: same numbers, about twice the activation memory (tests use it).
_IN_BACKWARD = True
# Blocks larger than the captured activations they replace are kept only below this size.
_SMALL_KEEP_ELEMS = 1 << 20


class _Unsupported(Exception):
    """The capture cannot be attributed to samples; the query falls back to the vmap engine."""


# --------------------------------------------------------------------------------------------
# Pieces: one layer call's contribution to one parameter's per-sample gradients.
# --------------------------------------------------------------------------------------------


class _Piece:
    """Contribution of one layer call to one parameter. ``scale`` ([B] or None) multiplies each
    sample's contribution (per-sample weight, and the sign of the previous point)."""

    kind = "dense"
    scale: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:  # [B, numel], scaled
        raise NotImplementedError

    def weighted_sum(self, coef: torch.Tensor) -> torch.Tensor:  # sum_i coef_i * scale_i * grad_i
        raise NotImplementedError

    def _coef(self, coef: torch.Tensor) -> torch.Tensor:
        return coef if self.scale is None else coef * self.scale


class _Dense(_Piece):
    """Per-sample gradients held explicitly, ``[B, *param_shape]`` (biases, norm affines, fallback)."""

    def __init__(self, grads: torch.Tensor):
        self.grads = grads
        self.shape = grads.shape[1:]

    @property
    def captured(self) -> int:
        return self.grads.numel()

    def dense(self):
        g = self.grads.reshape(self.grads.shape[0], -1)
        return g if self.scale is None else g * self.scale.unsqueeze(1)

    def weighted_sum(self, coef):
        c = self._coef(coef)
        return torch.tensordot(c, self.grads, dims=1)


class _Pair(_Piece):
    """Per-sample gradient ``sum_t outer(G[i, j, :, t], A[i, j, :, t])`` for each group ``j``, with
    ``G: [B, g, p, T]`` and ``A: [B, g, q, T]``; the parameter is that ``[g*p, q]`` reshaped."""

    kind = "pair"

    def __init__(self, G: torch.Tensor, A: torch.Tensor, shape: torch.Size):
        self._G, self._A, self.shape = G, A, shape

    @property
    def captured(
        self,
    ) -> int:  # elements of activations/gradients this piece holds on to
        return self._G.numel() + self._A.numel()

    @property
    def key(self):
        return (self._G.shape[1], self._G.shape[2], self.q)

    @property
    def q(self) -> int:
        return self._A.shape[2]

    @property
    def T(self) -> int:
        return self._G.shape[3]

    def G(self, sl: slice) -> torch.Tensor:
        g = self._G[sl]
        if self.scale is not None:
            g = g * self.scale[sl].view(-1, 1, 1, 1)
        return g

    def A(self, sl: slice) -> torch.Tensor:
        return self._A[sl]

    def materialize_raw(self, sl: slice) -> torch.Tensor:  # [b, numel], NOT scaled, freshly allocated
        G = self._G[sl]
        return torch.matmul(G, self.A(sl).transpose(2, 3)).reshape(G.shape[0], -1)

    def dense(self):
        return _combine([self], slice(None))

    def weighted_sum(self, coef):
        return _pairs_sum([self], coef)


def _pairs_sum(pieces: list[_Pair], coef: torch.Tensor) -> torch.Tensor:
    """``sum_i coef_i * (sum of pieces)_i`` for plain :class:`_Pair` pieces of one parameter: per
    piece one ``[g, p, B*T] @ [g, B*T, q]`` matmul over all samples and tokens, accumulated."""
    g, p, q = pieces[0].key
    # Pieces reading the same input (the first layer of a difference query sees the same batch
    # at both points) share one matmul: sum_i c_i (G_i - G'_i) a_i^T instead of two products.
    groups: dict = {}
    for pc in pieces:
        Gc = pc._G * pc._coef(coef).view(-1, 1, 1, 1)
        key = (_tensor_key(pc._A), pc.T)
        if key in groups:
            groups[key][0] = groups[key][0] + Gc
        else:
            groups[key] = [Gc, pc._A, pc.T]
    lhs, rhs = [], []
    for Gc, A, T in groups.values():
        if g == 1 and T == 1:  # plain Linear: [p, B] and [B, q] views, no copies
            lhs.append(Gc[:, 0, :, 0].t())
            rhs.append(A[:, 0, :, 0])
        else:
            lhs.append(Gc.permute(1, 2, 0, 3).reshape(g, p, -1))
            rhs.append(A.permute(1, 0, 3, 2).reshape(g, -1, q))
    # Accumulate one matmul per piece into the same output: no concatenated copies.
    mm = torch.mm if lhs[0].dim() == 2 else torch.matmul
    out = mm(lhs[0], rhs[0])
    for left, right in zip(lhs[1:], rhs[1:]):
        out = out.addmm_(left, right) if out.dim() == 2 else out.baddbmm_(left, right)
    return out.reshape(pieces[0].shape)


class _ConvPair(_Pair):
    """Convolution weight as a :class:`_Pair` over input patches (1-D convolutions are handled as
    height-1 2-D ones). Patches are only formed (as a strided view, far faster than ``F.unfold`` on
    CPU) for the Gram route; materialised per-sample gradients and the weighted sum both use the
    convolution weight-gradient kernel directly, the former with the batch folded into groups."""

    def __init__(self, x, grad_out, weight, stride, dilation, padding, groups):
        if x.dim() == 3:  # Conv1d
            x, grad_out = x.unsqueeze(2), grad_out.unsqueeze(2)
            stride, dilation, padding = (1, *stride), (1, *dilation), (0, *padding)
        self.x, self.grad_out, self.shape = x, grad_out, weight.shape
        self.w4 = weight.reshape(weight.shape[0], weight.shape[1], -1, weight.shape[-1])
        self.stride, self.dilation, self.padding, self.groups = (
            stride,
            dilation,
            padding,
            groups,
        )
        B, cout = grad_out.shape[:2]
        self._G = grad_out.reshape(B, groups, cout // groups, -1)

    @property
    def q(self) -> int:
        return int(self.shape[1:].numel())

    @property
    def captured(self) -> int:
        return self.x.numel() + self.grad_out.numel()

    def A(self, sl):
        x = self.x[sl]
        (ph, pw), (kh, kw) = self.padding, self.w4.shape[2:]
        if ph or pw:
            x = F.pad(x, (pw, pw, ph, ph))
        b, c, h, w = x.shape
        (sh, sw), (dh, dw) = self.stride, self.dilation
        ho, wo = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
        s0, s1, s2, s3 = x.stride()
        view = x.as_strided((b, c, kh, kw, ho, wo), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw))
        return view.reshape(b, self.groups, self.q, ho * wo)

    def _wgrad(self, go, x, groups):
        # Only the weight's shape matters for the weight gradient; its values are never read.
        o, rest = go.shape[1], self.w4.shape[1:]
        w = self.w4 if o == self.w4.shape[0] else self.w4.new_empty(o, *rest)
        return torch.ops.aten.convolution_backward(
            go,
            x,
            w,
            None,
            list(self.stride),
            list(self.padding),
            list(self.dilation),
            False,
            [0, 0],
            groups,
            [False, True, False],
        )[1]

    def materialize_raw(self, sl):
        go, x = self.grad_out[sl], self.x[sl]
        b = x.shape[0]
        # Per-sample weight gradients in one call: samples become convolution groups.
        w = (
            self._wgrad(
                go.reshape(1, -1, *go.shape[2:]),
                x.reshape(1, -1, *x.shape[2:]),
                b * self.groups,
            )
            if b > 1
            else self._wgrad(go, x, self.groups)
        )
        return w.reshape(b, -1)

    def weighted_sum(self, coef):
        go = self.grad_out * self._coef(coef).view(-1, 1, 1, 1)
        return self._wgrad(go, self.x, self.groups).reshape(self.shape)


class _Emb(_Piece):
    """Embedding weight: per-sample gradient ``sum_t onehot(idx_t) g_t^T``."""

    kind = "emb"

    def __init__(self, idx: torch.Tensor, G: torch.Tensor, num: int, padding_idx: int | None):
        B = idx.shape[0]
        self.idx, self.G, self.num = (
            idx.reshape(B, -1),
            G.reshape(B, -1, G.shape[-1]),
            num,
        )
        self.shape = torch.Size((num, G.shape[-1]))
        if padding_idx is not None:  # the padding row never receives gradient
            self.G = self.G * (self.idx != padding_idx).unsqueeze(-1).to(self.G.dtype)

    def scaled_G(self):
        return self.G if self.scale is None else self.G * self.scale.view(-1, 1, 1)

    def dense(self):
        B, _T, D = self.G.shape
        out = self.G.new_zeros(B * self.num, D)
        keys = (torch.arange(B, device=self.idx.device).unsqueeze(1) * self.num + self.idx).reshape(-1)
        out.index_add_(0, keys, self.scaled_G().reshape(-1, D))
        return out.reshape(B, -1)

    def weighted_sum(self, coef):
        D = self.G.shape[-1]
        G = self.G * self._coef(coef).view(-1, 1, 1)
        out = self.G.new_zeros(self.num, D)
        return out.index_add_(0, self.idx.reshape(-1), G.reshape(-1, D))


class _Keep:
    """Budget (in elements) for per-sample gradient blocks that the norm pass materialised anyway;
    a kept block turns that parameter's clipped sum into one cheap ``coef @ block`` instead of a
    second weight-gradient computation."""

    def __init__(self, elems: int):
        self.left = elems
        self.blocks: dict[str, torch.Tensor] = {}

    def offer(
        self,
        name: str,
        make: Callable[[], torch.Tensor],
        numel: int,
        captured: int | None = None,
    ) -> torch.Tensor | None:
        # A block bigger than the activations it replaces would raise peak memory: keep it only
        # when it is small in absolute terms.
        if numel > self.left or (captured is not None and numel > max(captured, _SMALL_KEEP_ELEMS)):
            return None
        self.left -= numel
        block = make()
        self.blocks[name] = block
        return block


def _sq_norms(name: str, pieces: list[_Piece], B: int, keep: _Keep) -> torch.Tensor:
    """Per-sample squared norm of the sum of ``pieces`` (all for parameter ``name``)."""
    kinds = {p.kind for p in pieces}
    if kinds == {"pair"} and len({p.key for p in pieces}) == 1:
        return _pair_sq_norms(name, pieces, B, keep)
    if kinds == {"emb"}:
        return _emb_sq_norms(pieces, B)

    total = keep.offer(name, lambda: _sum_dense(pieces), B * int(pieces[0].shape.numel()))
    if total is None:
        total = _sum_dense(pieces)
    return _row_sq(total)


def _pair_sq_norms(name: str, pieces: list[_Pair], B: int, keep: _Keep) -> torch.Tensor:
    g, p, q = pieces[0].key
    T = sum(pc.T for pc in pieces)
    if all(pc.T == 1 for pc in pieces):
        # One token per piece (plain Linear, possibly at two points): the Gram matrix is a few
        # row dot products, sum_{j,k} (g_j . g_k)(a_j . a_k).
        G = [pc.G(slice(None))[..., 0] for pc in pieces]
        A = [pc.A(slice(None))[..., 0] for pc in pieces]
        memo: dict = {}

        def dot(X, j, k):
            # A difference query feeds the same input batch to the first layer at both points:
            # identical tensors give identical dot products, computed once.
            key = tuple(sorted((_tensor_key(X[j]), _tensor_key(X[k]))))
            if key not in memo:
                memo[key] = torch.linalg.vecdot(X[j], X[k])
            return memo[key]

        out = 0
        for j in range(len(pieces)):
            out = out + (dot(G, j, j) * dot(A, j, j)).sum(1)
            for k in range(j):
                out = out + 2 * (dot(G, j, k) * dot(A, j, k)).sum(1)
        return out
    # Gram <GG^T, AA^T> costs ~T^2 (p+q) per group, materialising G^T A costs ~T p q.
    if T * (p + q) > p * q:
        return _materialized_sq_norms(name, pieces, B, g * p * q, keep)
    per_sample = g * T * T + g * (p + q) * T
    step = max(1, _CHUNK_ELEMS // max(per_sample, 1))
    out = []
    for s in range(0, B, step):
        sl = slice(s, min(B, s + step))
        G = torch.cat([pc.G(sl) for pc in pieces], dim=3) if len(pieces) > 1 else pieces[0].G(sl)
        A = torch.cat([pc.A(sl) for pc in pieces], dim=3) if len(pieces) > 1 else pieces[0].A(sl)
        gg = torch.matmul(G.transpose(2, 3), G)
        aa = torch.matmul(A.transpose(2, 3), A)
        out.append((gg * aa).sum((1, 2, 3)))
    return torch.cat(out) if len(out) > 1 else out[0]


def _tensor_key(t: torch.Tensor):
    return (t.data_ptr(), tuple(t.shape), t.stride(), t._version)


def _materialized_sq_norms(name: str, pieces: list[_Pair], B: int, numel: int, keep: _Keep) -> torch.Tensor:
    step = max(1, _CHUNK_ELEMS // max(2 * numel, 1))

    def chunks():
        for s in range(0, B, step):
            yield _combine(pieces, slice(s, min(B, s + step)))

    def whole():
        parts = list(chunks())
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    block = keep.offer(name, whole, B * numel, sum(pc.captured for pc in pieces))
    if block is not None:
        return _row_sq(block)
    out = [_row_sq(m) for m in chunks()]
    return torch.cat(out) if len(out) > 1 else out[0]


def _row_sq(m: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(m, dim=1).square()  # no [b, numel] temporary, unlike m.pow(2)


def _combine(pieces: list[_Pair], sl: slice) -> torch.Tensor:
    """``sum_k scale_k * piece_k`` materialised for the samples in ``sl``, accumulated in place."""
    out = None
    for pc in pieces:
        m = pc.materialize_raw(sl)
        s = None if pc.scale is None else pc.scale[sl].unsqueeze(1)
        if out is None:
            out = m if s is None else m.mul_(s)
        elif s is None:
            out.add_(m)
        else:
            out.addcmul_(m, s)
    return out


def _condense(n: str, pieces: dict[str, list[_Piece]], keep: _Keep, B: int, n_points: int) -> None:
    """Once all of one point's pieces of parameter ``n`` are in, turn them into a kept per-sample
    block if the norm pass would materialise it anyway (added into the first point's block for a
    difference query) and drop their activations/output-gradients. Called from inside the backward
    pass, so a layer's captures are released as soon as its block exists, and a difference query
    never holds both points' activations at once."""
    lst = pieces[n]
    if all(pc.kind == "dense" for pc in lst):
        # clone: a lone unscaled dense piece may alias an autograd output that is later added to
        make = lambda: _sum_dense(lst).clone()
    elif all(pc.kind == "pair" for pc in lst) and len({pc.key for pc in lst}) == 1:
        _g, p, q = lst[0].key
        if n_points * sum(pc.T for pc in lst) * (p + q) <= p * q:
            return  # the Gram route is cheaper: keep the captures
        make = lambda: _combine(lst, slice(None))
    else:
        return
    if n in keep.blocks:
        keep.blocks[n].add_(make())
    elif keep.offer(n, make, B * int(lst[0].shape.numel()), sum(pc.captured for pc in lst)) is None:
        return
    del pieces[n]


def _sum_dense(pieces: list[_Piece]) -> torch.Tensor:
    total = pieces[0].dense()
    for p in pieces[1:]:
        total = total + p.dense()
    return total


def _emb_sq_norms(pieces: list[_Emb], B: int) -> torch.Tensor:
    # Group tokens by (sample, row): the per-sample gradient's rows are the group sums.
    num = pieces[0].num
    idx = torch.cat([p.idx for p in pieces], dim=1)
    G = torch.cat([p.scaled_G() for p in pieces], dim=1)
    D = G.shape[-1]
    keys = (torch.arange(B, device=idx.device).unsqueeze(1) * num + idx).reshape(-1)
    uniq, inv = torch.unique(keys, return_inverse=True)
    rows = G.new_zeros(uniq.shape[0], D).index_add_(0, inv, G.reshape(-1, D))
    return G.new_zeros(B).index_add_(0, torch.div(uniq, num, rounding_mode="floor"), rows.pow(2).sum(1))


# --------------------------------------------------------------------------------------------
# Layer handlers: turn one captured call into pieces, by parameter local name.
# --------------------------------------------------------------------------------------------


def _batched(x: torch.Tensor, B: int, what: str, min_dim: int = 2) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() < min_dim or x.shape[0] != B:
        raise _Unsupported(f"{what}: input is not batch-first with batch size {B}")
    return x


def _linear(m: nn.Linear, x, gout, B):
    x = _batched(x, B, "Linear")
    A = x.reshape(B, -1, x.shape[-1]).transpose(1, 2).unsqueeze(1)  # [B, 1, in, T]
    G = gout.reshape(B, -1, gout.shape[-1]).transpose(1, 2).unsqueeze(1)  # [B, 1, out, T]
    out = {"weight": _Pair(G, A, m.weight.shape)}
    if m.bias is not None:
        out["bias"] = _Dense(G.sum(3).reshape(B, -1))
    return out


def _conv(m: nn.modules.conv._ConvNd, x, gout, B):
    dim = m.weight.dim() - 2
    x = _batched(x, B, type(m).__name__, min_dim=dim + 2)
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        # Pad explicitly, as _ConvNd does for these modes ('same' may pad asymmetrically), then
        # treat the layer as an unpadded convolution.
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        x = F.pad(x, m._reversed_padding_repeated_twice, mode=mode)
        padding = (0,) * dim
    else:
        padding = tuple(m.padding)
    out = {"weight": _ConvPair(x, gout, m.weight, tuple(m.stride), tuple(m.dilation), padding, m.groups)}
    if m.bias is not None:
        out["bias"] = _Dense(gout.reshape(B, gout.shape[1], -1).sum(2))
    return out


def _embedding(m: nn.Embedding, x, gout, B):
    x = _batched(x, B, "Embedding", min_dim=1)
    return {"weight": _Emb(x, gout, m.num_embeddings, m.padding_idx)}


def _affine(normalised: torch.Tensor, gout: torch.Tensor, B: int, reduce_dims, has_bias: bool):
    out = {"weight": _Dense((gout * normalised).sum(reduce_dims) if reduce_dims else gout * normalised)}
    if has_bias:
        out["bias"] = _Dense(gout.sum(reduce_dims) if reduce_dims else gout)
    return out


def _layer_norm(m: nn.LayerNorm, x, gout, B):
    k = len(m.normalized_shape)
    x = _batched(x, B, "LayerNorm", min_dim=k + 1)
    xn = F.layer_norm(x, m.normalized_shape, None, None, m.eps)
    return _affine(xn, gout, B, tuple(range(1, x.dim() - k)), m.bias is not None)


def _rms_norm(m, x, gout, B):
    k = len(m.normalized_shape)
    x = _batched(x, B, "RMSNorm", min_dim=k + 1)
    xn = F.rms_norm(x, m.normalized_shape, None, m.eps)
    return _affine(xn, gout, B, tuple(range(1, x.dim() - k)), False)


def _group_norm(m: nn.GroupNorm, x, gout, B):
    x = _batched(x, B, "GroupNorm")
    xn = F.group_norm(x, m.num_groups, None, None, m.eps)
    g = gout.flatten(2)
    # vecdot reduces the spatial dimension without a [B, C, HW] product temporary.
    out = {"weight": _Dense(torch.linalg.vecdot(g, xn.flatten(2)))}
    if m.bias is not None:
        out["bias"] = _Dense(g.sum(2))
    return out


def _embedding_ok(m):
    return m.max_norm is None and not m.scale_grad_by_freq


# (class, extra predicate, handler). A subclass is handled only if it keeps the base ``forward``.
_HANDLERS: list[tuple[type, Callable[[nn.Module], bool], Callable]] = [
    (nn.Linear, lambda m: True, _linear),
    (nn.Conv1d, lambda m: True, _conv),
    (nn.Conv2d, lambda m: True, _conv),
    (nn.Embedding, _embedding_ok, _embedding),
    (nn.LayerNorm, lambda m: True, _layer_norm),
    (nn.GroupNorm, lambda m: True, _group_norm),
]
if hasattr(nn, "RMSNorm"):
    _HANDLERS.append((nn.RMSNorm, lambda m: True, _rms_norm))


def _handler_for(m: nn.Module):
    for cls, ok, fn in _HANDLERS:
        if isinstance(m, cls) and type(m).forward is cls.forward and ok(m):
            return fn
    return None


# --------------------------------------------------------------------------------------------
# Capture at one parameter point.
# --------------------------------------------------------------------------------------------


class _Call:
    __slots__ = (
        "args",
        "edge",
        "handler",
        "kwargs",
        "module",
        "prefix",
        "values",
        "versions",
    )

    def __init__(self, module, prefix, args, kwargs, edge, handler, values):
        self.module, self.prefix, self.args, self.kwargs, self.edge = (
            module,
            prefix,
            args,
            kwargs,
            edge,
        )
        self.handler, self.values = handler, values
        self.versions = [a._version for a in args if isinstance(a, torch.Tensor)]


def _fallback_dense(call: _Call, local: list[str], gout: torch.Tensor, B: int) -> dict[str, _Piece]:
    """Per-sample gradients of ``local`` (the module's own parameters) by vmap over this layer."""
    module = call.module
    values = call.values
    flat, spec = torch.utils._pytree.tree_flatten((call.args, call.kwargs))
    tensors = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    in_dims = tuple(0 if flat[i].dim() > 0 and flat[i].shape[0] == B else None for i in tensors)
    if 0 not in in_dims:
        raise _Unsupported(f"{type(module).__name__}: no batch-first input")

    def one(tens, g):
        items = list(flat)
        for i, t, d in zip(tensors, tens, in_dims):
            items[i] = t.unsqueeze(0) if d == 0 else t
        args, kwargs = torch.utils._pytree.tree_unflatten(items, spec)

        def f(own):
            return functional_call(module, {**values, **own}, args, kwargs)

        _, pull = vjp(f, {n: values[n] for n in local})
        return pull(g.unsqueeze(0))[0]

    grads = vmap(one, in_dims=(in_dims, 0), randomness="different")(tuple(flat[i] for i in tensors), gout)
    return {n: _Dense(grads[n]) for n in local}


def _point_scale(weights, losses: torch.Tensor, sign: int) -> torch.Tensor | None:
    """Per-sample factor of one point's pieces: its weights, negated for a difference's second point."""
    w = resolve_weights(weights, losses)
    if w is not None:
        return w if sign > 0 else -w
    return -torch.ones_like(losses.detach()) if sign < 0 else None


def _has_target_below(root, targets: set) -> dict:
    """For every autograd node reachable from ``root``: whether a node of ``targets`` lies strictly
    below it (iterative post-order walk; graphs can be deeper than Python's recursion limit)."""
    below: dict = {}
    stack = [root]
    while stack:
        fn = stack[-1]
        if fn is None or fn in below:
            stack.pop()
            continue
        kids = [k for k, _ in fn.next_functions if k is not None]
        todo = [k for k in kids if k not in below]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        below[fn] = any(k in targets or below[k] for k in kids)
    return below


class _Structure:
    """What the capture needs to know about a model's parameters, computed once per model and
    reused while the module tree and its parameters (objects and ``requires_grad``) are unchanged."""

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
            own = {}
            for ln, p in mod.named_parameters(recurse=False):
                fn = by_obj.get(id(p))
                if fn in trainable:
                    own[ln] = fn
            if own:
                self.local_map[id(mod)] = own
                self.modules.append(mod)

    @staticmethod
    def signature_of(model: nn.Module):
        # Holding the structure keeps these objects alive, so their ids cannot be reused.
        return tuple(
            (
                id(m),
                tuple((k, id(v), v.requires_grad) for k, v in m._parameters.items() if v is not None),
            )
            for m in model.modules()
        )


_STRUCTURES: weakref.WeakKeyDictionary[nn.Module, _Structure] = weakref.WeakKeyDictionary()


def _structure(model: nn.Module) -> _Structure:
    sig = _Structure.signature_of(model)
    st = _STRUCTURES.get(model)
    if st is None or st.signature != sig:
        st = _STRUCTURES[model] = _Structure(model, sig)
    return st


class _Capture:
    """Forward + one backward at a parameter point; collects per-parameter pieces."""

    def __init__(self, model, structure: _Structure):
        self.model = model
        self.st = structure
        self.names = structure.names
        self.local_map = structure.local_map

    def run(
        self,
        loss_fn,
        inputs,
        targets,
        params: dict | None,
        *,
        weights=None,
        sign: int = 1,
        keep: _Keep | None = None,
        n_points: int = 1,
    ):
        """Forward, then one backward (output-gradients only) that turns each layer call into
        pieces *as its output-gradient arrives* (a pre-hook on the layer's output node), so that
        a layer whose pieces condense into a kept block releases its input and output-gradient
        right away instead of holding them until the end of the backward pass."""
        B = inputs.shape[0]
        calls: list[_Call] = []
        active = [True]

        def hook(module, args, kwargs, output):
            if not active[0]:
                return
            if not isinstance(output, torch.Tensor) or not output.requires_grad:
                raise _Unsupported(f"{type(module).__name__} output is not a differentiable tensor")
            handler = _handler_for(module)
            values = None
            if handler is None:  # fallback needs the parameter/buffer values of this point
                values = {
                    **dict(module.named_parameters()),
                    **dict(module.named_buffers()),
                }
            calls.append(
                _Call(
                    module,
                    None,
                    args,
                    kwargs,
                    get_gradient_edge(output),
                    handler,
                    values,
                )
            )
            return

        handles = [m.register_forward_hook(hook, with_kwargs=True) for m in self.st.modules]
        prehooks = []
        try:
            if params is None:
                out = self.model(inputs)
            else:
                out = functional_call(self.model, params, (inputs,))
            losses = loss_fn(out, targets)
            if not isinstance(losses, torch.Tensor) or losses.shape != (B,):
                raise ConfigError(
                    f"loss_fn must return per-sample losses of shape ({B},), got "
                    f"{tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__}"
                )
            active[0] = False
            for h in handles:
                h.remove()
            handles = []
            for c in calls:
                if [a._version for a in c.args if isinstance(a, torch.Tensor)] != c.versions:
                    # Plain autograd would reject this too (the weight gradient reads that input).
                    raise ModelError(
                        f"the input of layer {type(c.module).__name__} was modified in place after the layer "
                        "read it; per-sample gradients (and ordinary backward) would be wrong — avoid the in-place op"
                    )
            # The per-sample weights are known once the losses are: pieces are scaled (and, for
            # the previous point of a difference, negated) as they are created.
            scale = _point_scale(weights, losses, sign)
            pieces: dict[str, list[_Piece]] = {}
            uses: dict[str, int] = {}
            for c in calls:
                for n in self.local_map[id(c.module)].values():
                    uses[n] = uses.get(n, 0) + 1
            arrived: dict[str, int] = {}
            done: set[str] = set()
            errors: list[Exception] = []

            def process(c: _Call, g: torch.Tensor) -> None:
                own = self.local_map[id(c.module)]
                g = g.detach()
                if c.handler is not None:
                    got = c.handler(c.module, c.args[0].detach() if c.args else None, g, B)
                    got = {k: v for k, v in got.items() if k in own}
                else:
                    got = _fallback_dense(c, list(own), g, B)
                c.args = c.kwargs = c.values = None  # our references to its activations
                for ln, piece in got.items():
                    piece.scale = scale
                    pieces.setdefault(own[ln], []).append(piece)
                if keep is None:
                    return
                for n in own.values():
                    arrived[n] = arrived.get(n, 0) + 1
                    if arrived[n] == uses[n] and n in pieces:
                        done.add(n)
                        with torch.no_grad():
                            _condense(n, pieces, keep, B, n_points)

            total = losses.sum()
            direct = self._attach(total, calls, process, errors, prehooks)
            if direct:
                gouts = torch.autograd.grad(total, [c.edge for c in direct], allow_unused=True)
                for h in prehooks:
                    h.remove()
                prehooks = []
                if errors:
                    raise errors[0]
                for c, g in zip(direct, gouts):
                    if g is not None:
                        process(c, g)
            if keep is not None:  # parameters with an unused call (no gradient) end here
                for n in list(pieces):
                    if n not in done:
                        with torch.no_grad():
                            _condense(n, pieces, keep, B, n_points)
            missing = [n for n in self.names if n not in pieces and n not in done]
            if missing:
                self._check_unreachable(losses, missing, params)
        finally:
            active[0] = False
            for h in handles + prehooks:
                h.remove()
        return losses.detach(), pieces

    @staticmethod
    def _attach(total, calls, process, errors, prehooks) -> list[_Call]:
        """Register an output-gradient pre-hook on every handled layer call that the backward
        pass executes anyway, and return the calls whose output-gradients must be requested.

        A node runs in ``autograd.grad`` only if a requested gradient lies below it, and every
        requested gradient is held until the call returns. So only the *lowest* handled calls
        (no other handled call below them, e.g. the first layer) and the vmap-fallback calls are
        requested; every other handled call sits above one of them, runs, and is processed in its
        pre-hook, its output-gradient released after the node has run."""
        if not _IN_BACKWARD:  # every output-gradient requested, processed after the backward
            return list(calls)
        targets = {c.edge.node for c in calls if c.handler is not None}
        below = _has_target_below(total.grad_fn, targets)
        direct = []
        for c in calls:
            if c.handler is None or not below.get(c.edge.node, False):
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

    def _check_unreachable(self, losses, missing, params):
        """A parameter with no captured use must not influence the loss (else it is used outside
        its owning module, e.g. ``nn.MultiheadAttention.out_proj``)."""
        leaves = {}
        if params is None:
            leaves = {id(self.st.own[n]): n for n in missing}
        else:
            leaves = {id(params[n]): n for n in missing}
        seen, stack = set(), [losses.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            var = getattr(fn, "variable", None)
            if var is not None and id(var) in leaves:
                raise _Unsupported(f"parameter {leaves[id(var)]!r} is used outside its module's forward")
            stack.extend(nf for nf, _ in fn.next_functions)


# --------------------------------------------------------------------------------------------
# The engine.
# --------------------------------------------------------------------------------------------


@register_engine
class GhostEngine(GradEngine):
    """Ghost-norm + book-keeping engine: same results as ``vmap`` without per-sample gradients.

    Cost of a clipped-sum query is about one forward and one backward pass (output-gradients
    only) plus one matmul per layer; a difference query is twice that (layers reading the same
    input at both points share the matmul). Layers are processed inside the backward pass, so
    peak memory stays close to a non-private step (see the module docstring). Falls back to
    :class:`VmapEngine` (with a warning) for models whose
    layers cannot be attributed to samples.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from privopt.grads import get_engine
        >>> model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
        >>> x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 1, 0])
        >>> ghost = get_engine("ghost").clipped_sum(model, loss, x, y, clip=0.5)
        >>> ref = get_engine("vmap").clipped_sum(model, loss, x, y, clip=0.5)
        >>> bool(torch.allclose(ghost.total, ref.total, atol=1e-6))
        True
    """

    name = "ghost"

    @staticmethod
    def _params(st: _Structure, params):
        if params is None:
            return None
        unknown = [n for n in params if n not in st.own]
        if unknown:
            raise ConfigError(f"params has names that are not parameters of the model: {unknown[:5]}")
        full = {}
        for n, p in st.own.items():
            t = params.get(n, p).detach()
            full[n] = t.requires_grad_(True) if p.requires_grad else t
        return full

    def _point(self, model, st, loss_fn, inputs, targets, params, weights, sign, keep, n_points):
        full = self._params(st, params)
        with torch.enable_grad():  # the capture needs a graph even if the caller is in no_grad
            return _Capture(model, st).run(
                loss_fn,
                inputs,
                targets,
                full,
                weights=weights,
                sign=sign,
                keep=keep,
                n_points=n_points,
            )

    def _collect(
        self,
        model,
        loss_fn,
        inputs,
        targets,
        params,
        weights,
        params_prev,
        weights_prev,
        keep=None,
    ):
        st = _structure(model)
        n_points = 1 if params_prev is None else 2
        losses, pieces = self._point(model, st, loss_fn, inputs, targets, params, weights, +1, keep, n_points)
        losses_prev = None
        if params_prev is not None:
            losses_prev, prev = self._point(
                model,
                st,
                loss_fn,
                inputs,
                targets,
                params_prev,
                weights_prev,
                -1,
                keep,
                n_points,
            )
            for n, lst in prev.items():
                pieces.setdefault(n, []).extend(lst)
        return st, losses, losses_prev, pieces

    def per_sample_grads(self, model, loss_fn, inputs, targets, *, params=None):
        try:
            st, losses, _, pieces = self._collect(model, loss_fn, inputs, targets, params, None, None, None)
        except _Unsupported as e:
            _warn(e)
            return VmapEngine().per_sample_grads(model, loss_fn, inputs, targets, params=params)
        B = inputs.shape[0]
        cols = []
        for n in st.names:
            lst = pieces.get(n)
            if not lst:
                cols.append(losses.new_zeros(B, st.numels[n]))
                continue
            d = lst[0].dense()
            for pc in lst[1:]:
                d = d + pc.dense()
            cols.append(d)
        return losses, torch.cat(cols, dim=1).detach()

    def clipped_sum(
        self,
        model,
        loss_fn,
        inputs,
        targets,
        *,
        clip,
        params=None,
        weights=None,
        params_prev=None,
        weights_prev=None,
    ):
        if not clip > 0:
            raise ConfigError(f"clip threshold must be > 0, got {clip}")
        try:
            keep = _Keep(_KEEP_ELEMS)
            st, losses, losses_prev, pieces = self._collect(
                model,
                loss_fn,
                inputs,
                targets,
                params,
                weights,
                params_prev,
                weights_prev,
                keep,
            )
        except _Unsupported as e:
            _warn(e)
            return VmapEngine().clipped_sum(
                model,
                loss_fn,
                inputs,
                targets,
                clip=clip,
                params=params,
                weights=weights,
                params_prev=params_prev,
                weights_prev=weights_prev,
            )
        B = inputs.shape[0]
        with torch.no_grad():
            # Per-parameter contributions are summed in float64 and norms returned in float64,
            # as the vmap engine does (squared norms of heavily weighted samples overflow float32).
            sq = losses.new_zeros(B, dtype=torch.float64)
            for block in keep.blocks.values():  # condensed at capture time
                sq = sq + _row_sq(block)
            for n, lst in pieces.items():
                sq = sq + _sq_norms(n, lst, B, keep)
            # Difference norms are formed by cancellation; round-off can make them slightly < 0.
            norms = sq.clamp_min(0).sqrt()
            coef = clip_factors(norms, clip).to(losses.dtype)
            parts = []
            for n in st.names:
                lst = pieces.get(n)
                if not lst and n not in keep.blocks:
                    parts.append(losses.new_zeros(st.numels[n]))
                    continue
                if n in keep.blocks:
                    parts.append(coef @ keep.blocks[n])
                    continue
                if all(type(pc) is _Pair for pc in lst) and len({pc.key for pc in lst}) == 1:
                    parts.append(_pairs_sum(lst, coef).reshape(-1))
                    continue
                s = lst[0].weighted_sum(coef)
                for pc in lst[1:]:
                    s = s + pc.weighted_sum(coef)
                parts.append(s.reshape(-1))
            total = torch.cat(parts)
        return ClippedSum(
            total=total,
            norms=norms,
            losses=losses,
            losses_prev=losses_prev,
            clip=float(clip),
        )


def _warn(e: Exception) -> None:
    warnings.warn(
        f"ghost engine: {e}; answering with the vmap engine instead",
        RuntimeWarning,
        stacklevel=3,
    )
