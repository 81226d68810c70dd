"""Per-parameter norms and clipped sums, safe in floating point.

The pieces of one parameter (all layer calls, both points of a difference query) become one
*term* that answers two questions: per-sample squared norms, and ``sum_i coef_i h_i``. Each term
takes one of four forms, chosen from the structure alone (never from the data):

* materialised (kept blocks, dense pieces, embeddings' per-sample rows, mixed pieces): the norm is
  computed from the very vector that is summed, as in the vmap engine;
* a single outer product per sample (a plain Linear at one point, or at two points reading the
  same input, whose output-gradients are merged first): ``||g||^2 ||a||^2`` has no cancellation
  and the book-keeping sum rounds relative to the term itself;
* materialised in chunks when that is cheaper than the Gram route but the block is not kept;
* several outer products per sample (two points with different inputs, or tokens whose
  per-sample block is large): dot products or Gram norms and the book-keeping sum in float64,
  with a rigorous rounding bound added to the norm and a cap on how much any record's rounding
  can reach (:data:`MAGNITUDE_CAP`).

The argument is written out in ``docs/engines.md``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from privopt.grads.ghost.keep import Keep, gram_is_cheaper
from privopt.grads.ghost.pieces import EmbeddingGrads, OuterProductGrads, Piece, combine, sum_dense, zero_rows
from privopt.grads.ghost.tuning import TUNING

__all__ = ["MAGNITUDE_CAP", "U64", "NormPart", "Term", "build_term", "gamma", "row_sq"]

U64 = 2.0**-53
# A record whose outer products are more than this many times larger than its term is clipped as
# if its norm were (sum of their norms) / MAGNITUDE_CAP: the float64 rounding it causes in the sum
# stays below gamma_m * 2^20 * C (5e-8 C for 128 records of 2 products), far below the float32
# rounding every engine's sum already has, so it cannot move other records' terms measurably.
MAGNITUDE_CAP = 2.0**20


def gamma(n: int) -> float:
    """Worst-case relative rounding of a float64 sum of ``n`` products (Higham's gamma_n)."""
    nu = n * U64
    return nu / (1.0 - nu)


# Rows converted to float64 at a time in row_sq: the conversion buffer stays small enough for the
# allocator to reuse it, instead of a fresh (page-faulting) mapping the size of the whole block.
_ROW_SQ_ELEMS = 1 << 18
# Large float32 blocks: norms of slices of this many values in float32, combined in float64.
_SLICE = 64
U32 = 2.0**-24


def _exact_row_sq(m: torch.Tensor) -> torch.Tensor:
    if m.dtype == torch.float64 or m.numel() <= _ROW_SQ_ELEMS:
        return torch.linalg.vector_norm(m, dim=1, dtype=torch.float64).square()
    step = max(1, _ROW_SQ_ELEMS // max(m.shape[1], 1))
    parts = [torch.linalg.vector_norm(m[s : s + step], dim=1, dtype=torch.float64) for s in range(0, m.shape[0], step)]
    return torch.cat(parts).square()


def slice_bound_factor(k: int, n_slices: int) -> float:
    """Factor turning the float64 sum of squared float32 norms of ``n_slices`` slices of ``k``
    values into an upper bound of the exact squared norm: the float32 sum of ``k`` squares is at
    least ``(1 - k u32)`` times the exact one (non-negative terms, any order; ``2k`` is allowed,
    whatever summation or scaling the norm kernel uses), its square root rounds by ``u32``, the
    float64 square and sum by ``gamma(n_slices + 2)`` (one more rounding when the factor is
    applied: the margin ``2^-40``). About ``1 + 7.7e-6`` for 64-value slices."""
    return (1.0 + gamma(n_slices + 2)) / ((1.0 - U32) ** 2 * (1.0 - 2 * k * U32)) * (1.0 + 2.0**-40)


def row_sq(m: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row (float64): exact up to float64 rounding, or for a large float32
    block an upper bound at most ``8e-6`` (relative) above it (``docs/engines.md``, "Float safety", form 1).

    The exact way converts every value to float64 (about 1.5 ms for a ``[128, 36864]`` block on
    one CPU thread); the bound takes float32 norms of 64-value slices (about 0.5 ms) and inflates
    their float64 sum by the worst case of their rounding, plus ``2^-125`` per value for squares
    below float32's normal range (flushed to zero at worst). Rows where that absolute term would
    matter (squared norm below ``n 2^-100``) and rows whose float32 slice norms are not finite
    (values above ~1e19 square to infinity) are recomputed exactly, so tiny rows keep their exact
    norm and finite float32 gradients never get an infinite one.
    """
    n = m.shape[1] if m.dim() == 2 else 0
    if m.dtype != torch.float32 or m.numel() <= _ROW_SQ_ELEMS or n < _SLICE or not m.is_contiguous():
        return _exact_row_sq(m)
    full = n // _SLICE
    slices = torch.linalg.vector_norm(m.as_strided((m.shape[0], full, _SLICE), (n, _SLICE, 1)), dim=2)
    sq = slices.to(torch.float64).square_().sum(1)
    if full * _SLICE < n:  # the remainder: exact
        sq.add_(_exact_row_sq(m[:, full * _SLICE :]))
    redo = ~(sq >= n * 2.0**-100) | torch.isinf(sq)  # tiny, NaN or infinite
    sq.add_(n * 2.0**-125).mul_(slice_bound_factor(_SLICE, full + 1))
    if bool(redo.any()):
        sq[redo] = _exact_row_sq(m[redo])
    return sq


@dataclass
class NormPart:
    """One parameter's share of the per-sample norm bound (all ``[B]``, float64).

    Attributes:
        sq: upper bound on the squared norm of each record's term.
        slack: bound on the rounding of the clipped sum attributable to a record, per unit of
            its clip factor (``None``: the sum rounds relative to the term itself).
        magnitude: sum of the norms of the record's outer products (given with ``slack``).
    """

    sq: torch.Tensor
    slack: torch.Tensor | None = None
    magnitude: torch.Tensor | None = None


class Term(abc.ABC):
    """One parameter's per-sample terms, in the form chosen by :func:`build_term`."""

    @abc.abstractmethod
    def norms(self) -> NormPart | None:
        """This term's share of the per-sample norm bound (None: counted in another term)."""

    @abc.abstractmethod
    def clipped_sum(self, coef: torch.Tensor) -> torch.Tensor:
        """Flat ``sum_i coef_i h_i`` in the model's dtype (``coef``: float64 ``[B]``)."""

    @abc.abstractmethod
    def zero_samples(self, valid: torch.Tensor) -> None:
        """Make the terms of samples outside ``valid`` exactly zero (whatever their values)."""


class MaterialisedTerm(Term):
    """Per-sample block ``[B, numel]``: norms from the rows, sum ``coef @ block``."""

    def __init__(self, block: torch.Tensor):
        self.block = block

    def norms(self):
        return NormPart(row_sq(self.block))

    def clipped_sum(self, coef):
        return coef.to(self.block.dtype) @ self.block

    def zero_samples(self, valid):
        self.block = zero_rows(self.block, valid)


class _PiecesTerm(Term):
    """A term computed from its pieces' captures."""

    def __init__(self, pieces: list[Piece]):
        self.pieces = pieces

    def zero_samples(self, valid):
        for pc in self.pieces:
            pc.zero_samples(valid)


class SingleOuterTerm(_PiecesTerm):
    """One outer product per sample and group: ``||h||^2 = sum_groups ||g||^2 ||a||^2``; with the
    layer's bias fused in (:class:`BiasOfTerm`), ``||g||^2 (||a||^2 + 1)``."""

    bias = False

    def norms(self):
        (pc,) = self.pieces
        flat = pc.rows2d()
        if flat is not None and pc.scale is None:  # plain Linear: [B] norms of the 2-D views, fewest ops
            g = torch.linalg.vector_norm(flat[0], dim=1, dtype=torch.float64).square_()
            a = torch.linalg.vector_norm(flat[1], dim=1, dtype=torch.float64).square_()
            return NormPart(a.add_(1.0).mul_(g) if self.bias else a.mul_(g))
        g = torch.linalg.vector_norm(pc.G(slice(None)), dim=(2, 3), dtype=torch.float64).square()
        a = torch.linalg.vector_norm(pc.A(slice(None)), dim=(2, 3), dtype=torch.float64).square()
        return NormPart((g * (a + 1.0) if self.bias else g * a).sum(1))

    def clipped_sum(self, coef):
        (pc,) = self.pieces
        return pc.weighted_sum(coef.to(pc.dtype)).reshape(-1)


class BiasOfTerm(Term):
    """The bias of a Linear layer fused into its weight's :class:`SingleOuterTerm`: its per-sample
    gradient is that term's output-gradient row, its norm is counted there (``norms`` is None),
    and its sum ``sum_i coef_i g_i`` reads the same rows (one product per record)."""

    def __init__(self, weight: SingleOuterTerm):
        self.weight = weight

    def norms(self):
        return None

    def clipped_sum(self, coef):
        (pc,) = self.weight.pieces  # read now: zero_samples may have replaced its tensors
        flat = pc.rows2d()
        G = flat[0] if flat is not None else pc._G[:, 0, :, 0]
        return pc._coef(coef.to(pc.dtype)) @ G

    def zero_samples(self, valid):
        pass  # the shared rows are zeroed by the weight's term


def fuse_bias(pieces: list[Piece], built: dict[str, Term]) -> Term | None:
    """A :class:`BiasOfTerm` when ``pieces`` are Linear biases whose weight pieces form exactly
    one already-built :class:`SingleOuterTerm`, else None."""
    partners = {id(pc.partner) for pc in pieces}
    if len(partners) != len(pieces):
        return None
    for term in reversed(built.values()):  # the weight is normally the parameter just before
        if (
            isinstance(term, SingleOuterTerm)
            and not term.bias
            and {id(x) for x in (term.pieces[0].merged_from or term.pieces)} == partners
        ):
            term.bias = True
            return BiasOfTerm(term)
    return None


class ChunkedTerm(_PiecesTerm):
    """Materialised chunk by chunk, once for the norms and again for the sum (block not kept)."""

    def _chunks(self):
        B = self.pieces[0].batch_size
        numel = int(self.pieces[0].shape.numel())
        step = max(1, TUNING.chunk_elems // max(2 * numel, 1))
        for s in range(0, B, step):
            sl = slice(s, min(B, s + step))
            yield sl, combine(self.pieces, sl)

    def norms(self):
        return NormPart(torch.cat([row_sq(m) for _, m in self._chunks()]))

    def clipped_sum(self, coef):
        total = None
        for sl, m in self._chunks():
            part = coef[sl].to(m.dtype) @ m
            total = part if total is None else total.add_(part)
        return total


def _float64_bound(est: torch.Tensor, mag: torch.Tensor, *, n_norm: int, n_sum: int) -> NormPart:
    """Rigorous bounds for float64 routes (docs/engines.md, "float safety"): the computed magnitude
    inflated by its own rounding, the norm estimate plus ``gamma * magnitude^2``, and the rounding
    of the sum per unit of clip factor."""
    magnitude = mag * (1.0 + 2.0 * gamma(n_norm))
    sq = est.clamp_min(0) + gamma(n_norm) * magnitude.square()
    return NormPart(sq, gamma(n_sum) * magnitude, magnitude)


class Float64DotsTerm(_PiecesTerm):
    """One outer product per piece but several pieces per sample (two points reading different
    inputs, a layer called twice): float64 dot products and sum, with a rounding bound."""

    def __init__(self, pieces: list[OuterProductGrads]):
        super().__init__(pieces)
        self.g = pieces[0].key[0]
        # [B, g, p] and [B, g, q]; a plain Linear (g = 1) keeps [B, p] and [B, q] for mm.
        squeeze = (lambda t: t[:, 0, :, 0]) if self.g == 1 else (lambda t: t[..., 0])
        self.X = [squeeze(pc.G(slice(None))).to(torch.float64) for pc in pieces]
        self.Y = [squeeze(pc.A(slice(None))).to(torch.float64) for pc in pieces]

    def norms(self):
        B, p, q, J = self.X[0].shape[0], self.X[0].shape[-1], self.Y[0].shape[-1], len(self.X)
        per_sample = (lambda t: t) if self.g == 1 else (lambda t: t.sum(1))  # sum over groups
        if J > 2:  # a layer called many times (a recurrent step): one batched Gram, not J^2 kernel calls
            X, Y = torch.stack(self.X, -2), torch.stack(self.Y, -2)  # [B, (g,) J, p or q]
            gg, aa = X @ X.transpose(-1, -2), Y @ Y.transpose(-1, -2)  # [B, (g,) J, J]
            est = per_sample((gg * aa).sum((-1, -2)))
            diag = gg.diagonal(dim1=-2, dim2=-1) * aa.diagonal(dim1=-2, dim2=-1)
            mag = per_sample(diag.clamp_min(0).sqrt().sum(-1))
            return _float64_bound(est, mag, n_norm=p + q + self.g * J * J + 4, n_sum=B * J + J + 4)
        est, mag = 0, 0
        for j in range(J):
            for k in range(j, J):
                prod = torch.linalg.vecdot(self.X[j], self.X[k]) * torch.linalg.vecdot(self.Y[j], self.Y[k])
                if j == k:
                    est, mag = est + per_sample(prod), mag + per_sample(prod.clamp_min(0).sqrt())
                else:
                    est = est + 2 * per_sample(prod)
        return _float64_bound(est, mag, n_norm=p + q + self.g * J * J + 4, n_sum=B * J + J + 4)

    def clipped_sum(self, coef):
        out = None
        for X, Y in zip(self.X, self.Y):
            if self.g == 1:
                lhs, rhs = (X * coef.unsqueeze(1)).t(), Y
                out = lhs @ rhs if out is None else out.addmm_(lhs, rhs)
            else:
                lhs, rhs = (X * coef.view(-1, 1, 1)).permute(1, 2, 0), Y.transpose(0, 1)
                out = lhs @ rhs if out is None else out.baddbmm_(lhs, rhs)
        return out.to(self.pieces[0].dtype).reshape(-1)

    def zero_samples(self, valid):
        self.X = [zero_rows(x, valid) for x in self.X]
        self.Y = [zero_rows(y, valid) for y in self.Y]


class Float64GramTerm(_PiecesTerm):
    """Several tokens per sample: float64 Gram norms and sum, with a rounding bound, by chunks."""

    def __init__(self, pieces: list[OuterProductGrads]):
        super().__init__(pieces)
        pc = pieces[0]
        self.B, (self.g, self.p, self.q) = pc.batch_size, pc.key
        self.J = sum(x.T for x in pieces)

    def _xy(self, sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
        X = torch.cat([pc.G(sl).to(torch.float64) for pc in self.pieces], dim=3)
        Y = torch.cat([pc.A(sl).to(torch.float64) for pc in self.pieces], dim=3)
        return X, Y

    def _slices(self) -> list[slice]:
        g, p, q, J = self.g, self.p, self.q, self.J
        step = max(1, TUNING.chunk_elems // max(g * J * (p + q + J), 1))
        return [slice(s, min(self.B, s + step)) for s in range(0, self.B, step)]

    def norms(self):
        est, mag = [], []
        for sl in self._slices():
            X, Y = self._xy(sl)
            gg, aa = X.transpose(2, 3) @ X, Y.transpose(2, 3) @ Y
            est.append((gg * aa).sum((1, 2, 3)))
            diag = gg.diagonal(dim1=2, dim2=3) * aa.diagonal(dim1=2, dim2=3)
            mag.append(diag.clamp_min(0).sqrt().sum((1, 2)))
        g, p, q, J = self.g, self.p, self.q, self.J
        return _float64_bound(torch.cat(est), torch.cat(mag), n_norm=p + q + g * J * J + 4, n_sum=(J + 1) * self.B + 4)

    def clipped_sum(self, coef):
        g, p, q = self.g, self.p, self.q
        out = None
        for sl in self._slices():
            X, Y = self._xy(sl)
            lhs = (X * coef[sl].view(-1, 1, 1, 1)).permute(1, 2, 0, 3).reshape(g, p, -1)
            rhs = Y.permute(1, 0, 3, 2).reshape(g, -1, q)
            out = lhs @ rhs if out is None else out.baddbmm_(lhs, rhs)
        return out.to(self.pieces[0].dtype).reshape(-1)


class EmbeddingTerm(Term):
    """Embedding rows materialised per (sample, row): norms and sum both read those rows."""

    def __init__(self, pieces: list[EmbeddingGrads], B: int):
        num = pieces[0].num
        idx = torch.cat([p.idx for p in pieces], dim=1)
        G = torch.cat([p.scaled_G() for p in pieces], dim=1)
        D = G.shape[-1]
        keys = (torch.arange(B, device=idx.device).unsqueeze(1) * num + idx).reshape(-1)
        uniq, inv = torch.unique(keys, return_inverse=True)
        self.rows = G.new_zeros(uniq.shape[0], D).index_add_(0, inv, G.reshape(-1, D))
        self.sample = torch.div(uniq, num, rounding_mode="floor")
        self.row = uniq - self.sample * num
        self.B, self.num = B, num

    def norms(self):
        per_row = torch.linalg.vector_norm(self.rows, dim=1, dtype=torch.float64).square()
        return NormPart(per_row.new_zeros(self.B).index_add_(0, self.sample, per_row))

    def clipped_sum(self, coef):
        scaled = self.rows * coef.to(self.rows.dtype)[self.sample].unsqueeze(1)
        return self.rows.new_zeros(self.num, self.rows.shape[1]).index_add_(0, self.row, scaled).reshape(-1)

    def zero_samples(self, valid):
        self.rows = self.rows.masked_fill(~valid[self.sample].unsqueeze(1), 0)


def merge_shared_inputs(pieces: list[OuterProductGrads]) -> list[OuterProductGrads]:
    """Pieces reading the same input (a difference query's first layer sees the same batch at
    both points) become one: ``(w g - w' g') a^T`` instead of two products that cancel."""
    groups: dict[tuple, list[OuterProductGrads]] = {}
    for pc in pieces:
        groups.setdefault(pc.input_key(), []).append(pc)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        G = group[0].G(slice(None))
        for pc in group[1:]:
            G = G + pc.G(slice(None))
        merged = group[0].with_output_grad(G)
        merged.merged_from = tuple(group)
        out.append(merged)
    return out


def _pair_term(name: str, pieces: list[OuterProductGrads], keep: Keep, B: int) -> Term:
    g, p, q = pieces[0].key
    tokens = sum(pc.T for pc in pieces)
    if len(pieces) == 1 and tokens == 1:
        return SingleOuterTerm(pieces)
    if tokens == len(pieces):  # one outer product per piece: dot products are cheapest
        return Float64DotsTerm(pieces)
    numel, gram = B * g * p * q, gram_is_cheaper(tokens, p, q)
    if not gram or numel <= TUNING.small_keep_elems:  # small blocks: materialising is cheap and exact
        block = keep.offer(name, lambda: combine(pieces, slice(None)), numel, sum(pc.captured for pc in pieces))
        if block is not None:
            return MaterialisedTerm(block)
    return Float64GramTerm(pieces) if gram else ChunkedTerm(pieces)


def build_term(name: str, pieces: list[Piece], keep: Keep, B: int, built: dict[str, Term] | None = None) -> Term:
    """The term of parameter ``name`` from its kept block and/or remaining pieces (``built``: the
    terms of the parameters before it, where a Linear bias looks for its weight's)."""
    block = keep.blocks.get(name)
    if block is not None:
        return MaterialisedTerm(block + sum_dense(pieces) if pieces else block)
    kinds = {pc.kind for pc in pieces}
    if kinds == {"bias"}:
        fused = fuse_bias(pieces, built or {})
        if fused is not None:
            return fused
    if kinds == {"emb"}:
        return EmbeddingTerm(pieces, B)
    if kinds == {"pair"} and len({pc.key for pc in pieces}) == 1:
        return _pair_term(name, merge_shared_inputs(pieces), keep, B)
    return MaterialisedTerm(sum_dense(pieces))
