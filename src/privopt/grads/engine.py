"""The gradient-engine interface and its reference implementation (``torch.func.vmap``).

Every private algorithm in privopt asks one question of the model: *the sum over a batch of
per-sample (optionally weighted, optionally differenced) gradients, each clipped in L2 norm to C*.
An engine answers it. The reference :class:`VmapEngine` materialises per-sample gradients with
``torch.func``; faster engines (ghost norms, book-keeping) register under another name and must
return the same numbers.

Conventions shared by all engines:

* ``loss_fn(outputs, targets)`` returns **per-sample** losses, shape ``[B]`` (``reduction="none"``).
* Gradients are flattened over the model's trainable parameters in ``model.named_parameters()``
  order (see :func:`flat_param_names`), so one sample's gradient is one vector of length ``d``.
* ``params`` / ``params_prev`` map parameter names to tensors; ``None`` means the model's current
  parameters. The module itself is never modified.
* ``weights`` scale each sample's gradient *before* clipping (the DRO chain rule
  ``a_i * grad l_i``): a tensor ``[B]`` or a callable from the per-sample losses ``[B]`` (evaluated
  at the same point, without gradient) to weights ``[B]``.
* ``scale`` (:meth:`GradEngine.scaled_sum`) multiplies each sample's term *after* the pass, by a
  function of that pass's per-sample losses and norms: the caller's own clipping (e.g. a DRO weight
  times ``min(1, C/||grad l_i||)``) in one pass instead of a norm pass and a re-weighted pass.
  :meth:`GradEngine.scaled_diff_sum` does the same at two points (one scale per point), then clips
  the difference: a DRO correction in one pass per point.
* A sample whose norm is not finite contributes nothing (its clip factor is 0 and its values are
  zeroed before summing), so the clipped sum stays finite.

How the engines compute norms and why clipping holds in floating point: ``docs/engines.md``.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from privopt.errors import ConfigError, ModelError
from privopt.grads.coefficients import (
    MIN_BATCH_ROWS,
    ClippedSum,
    ScaleFn,
    Weights,
    clip_factors,
    fixed_min_rows,
    pair_scales,
    resolve_scale,
    resolve_weights,
)
from privopt.registry import Registry

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Params = Mapping[str, torch.Tensor]

__all__ = [
    "ClippedSum",
    "GradEngine",
    "VmapEngine",
    "register_engine",
    "get_engine",
    "available_engines",
    "flat_param_names",
    "current_params",
    "clip_factors",
    "resolve_weights",
    "resolve_scale",
    "pair_scales",
    "vmap_grads",
    "MIN_BATCH_ROWS",
    "fixed_min_rows",
]


def flat_param_names(model: nn.Module) -> list[str]:
    """Names of the trainable parameters, in the order used for flat gradients."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def current_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copy-free view of the model's trainable parameters, by name."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def vmap_grads(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    params: Params | None = None,
    *,
    wrt: list[str] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample losses ``[B]`` and gradients ``{name: [B, *shape]}`` of the parameters ``wrt``
    (default: all of ``params``) by ``vmap(grad(.))`` over the batch; the others stay fixed."""
    params = dict(params) if params is not None else current_params(model)
    wrt = list(params) if wrt is None else list(wrt)
    fixed = {n: p for n, p in params.items() if n not in set(wrt)}
    buffers = dict(model.named_buffers())

    def one(p, x, y):
        def f(pp):
            out = functional_call(model, ({**fixed, **pp}, buffers), (x.unsqueeze(0),))
            v = loss_fn(out, y.unsqueeze(0)).squeeze(0)
            return v, v

        return grad(f, has_aux=True)(p)

    try:
        grads, losses = vmap(one, in_dims=(None, 0, 0), randomness="different")(
            {n: params[n] for n in wrt}, inputs, targets
        )
    except RuntimeError as e:
        if "mutate a captured Tensor" not in str(e):
            raise
        raise ModelError(
            "the model modifies one of its tensors in place during the forward pass (e.g. a running-statistics "
            "buffer): it would learn from the private batch without noise and is incompatible with per-sample "
            "DP gradients; use layers without running statistics (nn.GroupNorm, nn.LayerNorm)"
        ) from e
    return losses.detach(), {n: g.detach() for n, g in grads.items()}


class GradEngine(abc.ABC):
    """Interface of a per-sample gradient engine. Subclasses register with :func:`register_engine`."""

    name: ClassVar[str] = "abstract"

    @abc.abstractmethod
    def per_sample_grads(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        params: Params | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses ``[B]`` and flat per-sample gradients ``[B, d]``."""

    @abc.abstractmethod
    def clipped_sum(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        clip: float,
        params: Params | None = None,
        weights: Weights = None,
        params_prev: Params | None = None,
        weights_prev: Weights = None,
    ) -> ClippedSum:
        """Sum of per-sample terms clipped to ``clip``.

        The term is ``w_i * grad l(params; x_i)`` or, when ``params_prev`` is given, the difference
        ``w_i * grad l(params; x_i) - w'_i * grad l(params_prev; x_i)`` clipped as one vector.
        """

    def scaled_sum(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        scale: ScaleFn,
        params: Params | None = None,
        weights: Weights = None,
    ) -> ClippedSum:
        """``sum_i s_i * h_i`` with ``h_i = w_i * grad l(params; x_i)`` and ``s = scale(losses, norms)``,
        from the per-sample losses ``[B]`` and norms ``||h_i||`` ``[B]`` (float64) of the same pass.

        The caller clips through ``scale`` (``scale = lambda l, n: clip_factors(n, C)`` is
        :meth:`clipped_sum`), so a clip factor can be combined with a weight that must not enter
        the norm, e.g. a DRO weight times ``Clip(grad l_i, C)`` (``docs/engines.md``). A sample whose
        norm or scale is not finite contributes nothing. The result's ``clip`` is ``inf``: its
        per-record bound is the caller's to state.

        This default makes two passes (norms, then the re-weighted sum); the built-in engines
        answer in one.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from privopt.grads import get_engine
            >>> model = nn.Linear(3, 2)
            >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
            >>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
            >>> engine = get_engine("vmap")
            >>> res = engine.scaled_sum(model, loss, x, y, scale=lambda losses, norms: clip_factors(norms, 0.5))
            >>> ref = engine.clipped_sum(model, loss, x, y, clip=0.5)
            >>> bool(torch.allclose(res.total, ref.total))
            True
        """
        first = self.clipped_sum(model, loss_fn, inputs, targets, clip=math.inf, params=params, weights=weights)
        s = resolve_scale(scale, first.losses, first.norms)
        w = resolve_weights(weights, first.losses)
        combined = (s if w is None else s * w.to(s.dtype)).to(first.losses.dtype)
        second = self.clipped_sum(model, loss_fn, inputs, targets, clip=math.inf, params=params, weights=combined)
        return ClippedSum(total=second.total, norms=first.norms, losses=first.losses, losses_prev=None, clip=math.inf)

    def scaled_diff_sum(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        clip: float,
        scale: ScaleFn,
        scale_prev: ScaleFn,
        params: Params | None = None,
        params_prev: Params | None = None,
    ) -> ClippedSum:
        """Sum of ``s_i g_i - s'_i g'_i`` clipped to ``clip`` as one vector, where ``g_i`` and ``g'_i``
        are the per-sample gradients at ``params`` and ``params_prev``, ``s = scale(losses, norms)``
        and ``s' = scale_prev(losses', norms')`` from each point's own losses and gradient norms.

        A SPIDER correction of a DRO objective is this query: each point's term is a DRO weight
        times ``Clip(grad l_i, C)``, known only once that point's norm is (``docs/engines.md``,
        "Scaled sums"). Per-record bound: ``clip``. A sample whose norm is not finite at either
        point contributes nothing. The result's ``norms`` are those of the differences.

        This default makes four forward and backward passes (a norm pass at each point, then both
        points again for the difference); the built-in engines make one per point.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from privopt.grads import get_engine
            >>> model = nn.Linear(3, 2)
            >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
            >>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
            >>> prev = {n: p.detach() + 0.1 for n, p in model.named_parameters()}
            >>> one = lambda losses, norms: torch.ones_like(norms)
            >>> engine = get_engine("vmap")
            >>> res = engine.scaled_diff_sum(model, loss, x, y, clip=0.5, scale=one, scale_prev=one, params_prev=prev)
            >>> ref = engine.clipped_sum(model, loss, x, y, clip=0.5, params_prev=prev)
            >>> bool(torch.allclose(res.total, ref.total))
            True
        """
        first = self.clipped_sum(model, loss_fn, inputs, targets, clip=math.inf, params=params)
        second = self.clipped_sum(model, loss_fn, inputs, targets, clip=math.inf, params=params_prev)
        s, s_prev = pair_scales(scale, scale_prev, (first.losses, first.norms), (second.losses, second.norms))
        dtype = first.losses.dtype
        return self.clipped_sum(
            model,
            loss_fn,
            inputs,
            targets,
            clip=clip,
            params=params,
            weights=s.to(dtype),
            params_prev=params_prev,
            weights_prev=s_prev.to(dtype),
        )

    def fallback(self) -> dict[str, Any] | None:
        """Where this instance sent queries it could not answer itself: ``{"to": engine name,
        "reasons": [public, structural reasons]}``, or ``None`` (it answered every one). A run's record
        states it as ``engine_fallback``; nothing in it may depend on the data (e.g. no counts)."""
        return None


class VmapEngine(GradEngine):
    """Reference engine: materialises ``[B, d]`` per-sample gradients with ``vmap(grad(.))``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from privopt.grads import get_engine
        >>> model = nn.Linear(3, 2)
        >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
        >>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
        >>> res = get_engine("vmap").clipped_sum(model, loss, x, y, clip=1.0)
        >>> bool(res.total.norm() <= 5 * 1.0 + 1e-6)
        True
    """

    name = "vmap"

    def per_sample_grads(self, model, loss_fn, inputs, targets, *, params=None):
        losses, grads = vmap_grads(model, loss_fn, inputs, targets, params)
        return losses, torch.cat([g.reshape(inputs.shape[0], -1) for g in grads.values()], dim=1)

    @fixed_min_rows
    def clipped_sum(
        self, model, loss_fn, inputs, targets, *, clip, params=None, weights=None, params_prev=None, weights_prev=None
    ):
        point, prev = (params, weights), (params_prev, weights_prev)
        losses, g, losses_prev = self._terms(model, loss_fn, inputs, targets, point, prev)
        norms, g = _norms(g)
        total = (g * clip_factors(norms, clip).to(g.dtype).unsqueeze(1)).sum(dim=0)
        return ClippedSum(total=total, norms=norms, losses=losses, losses_prev=losses_prev, clip=float(clip))

    @fixed_min_rows
    def scaled_sum(self, model, loss_fn, inputs, targets, *, scale, params=None, weights=None):
        losses, g, _ = self._terms(model, loss_fn, inputs, targets, (params, weights), (None, None))
        norms, g = _norms(g)
        total = (g * resolve_scale(scale, losses, norms).to(g.dtype).unsqueeze(1)).sum(dim=0)
        return ClippedSum(total=total, norms=norms, losses=losses, losses_prev=None, clip=math.inf)

    @fixed_min_rows
    def scaled_diff_sum(
        self, model, loss_fn, inputs, targets, *, clip, scale, scale_prev, params=None, params_prev=None
    ):
        if not clip > 0:
            raise ConfigError(f"clip threshold must be > 0, got {clip}")
        losses, g = self.per_sample_grads(model, loss_fn, inputs, targets, params=params)
        losses_prev, g_prev = self.per_sample_grads(model, loss_fn, inputs, targets, params=params_prev)
        (norms, g), (norms_prev, g_prev) = _norms(g), _norms(g_prev)
        s, s_prev = pair_scales(scale, scale_prev, (losses, norms), (losses_prev, norms_prev))
        h = g * s.to(g.dtype).unsqueeze(1) - g_prev * s_prev.to(g.dtype).unsqueeze(1)
        norms, h = _norms(h)
        total = (h * clip_factors(norms, clip).to(h.dtype).unsqueeze(1)).sum(dim=0)
        return ClippedSum(total=total, norms=norms, losses=losses, losses_prev=losses_prev, clip=float(clip))

    def _terms(self, model, loss_fn, inputs, targets, point, prev):
        """Per-sample losses, (weighted, differenced) flat terms ``[B, d]`` and the previous losses;
        ``point`` and ``prev`` are ``(params, weights)`` pairs (``prev``'s params None: no difference)."""
        (params, weights), (params_prev, weights_prev) = point, prev
        losses, g = self.per_sample_grads(model, loss_fn, inputs, targets, params=params)
        w = resolve_weights(weights, losses)
        if w is not None:
            g = g * w.unsqueeze(1)
        losses_prev = None
        if params_prev is not None:
            losses_prev, g_prev = self.per_sample_grads(model, loss_fn, inputs, targets, params=params_prev)
            w_prev = resolve_weights(weights_prev, losses_prev)
            if w_prev is not None:
                g_prev = g_prev * w_prev.unsqueeze(1)
            g = g - g_prev
        return losses, g, losses_prev


def _norms(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 row norms of ``g`` and ``g`` with its non-finite rows zeroed."""
    # float64 norms: DRO weights can reach e^30+, whose squared norms overflow float32.
    norms = torch.linalg.vector_norm(g, dim=1, dtype=torch.float64)
    valid = torch.isfinite(norms)
    if not bool(valid.all()):  # 0 * inf would still be NaN: drop those rows outright
        g = g.masked_fill(~valid.unsqueeze(1), 0)
    return norms, g


_ENGINES: Registry[type[GradEngine]] = Registry("gradient engine")


def register_engine(cls: type[GradEngine]) -> type[GradEngine]:
    """Class decorator: make an engine selectable by its ``name`` (e.g. ``engine: ghost``); a name
    already taken by another engine is refused."""
    return _ENGINES.register(cls)


register_engine(VmapEngine)


def available_engines() -> list[str]:
    return [*_ENGINES.names(), *(["auto"] if "auto" not in _ENGINES else [])]


def get_engine(name: str = "auto") -> GradEngine:
    """Instantiate an engine by name. ``auto`` picks the fastest registered engine."""
    if name == "auto":
        name = "ghost" if "ghost" in _ENGINES else "vmap"
    if name not in _ENGINES:
        raise ConfigError(f"unknown gradient engine {name!r}; available: {', '.join(available_engines())}")
    return _ENGINES.lookup(name)()
