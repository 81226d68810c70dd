"""The regularised worst-group saddle problem of Minimax Phased ERM and its certified solvers.

For group datasets ``S_1..S_p`` with public normalisers ``m_i``, a centre ``c`` and regularisation
``μ_w, μ_λ > 0``:

    F(w, λ) = Σ_i λ_i L_i(w) + (μ_w/2)‖w − c‖² − μ_λ Σ_i λ_i log λ_i,   L_i(w) = (1/m_i) Σ_{z∈S_i} ℓ(w, z)

over ``w ∈ W`` (an ℓ2 ball) and ``λ`` in the simplex, with ``ℓ`` the cross-entropy of a linear
model (multinomial logistic regression: convex, Lipschitz on bounded features, bounded on W).

The λ-player's best response is closed-form (``λ*(w) = softmax(L(w)/μ_λ)``), so
``Φ(w) = max_λ F(w, λ) = μ_λ log Σ_i exp(L_i(w)/μ_λ) + (μ_w/2)‖w − c‖²``. Any pair ``(w̄, λ̄)``
has a CERTIFIED duality gap (:meth:`SaddleObjective.gap`): the first term is ``Φ(w̄)`` exactly and
``min_{w∈W} F(w, λ̄)`` is bounded below by strong convexity,

    F(w, λ̄) ≥ F(w̄, λ̄) + ⟨g, w − w̄⟩ + (μ_w/2)‖w − w̄‖²,   g = ∇_w F(w̄, λ̄),

whose minimum over the ball is attained at the projection of ``w̄ − g/μ_w`` (an isotropic
quadratic). Two solvers (``docs/algorithms/worst_group.md``, "Inner solver"):

* :func:`solve_ogd` — the printed inner solver: best-response λ_t, projected gradient steps
  ``1/(μ_w t)`` on w, averaged iterates (gap O(log N / N));
* :func:`solve_accelerated` — accelerated projected gradient on Φ with backtracking and restarts
  (the default: it reaches the tiny target gaps of the phased analysis in far fewer passes).

Both stop only once the certified gap is at most the target, and raise
:class:`SolverNotCertified` otherwise: an uncertified point must never be released, because the
sensitivity bound of the phase output assumes the target accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from privopt.errors import PrivoptError

__all__ = ["SaddleObjective", "SolveResult", "SolverNotCertified", "solve_accelerated", "solve_ogd"]


class SolverNotCertified(PrivoptError):
    """The inner solver did not certify the required saddle-point accuracy within its iterations.

    The message holds public values only (solver, iterations, target): it becomes the failure reason of
    a public record. The gap reached is a function of the phase's records without noise: it is kept
    in :attr:`gap` (diagnostics, never published).
    """

    def __init__(self, message: str, *, gap: float):
        super().__init__(message)
        self.gap = gap


@dataclass
class SolveResult:
    w: torch.Tensor
    gap: float
    iterations: int
    passes: int


class SaddleObjective:
    """``F`` above for a linear ``K``-class model whose flat parameters are ``[W (K×d) row-major, b (K)]``.

    Args:
        x: features ``[N, d]``; y: labels ``[N]``; g: group ids ``[N]`` (float64 internally).
        norm: public normaliser ``m_i`` of every group (``[p]``).
        num_classes: K. mu_w, mu_lam: regularisation. center: c (flat). ball_center, radius: W.

    Example:
        >>> x = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]])
        >>> obj = SaddleObjective(x, torch.tensor([1, 0, 1, 0]), torch.tensor([0, 0, 1, 1]),
        ...                       norm=torch.tensor([2.0, 2.0]), num_classes=2, mu_w=1.0, mu_lam=0.5,
        ...                       center=torch.zeros(4), ball_center=torch.zeros(4), radius=10.0)
        >>> res = solve_accelerated(obj, torch.zeros(4), target_gap=1e-10)
        >>> res.gap <= 1e-10, round(float(obj.losses(res.w).max()), 4)
        (True, 0.5625)
    """

    def __init__(self, x, y, g, *, norm, num_classes, mu_w, mu_lam, center, ball_center, radius):
        self.x = x.reshape(x.shape[0], -1).to(torch.float64)
        self.y, self.g = y.long(), g.long()
        self.norm = torch.as_tensor(norm, dtype=torch.float64)
        self.p, self.k, self.d = int(self.norm.numel()), int(num_classes), int(self.x.shape[1])
        self.mu_w, self.mu_lam = float(mu_w), float(mu_lam)
        self.center = center.to(torch.float64)
        self.ball_center, self.radius = ball_center.to(torch.float64), float(radius)
        self.passes = 0
        # class-major layout ([K, N]): reductions over the few classes run along contiguous memory
        self._onehot_t = torch.nn.functional.one_hot(self.y, self.k).to(torch.float64).T.contiguous()

    def _split(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kd = self.k * self.d
        return w[:kd].reshape(self.k, self.d), w[kd:]

    def _per_record(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-record cross-entropy ``[N]``, softmax − onehot ``[K, N]``)."""
        self.passes += 1
        weight, bias = self._split(w)
        z = torch.addmm(bias.unsqueeze(1), weight, self.x.T)
        top = z.max(dim=0).values
        e = torch.exp(z - top)
        total = e.sum(0)
        ce = top + total.log() - (z * self._onehot_t).sum(0)
        return ce, e / total - self._onehot_t

    def _group_means(self, per_record: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.p, dtype=torch.float64).index_add_(0, self.g, per_record) / self.norm

    def losses(self, w: torch.Tensor) -> torch.Tensor:
        """``L_i(w)`` for every group."""
        return self._group_means(self._per_record(w.to(torch.float64))[0])

    def _grad_weighted(self, w: torch.Tensor, resid: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """``Σ_i λ_i ∇L_i(w) + μ_w (w − c)`` from the per-record residuals."""
        r = resid * (lam / self.norm)[self.g]
        gw = (r @ self.x).reshape(-1)
        return torch.cat([gw, r.sum(1)]) + self.mu_w * (w - self.center)

    def value_grad(self, w: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        """``(Φ(w), ∇Φ(w), λ*(w))``."""
        ce, resid = self._per_record(w)
        losses = self._group_means(ce)
        lam = torch.softmax(losses / self.mu_lam, dim=0)
        reg = 0.5 * self.mu_w * float((w - self.center).pow(2).sum())
        value = self.mu_lam * float(torch.logsumexp(losses / self.mu_lam, dim=0)) + reg
        return value, self._grad_weighted(w, resid, lam), lam

    def value(self, w: torch.Tensor) -> float:
        losses = self.losses(w)
        reg = 0.5 * self.mu_w * float((w - self.center).pow(2).sum())
        return self.mu_lam * float(torch.logsumexp(losses / self.mu_lam, dim=0)) + reg

    def project(self, w: torch.Tensor) -> torch.Tensor:
        d = w - self.ball_center
        n = float(d.norm())
        return w if n <= self.radius else self.ball_center + d * (self.radius / n)

    def gap(self, w: torch.Tensor, lam: torch.Tensor | None = None) -> float:
        """Certified bound on ``max_λ F(w, λ) − min_{w'∈W} F(w', λ)`` (λ: the best response if None)."""
        w = w.to(torch.float64)
        ce, resid = self._per_record(w)
        losses = self._group_means(ce)
        best = torch.softmax(losses / self.mu_lam, dim=0)
        lam = best if lam is None else lam.to(torch.float64)
        reg = 0.5 * self.mu_w * float((w - self.center).pow(2).sum())
        upper = self.mu_lam * float(torch.logsumexp(losses / self.mu_lam, dim=0)) + reg
        entropy = float((lam * torch.log(lam.clamp_min(1e-300))).sum())
        f_lam = float((lam * losses).sum()) + reg - self.mu_lam * entropy
        g = self._grad_weighted(w, resid, lam)
        u = w - g / self.mu_w
        lower = f_lam + 0.5 * self.mu_w * float((self.project(u) - u).pow(2).sum()) - float(g @ g) / (2 * self.mu_w)
        gap = upper - lower
        # An overflow (inf − inf = NaN) certifies nothing: max(0.0, nan) would return 0.0.
        return max(0.0, gap) if math.isfinite(gap) else math.inf


def solve_accelerated(
    obj: SaddleObjective, w0: torch.Tensor, *, target_gap: float, max_iters: int = 20_000, check_every: int = 10
) -> SolveResult:
    """Accelerated projected gradient on Φ (backtracking, restart on increase) until the certified
    gap is at most ``target_gap``; raises :class:`SolverNotCertified` after ``max_iters``."""
    x = obj.project(w0.to(torch.float64))
    y, f_x, lip = x.clone(), obj.value(x), 1.0
    for it in range(1, max_iters + 1):
        f_y, g_y, _ = obj.value_grad(y)
        while True:
            x_new = obj.project(y - g_y / lip)
            step = x_new - y
            f_new = obj.value(x_new)
            if f_new <= f_y + float(g_y @ step) + 0.5 * lip * float(step @ step) + 1e-15 * abs(f_y):
                break
            lip *= 2.0
        q = min(1.0, obj.mu_w / lip)
        beta = (1 - math.sqrt(q)) / (1 + math.sqrt(q))
        y = x_new if f_new > f_x else x_new + beta * (x_new - x)  # restart when the value goes up
        x, f_x = x_new, f_new
        lip *= 0.9
        if it % check_every == 0 or it == max_iters:
            gap = obj.gap(x)
            if gap <= target_gap:
                return SolveResult(x, gap, it, obj.passes)
    raise _not_certified("accelerated", max_iters, obj.gap(x), target_gap)


def solve_ogd(
    obj: SaddleObjective, w0: torch.Tensor, *, target_gap: float, max_iters: int = 200_000, check_every: int = 100
) -> SolveResult:
    """The printed inner solver: ``λ_t = softmax(L(w_t)/μ_λ)``, ``w_{t+1} = Proj(w_t − ∇_t/(μ_w t))``,
    output the averages; stops once the certified gap of ``(w̄, λ̄)`` is at most ``target_gap``."""
    w = obj.project(w0.to(torch.float64))
    w_sum, lam_sum = torch.zeros_like(w), torch.zeros(obj.p, dtype=torch.float64)
    for t in range(1, max_iters + 1):
        _, grad, lam = obj.value_grad(w)
        w_sum += w
        lam_sum += lam
        w = obj.project(w - grad / (obj.mu_w * t))
        if t % check_every == 0 or t == max_iters:
            w_bar, lam_bar = w_sum / t, lam_sum / t
            gap = obj.gap(w_bar, lam_bar)
            if gap <= target_gap:
                return SolveResult(w_bar, gap, t, obj.passes)
    raise _not_certified("ogd", max_iters, obj.gap(w_sum / max_iters, lam_sum / max_iters), target_gap)


def _not_certified(name: str, iters: int, gap: float, target: float) -> SolverNotCertified:
    # No gap in the message: it is data without noise, and the message is a public failure reason.
    return SolverNotCertified(
        f"the {name} inner solver did not certify the target gap {target:.3g} the phase's sensitivity bound "
        f"needs within {iters} iterations; nothing was released (raise max_solver_iters, or use a larger eta / "
        "fewer phases)",
        gap=gap,
    )
