"""The ghost-norm + book-keeping engine: per-sample clipping without ``[B, d]`` per-sample gradients."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from privopt.errors import ConfigError, PrivoptRuntimeWarning
from privopt.grads.engine import (
    ClippedSum,
    GradEngine,
    VmapEngine,
    clip_factors,
    fixed_min_rows,
    pair_scales,
    register_engine,
    resolve_scale,
)
from privopt.grads.ghost.capture import Capture, Structure, structure
from privopt.grads.ghost.keep import Keep
from privopt.grads.ghost.pieces import Piece, sum_dense
from privopt.grads.ghost.rules import Unsupported
from privopt.grads.ghost.terms import MAGNITUDE_CAP, U64, MaterialisedTerm, Term, build_term
from privopt.grads.ghost.tuning import TUNING

__all__ = ["GhostEngine", "clip_terms"]


def clip_terms(terms: dict[str, Term], clip: float, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample norm bounds ``[B]`` and clip factors (float64) from all parameters' terms.

    The bound is the norm plus every rounding the terms declare (``docs/engines.md``); a sample
    whose bound is not finite gets factor 0 and its terms are zeroed.
    """
    parts = [p for p in (t.norms() for t in terms.values()) if p is not None]  # None: counted in another term
    if not parts:
        return torch.zeros(B, dtype=torch.float64), torch.ones(B, dtype=torch.float64)
    if len(parts) <= 4:  # a few parts: chained adds; many: one stacked sum (fewer ops either way)
        sq = parts[0].sq
        for p in parts[1:]:
            sq = sq + p.sq
    else:
        sq = torch.stack([p.sq for p in parts]).sum(0)
    norms = sq.sqrt()
    bounded = [p for p in parts if p.slack is not None]
    if bounded:
        slack = sum(p.slack for p in bounded)
        magnitude = sum(p.magnitude for p in bounded)
        norms = torch.maximum((norms + slack) * (1.0 + 4 * U64), magnitude / MAGNITUDE_CAP)
    # Norms are >= 0 (or NaN), so their float64 sum is finite iff every one is: one op and one
    # read instead of isfinite + all + read (finite float32 gradients cannot overflow it).
    if not math.isfinite(float(norms.sum())):
        valid = torch.isfinite(norms)
        for t in terms.values():
            t.zero_samples(valid)
    return norms, clip_factors(norms, clip)


@register_engine
class GhostEngine(GradEngine):
    """Ghost-norm + book-keeping engine: same results as ``vmap`` without per-sample gradients.

    Cost of a clipped-sum query is about one forward and one backward pass (output-gradients
    only) plus one matmul per layer; a difference query is twice that (layers reading the same
    input at both points share the matmul). Layers are processed inside the backward pass, so
    peak memory stays close to a non-private step. Falls back to :class:`VmapEngine` (with a
    warning) for models whose captures cannot be attributed to samples. How norms are computed,
    why they are safe in floating point, and how the batch dimension is found:
    ``docs/engines.md``.

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

    def __init__(self) -> None:
        # Why queries of this engine (one per run: get_engine) went to the vmap engine: public reasons
        # only (Unsupported.reason), as a set: how often is a function of the secret batch sizes.
        self._fallback_reasons: set[str] = set()

    def fallback(self) -> dict[str, Any] | None:
        if not self._fallback_reasons:
            return None
        return {"to": VmapEngine.name, "reasons": sorted(self._fallback_reasons)}

    def _fell_back(self, e: Unsupported) -> None:
        self._fallback_reasons.add(e.reason)
        warnings.warn(f"ghost engine: {e}; answering with the vmap engine instead", PrivoptRuntimeWarning, stacklevel=3)

    @staticmethod
    def _params(st: Structure, params):
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

    def _collect(self, model, loss_fn, inputs, targets, points, keep=None, n_points=None):
        """Capture every point ``(params, weights, sign)``; pieces of all points by parameter
        (``n_points``: of the whole query, which sizes the kept blocks; default ``len(points)``)."""
        st = structure(model)
        key = st.failure_key(model, inputs)
        if key in st.unsupported:  # failed before on this structure: skip straight to the fallback
            message, reason = st.unsupported[key]
            raise Unsupported(message, reason=reason)  # a fresh one: a re-raised one's traceback would grow
        losses, pieces, n_points = [], {}, n_points or len(points)
        for params, weights, sign in points:
            with torch.enable_grad():  # the capture needs a graph even if the caller is in no_grad
                capture = Capture(model, st, self._params(st, params))
                try:
                    got_losses, got = capture.run(
                        loss_fn, inputs, targets, weights=weights, sign=sign, keep=keep, n_points=n_points
                    )
                except Unsupported as e:
                    st.unsupported[key] = (str(e), e.reason)
                    raise
            losses.append(got_losses)
            for n, lst in got.items():
                pieces.setdefault(n, []).extend(lst)
        return st, losses, pieces

    def per_sample_grads(self, model, loss_fn, inputs, targets, *, params=None):
        try:
            st, (losses,), pieces = self._collect(model, loss_fn, inputs, targets, [(params, None, +1)])
        except Unsupported as e:
            self._fell_back(e)
            return VmapEngine().per_sample_grads(model, loss_fn, inputs, targets, params=params)
        B = inputs.shape[0]
        cols = [sum_dense(pieces[n]) if pieces.get(n) else losses.new_zeros(B, st.numels[n]) for n in st.names]
        return losses, torch.cat(cols, dim=1).detach()

    @fixed_min_rows
    def clipped_sum(
        self, model, loss_fn, inputs, targets, *, clip, params=None, weights=None, params_prev=None, weights_prev=None
    ):
        if not clip > 0:
            raise ConfigError(f"clip threshold must be > 0, got {clip}")
        points = [(params, weights, +1)]
        if params_prev is not None:
            points.append((params_prev, weights_prev, -1))
        res = self._query(model, loss_fn, inputs, targets, points, clip=clip)
        if res is None:
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
        return res

    @fixed_min_rows
    def scaled_sum(self, model, loss_fn, inputs, targets, *, scale, params=None, weights=None):
        res = self._query(model, loss_fn, inputs, targets, [(params, weights, +1)], clip=math.inf, scale=scale)
        if res is None:
            return VmapEngine().scaled_sum(model, loss_fn, inputs, targets, scale=scale, params=params, weights=weights)
        return res

    @fixed_min_rows
    def scaled_diff_sum(
        self, model, loss_fn, inputs, targets, *, clip, scale, scale_prev, params=None, params_prev=None
    ):
        if not clip > 0:
            raise ConfigError(f"clip threshold must be > 0, got {clip}")
        res = self._diff_query(model, loss_fn, inputs, targets, [(params, scale), (params_prev, scale_prev)], clip)
        if res is None:
            return VmapEngine().scaled_diff_sum(
                model,
                loss_fn,
                inputs,
                targets,
                clip=clip,
                scale=scale,
                scale_prev=scale_prev,
                params=params,
                params_prev=params_prev,
            )
        return res

    def _diff_query(self, model, loss_fn, inputs, targets, points, clip) -> ClippedSum | None:
        """One capture per point, kept apart: each point's terms give its norms and so its scale;
        the scaled pieces of both points then form the difference's terms, clipped and summed."""
        B, per_point = inputs.shape[0], []
        try:
            for params, _ in points:
                keep = Keep(TUNING.keep_elems)
                st, (losses,), pieces = self._collect(model, loss_fn, inputs, targets, [(params, None, +1)], keep, 2)
                per_point.append((losses, pieces, keep))
        except Unsupported as e:
            self._fell_back(e)
            return None
        with torch.no_grad():
            norms = []
            for _losses, pieces, keep in per_point:
                keep.after_backward()
                terms: dict[str, Term] = {}
                for n in st.names:
                    if pieces.get(n) or n in keep.blocks:
                        terms[n] = build_term(n, pieces.get(n, []), keep, B, terms)
                norms.append((clip_terms(terms, math.inf, B)[0], terms))
            (losses, pieces, keep), (losses_prev, pieces_prev, keep_prev) = per_point
            s, s_prev = pair_scales(points[0][1], points[1][1], (losses, norms[0][0]), (losses_prev, norms[1][0]))
            sides = [
                (norms[0][1], pieces, keep, s.to(losses.dtype)),
                (norms[1][1], pieces_prev, keep_prev, -s_prev.to(losses.dtype)),
            ]
            terms = {}
            for n in st.names:
                if any(n in side[0] for side in sides):
                    terms[n] = _difference_term(n, sides, keep, B, terms)
            diff_norms, coef = clip_terms(terms, clip, B)
            zeros = losses.new_zeros
            total = torch.cat([terms[n].clipped_sum(coef) if n in terms else zeros(st.numels[n]) for n in st.names])
        return ClippedSum(total=total, norms=diff_norms, losses=losses, losses_prev=losses_prev, clip=float(clip))

    def _query(self, model, loss_fn, inputs, targets, points, *, clip, scale=None) -> ClippedSum | None:
        """One pass over every point; the per-sample coefficients are the clip factors, times
        ``scale(losses, norms)`` if given. None: the model is unsupported (the caller falls back)."""
        keep = Keep(TUNING.keep_elems)
        try:
            st, losses, pieces = self._collect(model, loss_fn, inputs, targets, points, keep)
        except Unsupported as e:
            self._fell_back(e)
            return None
        B = inputs.shape[0]
        keep.after_backward()
        with torch.no_grad():
            terms: dict[str, Term] = {}
            for n in st.names:
                if pieces.get(n) or n in keep.blocks:
                    terms[n] = build_term(n, pieces.get(n, []), keep, B, terms)
            norms, coef = clip_terms(terms, clip, B)
            if scale is not None:
                coef = coef * resolve_scale(scale, losses[0], norms)
            zeros = losses[0].new_zeros
            total = torch.cat([terms[n].clipped_sum(coef) if n in terms else zeros(st.numels[n]) for n in st.names])
        losses_prev = losses[1] if len(losses) > 1 else None
        return ClippedSum(total=total, norms=norms, losses=losses[0], losses_prev=losses_prev, clip=float(clip))


def _difference_term(name: str, sides, keep: Keep, B: int, built: dict[str, Term]) -> Term:
    """The term of ``s_i g_i - s'_i g'_i`` for one parameter, from each point's ``(terms, pieces,
    keep, signed scale)``. Where a point's term is a materialised block, the difference is one
    block (no second materialisation; formed in the first point's kept block when it has one);
    otherwise the scaled pieces of both points form the term, so its norm is computed from what
    is summed, as in a two-point :meth:`GhostEngine.clipped_sum`."""
    if any(isinstance(side[0].get(name), MaterialisedTerm) for side in sides):
        block = None
        for terms, pieces, keep, sc in sides:
            t = terms.get(name)
            if isinstance(t, MaterialisedTerm):
                dense = t.block
            elif pieces.get(name):
                dense = sum_dense(pieces[name])
            else:
                continue
            sc = sc.to(dense.dtype).unsqueeze(1)
            if block is not None:
                block = block.addcmul_(dense, sc)
            else:  # a kept block is the engine's own (a lone piece's tensor may be shared): scale it in place
                block = dense.mul_(sc) if dense is keep.blocks.get(name) else dense * sc
        return MaterialisedTerm(block)
    lst: list[Piece] = []
    for _, pieces, _, sc in sides:
        for pc in pieces.get(name, []):
            pc.scale = sc
            lst.append(pc)
    return build_term(name, lst, keep, B, built)
