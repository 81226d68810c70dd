"""Private model selection in distributed learning (Paper C, Algorithm 4): pick an approximate SOSP
among candidate iterates with noisy gradients and noisy curvature on held-out local data.

For each candidate ``x_t`` (in order), every client releases, from its held-out records ``S_j``:

* the noisy mean of its per-record gradients clipped at ``grad_clip`` (one full-batch Gaussian);
* curvature, in one of two ways:

  - ``method="lanczos"`` (Remark 5's variant; any model size): ``lanczos_steps`` Lanczos
    iterations on the Hessian, each a noisy mean of per-record Hessian-vector products
    ``∇²ℓ(x_t; z)·v`` (unit ``v`` chosen from earlier releases) clipped at ``hvp_clip``; the
    smallest Ritz value of the tridiagonal matrix estimates ``λ_min``;
  - ``method="hessian"`` (the printed algorithm; small models only): the noisy mean of per-record
    Hessians clipped at ``hvp_clip`` in Frobenius norm, noise on the upper triangle (a symmetric
    noise matrix), then ``λ_min`` of the symmetric result.

The server averages the clients' releases and returns the first candidate whose noisy gradient
norm is at most ``alpha + slack_g`` and whose noisy ``λ_min`` is at least ``−(sqrt(ρ·alpha) + slack_H)``.
The slacks are public: a high-probability bound (``omega``) on the norm of the averaged noise
(docs/algorithms/sosp.md, "Private model selection"). Every release is recorded in the clients'
ledgers (local noise: each client's guarantee is on its own held-out records); the schedule
(``candidates × (1 + lanczos_steps)`` full-batch releases) is fixed in advance, and stopping at
the first accepted candidate runs a prefix of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.func import functional_call, grad, hessian, jvp, vmap

from privopt.errors import ConfigError
from privopt.grads.coefficients import clip_factors
from privopt.grads.flat import params_from_flat
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import BoundedSum
from privopt.privacy import FullBatch, Inventory, PlannedStep

__all__ = ["PrivateModelSelection", "SelectionResult", "per_record_hvp", "MAX_DENSE_DIM"]

MAX_DENSE_DIM = 2000  # the dense-Hessian method releases d(d+1)/2 numbers per candidate


@dataclass
class SelectionResult:
    """Which candidate was selected (``None``: none passed) and the released statistics of each
    candidate examined (noisy gradient norms and λ_min estimates: post-processing, public)."""

    index: int | None
    grad_norms: list[float] = field(default_factory=list)
    min_eigs: list[float] = field(default_factory=list)
    grad_threshold: float = 0.0
    eig_threshold: float = 0.0


def _record_loss(model, loss_fn):
    buffers = dict(model.named_buffers())

    def f(flat, xi, yi):
        out = functional_call(model, (params_from_flat(model, flat), buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0)).squeeze(0)

    return f


def per_record_hvp(model, loss_fn, x, y, point: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[B, d]``: ``∇²ℓ(point; z_i)·v`` for every record (forward-over-reverse, vmapped)."""
    g = grad(_record_loss(model, loss_fn))
    return vmap(lambda xi, yi: jvp(lambda p: g(p, xi, yi), (point,), (v,))[1])(x, y)


def _clipped_rows(rows: torch.Tensor, clip: float) -> BoundedSum:
    """``Σ_i min(1, C/||row_i||)·row_i``; a row with a non-finite norm contributes nothing (0·inf
    and NaN would make the sum NaN, which no noise hides)."""
    flat = rows.reshape(rows.shape[0], -1)
    norms = flat.norm(dim=1, keepdim=True)
    factors = clip_factors(norms, clip)
    return BoundedSum(torch.where(factors > 0, flat * factors, 0.0).sum(0), bound=clip)


class PrivateModelSelection:
    """Algorithm 4 with exact noise calibration (see the module docstring).

    Args:
        alpha: target gradient accuracy α; rho: Hessian-Lipschitz constant ρ of the thresholds.
        omega: failure probability of the noise bounds in the thresholds.
        method: ``"lanczos"`` or ``"hessian"``. lanczos_steps: Lanczos iterations per candidate.
        grad_clip, hvp_clip: per-record thresholds of the gradient and curvature releases.
    """

    def __init__(
        self,
        *,
        alpha: float,
        rho: float = 1.0,
        omega: float = 0.1,
        method: str = "lanczos",
        lanczos_steps: int = 10,
        grad_clip: float = 1.0,
        hvp_clip: float = 10.0,
    ):
        if method not in ("lanczos", "hessian"):
            raise ConfigError(f"selection method must be 'lanczos' or 'hessian', got {method!r}")
        if not (alpha > 0 and rho > 0 and 0 < omega < 1 and lanczos_steps >= 1):
            raise ConfigError("private selection needs alpha > 0, rho > 0, omega in (0, 1), lanczos_steps >= 1")
        self.alpha, self.rho, self.omega, self.method = float(alpha), float(rho), float(omega), method
        self.k = int(lanczos_steps) if method == "lanczos" else 1
        self.grad_clip, self.hvp_clip = float(grad_clip), float(hvp_clip)

    def inventory(self, *, candidates: int) -> Inventory:
        """Full-batch releases on the held-out data: a gradient and ``k`` curvature releases per candidate."""
        steps = (
            PlannedStep(FullBatch(), (("sel-grad", 1.0),), candidates),
            PlannedStep(FullBatch(), (("sel-curv", 1.0),), candidates * self.k),
        )
        return Inventory(steps)

    # ------------------------------------------------------------------ releases
    def _release(self, fed, name, stats: dict, noise: dict, private: bool) -> torch.Tensor:
        """The server's mean of the clients' noisy means of ``stats[j]`` (a BoundedSum per client)."""
        if fed.trust != "local":
            raise ConfigError("private model selection implements Algorithm 4's local noise (trust 'local')")
        messages = []
        for c in fed.clients:
            batch = PrivateBatch(c.ledger if private else None, FullBatch(), {name: noise[name]}, rng=c.noise_rng)
            messages.append(batch.gaussian(name, stats[c.index], normalizer=float(c.n)))
        return fed.sum(messages) / fed.num_clients

    def _hessian_release(self, fed, model, loss_fn, point, noise, private) -> torch.Tensor:
        d = point.numel()
        if d > MAX_DENSE_DIM:
            raise ConfigError(f"the dense-Hessian method is for d <= {MAX_DENSE_DIM}; use method='lanczos' (d={d})")
        iu = torch.triu_indices(d, d)
        stats = {}
        for c in fed.clients:
            h = vmap(lambda xi, yi: hessian(_record_loss(model, loss_fn))(point, xi, yi))(c.x, c.y)
            # Upper triangle, off-diagonal entries weighted sqrt(2): its L2 norm is the Frobenius norm.
            w = torch.where(iu[0] == iu[1], 1.0, math.sqrt(2.0))
            stats[c.index] = _clipped_rows(h[:, iu[0], iu[1]] * w, self.hvp_clip)
        upper = self._release(fed, "sel-curv", stats, noise, private)
        w = torch.where(iu[0] == iu[1], 1.0, math.sqrt(2.0))
        mat = torch.zeros(d, d, dtype=upper.dtype)
        mat[iu[0], iu[1]] = upper / w
        mat = mat + mat.T - torch.diag(torch.diag(mat))
        return torch.linalg.eigvalsh(mat.double())[0]

    def _lanczos(self, fed, model, loss_fn, point, noise, private) -> torch.Tensor:
        d = point.numel()
        basis = [torch.randn(d, generator=torch.Generator().manual_seed(0), dtype=point.dtype)]  # public start
        basis[0] = basis[0] / basis[0].norm()
        alphas, betas = [], []
        for _ in range(self.k):
            v = basis[-1]
            stats = {c.index: _clipped_rows(per_record_hvp(model, loss_fn, c.x, c.y, point, v), self.hvp_clip)
                     for c in fed.clients}  # fmt: skip
            w = self._release(fed, "sel-curv", stats, noise, private)
            alphas.append(float(w @ v))
            for q in basis:  # full re-orthogonalisation (post-processing of released vectors)
                w = w - (w @ q) * q
            beta = float(w.norm())
            if beta < 1e-10 or len(alphas) == self.k:
                break
            betas.append(beta)
            basis.append(w / beta)
        tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas[: len(alphas) - 1], dtype=torch.float64)
            tri = tri + torch.diag(off, 1) + torch.diag(off, -1)
        return torch.linalg.eigvalsh(tri)[0]

    # ------------------------------------------------------------------ selection
    def thresholds(self, *, dim: int, candidates: int, noise: dict, fed) -> tuple[float, float]:
        """Public acceptance thresholds: ``alpha + slack_g`` and ``−(sqrt(ρ·alpha) + slack_H)``, the
        slacks bounding the averaged privacy noise with probability ``1 − omega`` over all candidates."""
        n, m = min(fed.shard_sizes), fed.num_clients
        tail = math.sqrt(2 * math.log(2 * candidates * (1 + self.k) / self.omega))
        r_g = noise["sel-grad"] * self.grad_clip / (n * math.sqrt(m))
        r_h = noise["sel-curv"] * self.hvp_clip / (n * math.sqrt(m))
        grad_threshold = self.alpha + r_g * (math.sqrt(dim) + tail)
        return grad_threshold, -(math.sqrt(self.rho * self.alpha) + r_h * (2 * math.sqrt(dim) + tail))

    def select(self, candidates, *, federation, model, loss_fn, noise: dict, private: bool = True) -> SelectionResult:
        """Examine ``candidates`` (flat parameter vectors) in order; the clients' ``x``/``y`` are their
        held-out records and their ledgers must cover :meth:`inventory`."""
        cands = list(candidates)
        dim = int(cands[0].numel())
        tg, th = self.thresholds(dim=dim, candidates=len(cands), noise=noise, fed=federation)
        result = SelectionResult(index=None, grad_threshold=tg, eig_threshold=th)
        g = grad(_record_loss(model, loss_fn))
        for t, point in enumerate(cands):
            stats = {c.index: _clipped_rows(vmap(lambda xi, yi, p=point: g(p, xi, yi))(c.x, c.y), self.grad_clip)
                     for c in federation.clients}  # fmt: skip
            gnorm = float(self._release(federation, "sel-grad", stats, noise, private).norm())
            curv = self._lanczos if self.method == "lanczos" else self._hessian_release
            lam = float(curv(federation, model, loss_fn, point, noise, private))
            result.grad_norms.append(gnorm)
            result.min_eigs.append(lam)
            if gnorm <= tg and lam >= th:
                result.index = t
                break
        return result
