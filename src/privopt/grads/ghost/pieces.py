"""Pieces: one layer call's contribution to one parameter's per-sample gradients.

A layer rule (:mod:`privopt.grads.ghost.rules`) turns a captured call into pieces; the engine never
asks a piece for more than it needs. Pieces that are *implicit* (outer products of captured
output-gradients and inputs, embedding lookups) are only materialised when that is cheaper than
working with the captures. How their norms are made safe in floating point: ``docs/engines.md``.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import torch
import torch.nn.functional as F

from privopt.grads.ghost.tuning import TUNING

__all__ = [
    "ConvOuterProducts",
    "DenseGrads",
    "EmbeddingGrads",
    "LinearBiasGrads",
    "OuterProductGrads",
    "Piece",
    "tensor_key",
]


def tensor_key(t: torch.Tensor) -> tuple:
    """Identity of a tensor's contents (same storage, view and version): equal keys, equal values."""
    return (t.data_ptr(), tuple(t.shape), t.stride(), t._version)


def _rows(t: torch.Tensor, sl: slice) -> torch.Tensor:
    """``t[sl]``, without an indexing op for the whole batch (the common case)."""
    return t if sl == slice(None) else t[sl]


def zero_rows(t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose samples (dim 0) outside ``valid`` are exactly zero (out of place:
    captures may share storage with the caller's input)."""
    return t.masked_fill(~valid.view(-1, *([1] * (t.dim() - 1))), 0)


class Piece:
    """Contribution of one layer call to one parameter.

    ``scale`` (``[B]`` or ``None``) multiplies each sample's contribution: its per-sample weight,
    negated for the second point of a difference query. Set by the engine, not by layer rules.
    """

    kind: ClassVar[str] = "dense"
    scale: torch.Tensor | None = None
    shape: torch.Size

    @property
    def captured(self) -> int:
        """Elements of activations/gradients this piece holds on to."""
        raise NotImplementedError

    def dense(self) -> torch.Tensor:
        """Scaled per-sample gradients, ``[B, numel]``."""
        raise NotImplementedError

    def weighted_sum(self, coef: torch.Tensor) -> torch.Tensor:
        """``sum_i coef_i * scale_i * grad_i``, shaped like the parameter."""
        raise NotImplementedError

    def zero_samples(self, valid: torch.Tensor) -> None:
        """Replace the held tensors by copies whose samples outside ``valid`` are zero."""
        raise NotImplementedError

    def _coef(self, coef: torch.Tensor) -> torch.Tensor:
        return coef if self.scale is None else coef * self.scale

    def _zero_scale(self, valid: torch.Tensor) -> None:
        if self.scale is not None:
            self.scale = zero_rows(self.scale, valid)


class DenseGrads(Piece):
    """Per-sample gradients held explicitly, ``[B, *param_shape]`` (biases, norm affines, the
    per-layer vmap rule, and any custom rule without a cheaper form)."""

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
        return torch.tensordot(self._coef(coef), self.grads, dims=1)

    def zero_samples(self, valid):
        self.grads = zero_rows(self.grads, valid)
        self._zero_scale(valid)


class LinearBiasGrads(DenseGrads):
    """The bias of a Linear layer without token dimensions: its per-sample gradient is the
    output-gradient row ``g_i`` that the weight's piece ``partner`` (``g_i a_i^T``) already holds.
    When the weight's term is one outer product per sample, the two are clipped and summed as one
    vector ``[g_i a_i^T, g_i]`` (``||.||^2 = ||g_i||^2 (||a_i||^2 + 1)``) and this piece needs no
    block of its own; otherwise it is an ordinary dense piece."""

    kind = "bias"

    def __init__(self, grads: torch.Tensor, partner: OuterProductGrads):
        super().__init__(grads)
        self.partner = partner


class OuterProductGrads(Piece):
    """Per-sample gradient ``sum_t outer(G[i, j, :, t], A[i, j, :, t])`` for each group ``j``, with
    ``G: [B, g, p, T]`` (output-gradients) and ``A: [B, g, q, T]`` (inputs); the parameter is that
    ``[g*p, q]`` matrix reshaped to ``shape``."""

    kind = "pair"

    def __init__(self, G: torch.Tensor, A: torch.Tensor, shape: torch.Size):
        self._G, self._A, self.shape = G, A, torch.Size(shape)
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None  # see rows2d
        # the pieces whose merged sum this is (None: only itself; no self-reference, so no cycle)
        self.merged_from: tuple[OuterProductGrads, ...] | None = None

    @classmethod
    def from_tokens(cls, grad_output: torch.Tensor, activation: torch.Tensor, shape) -> OuterProductGrads:
        """A token-wise linear map: ``grad_output [B, ..., p]`` and ``activation [B, ..., q]``
        with the same middle (token) dimensions; the weight is ``[p, q]``."""
        if grad_output.dim() == 2:  # no tokens: [B, 1, p, 1] views, without the reshapes
            out = cls(grad_output[:, None, :, None], activation[:, None, :, None], shape)
            out._flat = (grad_output, activation)
            return out
        B = grad_output.shape[0]
        A = activation.reshape(B, -1, activation.shape[-1]).transpose(1, 2).unsqueeze(1)
        G = grad_output.reshape(B, -1, grad_output.shape[-1]).transpose(1, 2).unsqueeze(1)
        return cls(G, A, shape)

    @property
    def captured(self) -> int:
        return self._G.numel() + self._A.numel()

    @property
    def key(self) -> tuple[int, int, int]:
        return (self._G.shape[1], self._G.shape[2], self.q)

    @property
    def batch_size(self) -> int:
        return self._G.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self._G.dtype

    @property
    def q(self) -> int:
        return self._A.shape[2]

    @property
    def T(self) -> int:
        return self._G.shape[3]

    def input_key(self) -> tuple:
        """Pieces with equal input keys read the same input (a difference query's first layer)."""
        return (tensor_key(self._A), self.T)

    def G(self, sl: slice) -> torch.Tensor:
        """Scaled output-gradients of the samples in ``sl``."""
        g = _rows(self._G, sl)
        if self.scale is not None:
            g = g * _rows(self.scale, sl).view(-1, 1, 1, 1)
        return g

    def A(self, sl: slice) -> torch.Tensor:
        return _rows(self._A, sl)

    def rows2d(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(G [B, p], A [B, q])``, unscaled, for a plain Linear (one group, one token); else None.
        The terms of the most common layer work on these directly: every indexing op saved is a
        few microseconds of a millisecond step (``docs/engines.md``, "Fixed per-call cost")."""
        if self._flat is None and self._G.shape[1] == 1 and self._G.shape[3] == 1:
            self._flat = (self._G[:, 0, :, 0], self._A[:, 0, :, 0])
        return self._flat

    def with_output_grad(self, G: torch.Tensor) -> OuterProductGrads:
        """The same input with (already scaled) output-gradients ``G``."""
        return OuterProductGrads(G, self._A, self.shape)

    def materialize_raw(self, sl: slice) -> torch.Tensor:
        """``[b, numel]`` per-sample gradients of ``sl``, NOT scaled, freshly allocated."""
        G = self._G[sl]
        return torch.matmul(G, self.A(sl).transpose(2, 3)).reshape(G.shape[0], -1)

    def dense(self):
        return combine([self], slice(None))

    def weighted_sum(self, coef):
        flat = self.rows2d()
        if flat is not None:  # plain Linear: [p, B] * c @ [B, q] on views, no copies
            return torch.mm(flat[0].t() * self._coef(coef), flat[1]).reshape(self.shape)
        Gc = self._G * self._coef(coef).view(-1, 1, 1, 1)
        g, p, q = self.key
        lhs = Gc.permute(1, 2, 0, 3).reshape(g, p, -1)
        rhs = self._A.permute(1, 0, 3, 2).reshape(g, -1, q)
        return torch.matmul(lhs, rhs).reshape(self.shape)

    def zero_samples(self, valid):
        self._G, self._A = zero_rows(self._G, valid), zero_rows(self._A, valid)
        self._flat = None
        self._zero_scale(valid)


class ConvOuterProducts(OuterProductGrads):
    """Convolution weight as outer products over input patches (1-D convolutions are handled as
    height-1 2-D ones). Patches are only formed (as a strided view, far faster than ``F.unfold`` on
    CPU) where a route needs them; materialised per-sample gradients and the weighted sum use the
    convolution weight-gradient kernel directly, the former with the batch folded into groups."""

    def __init__(self, x, grad_out, weight, stride, dilation, padding, groups):
        if x.dim() == 3:  # Conv1d
            x, grad_out = x.unsqueeze(2), grad_out.unsqueeze(2)
            stride, dilation, padding = (1, *stride), (1, *dilation), (0, *padding)
        self.x, self.grad_out, self.shape = x, grad_out, weight.shape
        self.merged_from = None
        self.w4 = weight.reshape(weight.shape[0], weight.shape[1], -1, weight.shape[-1])
        self.stride, self.dilation, self.padding, self.groups = stride, dilation, padding, groups
        B, cout = grad_out.shape[:2]
        self._G = grad_out.reshape(B, groups, cout // groups, -1)

    @property
    def q(self) -> int:
        return int(self.shape[1:].numel())

    def rows2d(self):
        return None  # the input patches are a view formed on demand

    @property
    def captured(self) -> int:
        return self.x.numel() + self.grad_out.numel()

    def input_key(self) -> tuple:
        return (tensor_key(self.x), self.T)

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

    def with_output_grad(self, G):
        out = copy.copy(self)
        out._G, out.grad_out, out.scale = G, G.reshape(self.grad_out.shape), None
        return out

    def _wgrad(self, go, x, groups):
        # Only the weight's shape matters for the weight gradient; its values are never read.
        o, rest = go.shape[1], self.w4.shape[1:]
        w = self.w4 if o == self.w4.shape[0] else self.w4.new_empty(o, *rest)
        stride, padding, dilation = list(self.stride), list(self.padding), list(self.dilation)
        mask = [False, True, False]
        return torch.ops.aten.convolution_backward(
            go, x, w, None, stride, padding, dilation, False, [0, 0], groups, mask
        )[1]

    def patches_are_faster(self) -> bool:
        """Whether per-sample gradients are formed faster as a batched matmul over input patches
        than by the grouped weight-gradient kernel: on thin inputs (a 3x3 kernel over at most 3
        channels, e.g. an image stem), measured on CPU with one thread (1.8-2x); on wider inputs
        the grouped kernel wins or ties. Decided from shapes alone; both give the per-sample
        gradients up to float32 rounding."""
        return self.q <= 32

    def materialize_raw(self, sl):
        if self.patches_are_faster():
            return self._by_patches(sl)
        go, x = self.grad_out[sl], self.x[sl]
        b = x.shape[0]
        if b == 1:
            return self._wgrad(go, x, self.groups).reshape(1, -1)
        # Per-sample weight gradients in one call: samples become convolution groups.
        folded = self._wgrad(go.reshape(1, -1, *go.shape[2:]), x.reshape(1, -1, *x.shape[2:]), b * self.groups)
        return folded.reshape(b, -1)

    def _by_patches(self, sl):
        # By chunks of samples: the patches of a chunk are copied once (im2col) for the matmul.
        # Patches on the left ([q, T] @ [T, p], then the small [q, p] result transposed): on CPU
        # with one thread 25-37 % faster than [p, T] @ [T, q] for these thin inputs (cnn stem
        # B = 128: 0.54 against 0.86 ms; resnet20 stem: 2.5 against 3.5 ms).
        start, stop, _ = sl.indices(self.batch_size)
        step = max(1, TUNING.chunk_elems // max(self.key[0] * self.q * self.T, 1))
        parts = [
            torch.matmul(self.A(slice(s, min(stop, s + step))), self._G[s : min(stop, s + step)].transpose(2, 3))
            for s in range(start, stop, step)
        ]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.transpose(2, 3).reshape(stop - start, -1)

    def weighted_sum(self, coef):
        go = self.grad_out * self._coef(coef).view(-1, 1, 1, 1)
        return self._wgrad(go, self.x, self.groups).reshape(self.shape)

    def zero_samples(self, valid):
        self.x, self.grad_out = zero_rows(self.x, valid), zero_rows(self.grad_out, valid)
        self._G = self.grad_out.reshape(self._G.shape)
        self._zero_scale(valid)


class EmbeddingGrads(Piece):
    """Embedding weight: per-sample gradient ``sum_t onehot(idx_t) g_t^T`` (``idx: [B, ...]``,
    ``G: [B, ..., D]``); rows of ``padding_idx`` receive no gradient."""

    kind = "emb"

    def __init__(self, idx: torch.Tensor, G: torch.Tensor, num: int, padding_idx: int | None):
        B = idx.shape[0]
        self.idx, self.G, self.num = idx.reshape(B, -1), G.reshape(B, -1, G.shape[-1]), num
        self.shape = torch.Size((num, G.shape[-1]))
        if padding_idx is not None:
            self.G = self.G * (self.idx != padding_idx).unsqueeze(-1).to(self.G.dtype)

    @property
    def captured(self) -> int:
        return self.G.numel() + self.idx.numel()

    def scaled_G(self) -> torch.Tensor:
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
        return self.G.new_zeros(self.num, D).index_add_(0, self.idx.reshape(-1), G.reshape(-1, D))

    def zero_samples(self, valid):
        self.G = zero_rows(self.G, valid)
        self._zero_scale(valid)


def combine(pieces: list[OuterProductGrads], sl: slice) -> torch.Tensor:
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


def sum_dense(pieces: list[Piece]) -> torch.Tensor:
    """``[B, numel]`` sum of the pieces' scaled per-sample gradients (may alias a lone piece's tensor)."""
    total = pieces[0].dense()
    for p in pieces[1:]:
        total = total + p.dense()
    return total
