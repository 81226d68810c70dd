"""Second-order stationarity diagnostics: the gradient norm and the Hessian's smallest eigenvalue.

At a model ``w`` and data ``(x, y)`` with mean loss ``f(w) = (1/n) Σ ℓ(w; z_i)``:

* :func:`full_gradient` / ``grad_norm`` — ``‖∇f(w)‖`` in chunks;
* :func:`hessian_vector_product` — ``∇²f(w)·v`` by forward-over-reverse differentiation
  (``torch.func.jvp`` of ``torch.func.grad``), in chunks, never materialising the Hessian;
* :func:`hessian_min_eig` — ``λ_min(∇²f(w))`` by Lanczos (scipy's ``eigsh`` on a
  ``LinearOperator`` whose matvec is the Hessian-vector product).

A point is an (α, sqrt(ρα))-SOSP when ``‖∇f‖ ≤ α`` and ``λ_min ≥ −sqrt(ρα)`` (docs/algorithms/sosp.md).
These read the data they are given without noise: on the training split they are non-private
diagnostics (``diagnostics.NOT_PRIVATE.json``), on the test split public measurements of the
released model. Run metrics: ``sosp`` (test split, public) and ``sosp_train`` (training split).

Example:
    >>> import torch
    >>> from torch import nn
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = nn.Linear(3, 2).double()
    >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    >>> x, y = torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 2, (20,))
    >>> rep = sosp_report(model, loss, x, y)
    >>> sorted(rep), rep["hessian_min_eig"] > -1e-8  # a convex loss: no negative curvature
    (['grad_norm', 'hessian_min_eig', 'lanczos_converged'], True)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, jvp

from privopt.errors import ConfigError, DataError
from privopt.grads.flat import flat_params, params_from_flat

__all__ = [
    "full_gradient",
    "hessian_vector_product",
    "hessian_min_eig",
    "lanczos_ritz_min",
    "sosp_report",
    "sosp_metric",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check(x: torch.Tensor, y: torch.Tensor, chunk: int) -> None:
    if x.shape[0] != y.shape[0]:
        raise DataError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    if x.shape[0] == 0:
        raise DataError("empty dataset")
    if not (isinstance(chunk, int) and chunk > 0):
        raise ConfigError(f"chunk must be a positive integer, got {chunk!r}")


def _summed_loss(model: nn.Module, loss_fn: LossFn):
    buffers = dict(model.named_buffers())

    def f(flat: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (params_from_flat(model, flat), buffers), (xb,))
        return loss_fn(out, yb).sum()

    return f


def full_gradient(model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 1024):
    """``∇f(w)`` of the mean loss at the model's parameters, as a flat vector."""
    _check(x, y, chunk)
    f, w = _summed_loss(model, loss_fn), flat_params(model)
    total = torch.zeros_like(w)
    for s in range(0, x.shape[0], chunk):
        total += grad(f)(w, x[s : s + chunk], y[s : s + chunk])
    return total / x.shape[0]


def hessian_vector_product(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 1024
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v ↦ ∇²f(w)·v`` at the model's current parameters (forward-over-reverse, chunked).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(2, 1, bias=False)
        >>> loss = lambda out, y: (out.squeeze(1) - y) ** 2
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]]); y = torch.zeros(2)
        >>> hessian_vector_product(model, loss, x, y)(torch.tensor([1.0, 1.0])).tolist()  # H = diag(1, 4)
        [1.0, 4.0]
    """
    _check(x, y, chunk)
    g, w = grad(_summed_loss(model, loss_fn)), flat_params(model)
    n = x.shape[0]

    def hvp(v: torch.Tensor) -> torch.Tensor:
        v = v.to(w.dtype)
        total = torch.zeros_like(w)
        for s in range(0, n, chunk):
            total += jvp(lambda p, xb=x[s : s + chunk], yb=y[s : s + chunk]: g(p, xb, yb), (w,), (v,))[1]
        return total / n

    return hvp


def hessian_min_eig(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    chunk: int = 1024,
    tol: float = 1e-4,
    maxiter: int | None = None,
    ncv: int | None = None,
    seed: int = 0,
) -> tuple[float, bool]:
    """``(λ_min(∇²f(w)), converged)`` by Lanczos on Hessian-vector products (scipy ``eigsh``, ``which="SA"``).

    ``tol`` is ARPACK's relative accuracy; when ``maxiter`` restarts are not enough the smallest
    Ritz value is returned with ``converged=False`` (ARPACK's, or when none converged that of a
    plain Lanczos run of ``ncv`` steps: an upper bound on ``λ_min``). ``seed`` fixes the (public)
    start vector.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    hvp = hessian_vector_product(model, loss_fn, x, y, chunk=chunk)
    dim = int(flat_params(model).numel())
    dtype = flat_params(model).dtype

    def matvec(v: np.ndarray) -> np.ndarray:
        out = hvp(torch.as_tensor(np.asarray(v).reshape(-1), dtype=dtype))
        return out.detach().to(torch.float64).numpy()

    if dim == 1:
        return float(matvec(np.ones(1))[0]), True
    op = LinearOperator((dim, dim), matvec=matvec, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(dim)
    try:
        vals = eigsh(op, k=1, which="SA", tol=tol, maxiter=maxiter, ncv=ncv, v0=v0, return_eigenvectors=False)
        return float(vals[0]), True
    except ArpackNoConvergence as e:
        if len(e.eigenvalues) == 0:  # nothing converged: the smallest Ritz value of a plain Lanczos run
            return lanczos_ritz_min(matvec, v0, steps=min(dim, ncv or 20)), False
        return float(np.min(e.eigenvalues)), False


def lanczos_ritz_min(matvec, v0: np.ndarray, *, steps: int) -> float:
    """The smallest Ritz value after ``steps`` Lanczos iterations (full reorthogonalisation) from
    ``v0``: an upper bound on ``λ_min`` that tightens with ``steps``.

    Example:
        >>> a = np.diag([-2.0, 1.0, 3.0])
        >>> round(lanczos_ritz_min(lambda v: a @ v, np.ones(3), steps=3), 6)
        -2.0
    """
    basis, alphas, betas = [v0 / np.linalg.norm(v0)], [], []
    for _ in range(steps):
        w = matvec(basis[-1])
        alphas.append(float(basis[-1] @ w))
        for q in basis:  # full reorthogonalisation: Krylov vectors lose orthogonality in floating point
            w = w - (q @ w) * q
        beta = float(np.linalg.norm(w))
        if beta < 1e-12 or len(basis) == steps:
            break
        betas.append(beta)
        basis.append(w / beta)
    k = len(alphas)
    tri = np.diag(alphas) + np.diag(betas[: k - 1], 1) + np.diag(betas[: k - 1], -1)
    return float(np.linalg.eigvalsh(tri)[0])


def sosp_report(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 1024, **lanczos
) -> dict[str, float]:
    """``grad_norm``, ``hessian_min_eig`` and ``lanczos_converged`` (1.0/0.0) of the mean loss on ``(x, y)``
    (model in eval mode for the measurement)."""
    was = model.training
    model.eval()
    try:
        gnorm = float(full_gradient(model, loss_fn, x, y, chunk=chunk).norm())
        lam, ok = hessian_min_eig(model, loss_fn, x, y, chunk=chunk, **lanczos)
    finally:
        model.train(was)
    return {"grad_norm": gnorm, "hessian_min_eig": lam, "lanczos_converged": float(ok)}


def sosp_metric(split: str, *, max_records: int = 2000, **lanczos):
    """A run metric (``fn(model=, loss_fn=, data=, record=)``) reporting :func:`sosp_report` on the first
    ``max_records`` records of ``split`` (``"test"`` or ``"train"``), keys prefixed ``sosp_<split>_``."""

    def fn(*, model, loss_fn, data, **kw) -> dict[str, float]:
        x, y = getattr(data, f"x_{split}")[:max_records], getattr(data, f"y_{split}")[:max_records]
        rep = sosp_report(model, loss_fn, x, y, **lanczos)
        return {f"sosp_{split}_{k}": v for k, v in rep.items()}

    return fn
