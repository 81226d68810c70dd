"""Excess worst-group risk of Minimax Phased ERM against the number of samples K (synthetic data).

Paper D has no experiments; this measures the rate of its Theorem 2 on the ``synthetic-groups``
benchmark with balanced groups (n = K/p records each, as in the theorem). For every K the phased
ERM runs with Theorem 2's step

    η = c · (M/D) · min{ ε / √(72·d·log(K/p)·log(1/δ)),  √p / (log^{3/4}(K)·√K) }

(``c`` = :data:`ETA_SCALE`, one constant for all K: with c = 1 every phase stays at the
initialisation for all K we can run, where the theorem's bound exceeds the loss range), T =
⌊log2(K/p)⌋ phases, δ = K^{−1.1}. The excess population risk ``max_i L_{D_i}(w) − min_{w∈W}
max_i L_{D_i}(w)`` is measured on a large independent test draw (the population proxy); the
minimax value comes from the certified solver with tiny regularisation. The log-log slope of the
mean excess over K is compared with the exponent of Theorem 2's dominant term at that ε: −1/2 for
the statistical term ``log^{11/4}(K)·√(p/K)``, −1 for the privacy term ``log^{5/2}(K)·p√(d
log(1/δ))/(Kε)`` (both are also reported with their log factors, as the local slope over the K range).
Which term dominates is measured, not assumed: every run has a non-private twin (same data, same η,
no noise), and the privacy cost is the private run's excess minus the twin's. Each phase's noisy
output is projected onto W (post-processing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["ETA_SCALE", "RATE_GRID", "run_rates", "slope_with_ci", "theorem2_eta", "theorem2_terms"]

# K range per ε, fixed in advance (docs/algorithms/worst_group.md, "The rate in K"): the expected norm of
# phase 1's noise is 4.8 at K = 1,000 and below W's radius from K ≈ 4,000 at ε = 20; at ε = 2 it is below
# the radius only from K ≈ 300,000 (for K ≤ 64,000 the noisy outputs fill the ball and the excess sits at
# its ceiling, ≈ 0.25, whatever K).
RATE_GRID: dict[float, tuple[int, ...]] = {
    20.0: (1000, 2000, 4000, 8000, 16000, 32000, 64000),
    2.0: (256_000, 512_000, 1_024_000, 2_048_000, 4_096_000),
}
ETA_SCALE = 10.0
RADIUS, P, DIM, N_TEST_PER_GROUP = 2.0, 4, 10, 20_000


def _constants() -> tuple[float, float, float]:
    """(L, B, M) of logistic regression on ‖x‖ ≤ 1 (the generator's bound) over the ball of RADIUS."""
    feat = math.sqrt(2.0)  # ‖(x, 1)‖ with ‖x‖ ≤ 1
    lipschitz = math.sqrt(2.0) * feat
    bound = math.log1p(math.exp(math.sqrt(2.0) * RADIUS * feat))
    return lipschitz, bound, 2 * RADIUS


def theorem2_eta(*, K: int, p: int, d: int, epsilon: float, delta: float, scale: float = ETA_SCALE) -> float:
    """Theorem 2's η (times ``scale``) for K samples, p groups and d parameters.

    Example:
        >>> round(theorem2_eta(K=4000, p=4, d=22, epsilon=20.0, delta=4000**-1.1, scale=1.0), 5)
        0.00644
    """
    lipschitz, bound, diameter = _constants()
    dp_term = epsilon / math.sqrt(72 * d * math.log(K / p) * math.log(1 / delta))
    stat_term = math.sqrt(p) / (math.log(K) ** 0.75 * math.sqrt(K))
    return scale * diameter / max(lipschitz, bound) * min(dp_term, stat_term)


def theorem2_terms(K: float, *, p: int, d: int, epsilon: float) -> dict[str, float]:
    """Theorem 2's two terms (O(·) constants 1, without the common factor M·D)."""
    delta = K**-1.1
    return {
        "statistical": math.log(K) ** 2.75 * math.sqrt(p / K),
        "privacy": math.log(K) ** 2.5 * p * math.sqrt(d * math.log(1 / delta)) / (K * epsilon),
    }


def _local_slope(f: Callable[[float], float], ks: Sequence[int]) -> float:
    return float(np.polyfit(np.log(ks), np.log([f(k) for k in ks]), 1)[0])


_MINIMAX: dict[tuple, float] = {}


def _population_minimax(data, seed: int) -> float:
    """min over W of the worst group's risk on the test draw (which depends on the seed only)."""
    key = (seed, int(data.y_test.shape[0]))
    if key not in _MINIMAX:
        _MINIMAX[key] = _solve_minimax(data)
    return _MINIMAX[key]


def _solve_minimax(data) -> float:
    from privopt.algorithms.worst_group_scsc import SaddleObjective, solve_accelerated

    dim = 2 * (data.x_test.shape[1] + 1)
    zero = torch.zeros(dim, dtype=torch.float64)
    obj = SaddleObjective(
        data.x_test, data.y_test, data.g_test, norm=torch.bincount(data.g_test).double(), num_classes=2,
        mu_w=1e-6, mu_lam=1e-4, center=zero, ball_center=zero, radius=RADIUS,
    )  # fmt: skip
    res = solve_accelerated(obj, zero, target_gap=1e-7, max_iters=50_000)
    return float(obj.losses(res.w).max())  # within μ_λ·log p + μ_w·r² ≈ 1.4e-4 of the minimax value


def _excess(K: int, *, epsilon: float, seed: int, insecure_seed: int | None) -> dict[str, float]:
    """Excess worst-group risk of one private run and of its non-private twin (same data and η)."""
    from privopt.data import load_dataset

    data = load_dataset(
        "synthetic-groups", seed=seed, n_train=K, num_groups=P, dim=DIM, n_test_per_group=N_TEST_PER_GROUP
    )
    minimax = _population_minimax(data, seed)
    out = {}
    for private in (True, False):
        algo, worst = _phased_run(data, K=K, epsilon=epsilon, seed=seed, insecure_seed=insecure_seed, private=private)
        out["private" if private else "non_private"] = worst - minimax
        if private:
            out["z"] = algo.releases.multiplier("phase-output")
            out["phase1_noise_norm"] = out["z"] * algo.constants(1).sensitivity * math.sqrt(2 * (DIM + 1))
    return out


def _phased_run(data, *, K: int, epsilon: float, seed: int, insecure_seed: int | None, private: bool):
    from privopt.config import RunConfig
    from privopt.eval.worst_group import evaluate_groups
    from privopt.training import LoopState, run_loop
    from privopt.training.builder import build_run

    delta = K**-1.1
    eta = theorem2_eta(K=K, p=P, d=2 * (DIM + 1), epsilon=epsilon, delta=delta)
    params = {
        "eta": eta, "radius": RADIUS, "feature_norm": 1.0, "group_sizes": "public", "project_output": True,
        "private": private,
    }  # fmt: skip
    cfg = RunConfig.from_dict(
        {
            "algorithm": "minimax-phased-erm",
            "dataset": data.name,
            "model": "logreg",
            "seed": seed,
            "insecure_seed": None if insecure_seed is None else insecure_seed + seed,
            "algorithm_params": params,
            "privacy": {"epsilon": epsilon, "delta": delta, "accountant": "rdp"},
        }
    )
    run = build_run(cfg, dataset=data)
    run_loop(run.algo.step, LoopState(step=0, total=run.total))
    m = evaluate_groups(run.model, data.x_test, data.y_test, data.g_test, num_groups=P)
    return run.algo, m["worst_group_loss"]


def run_rates(
    *, seeds: int, grid: dict[float, Sequence[int]] | None = None, insecure_seed=None, log=print
) -> dict[str, Any]:
    """Excess worst-group risk per (ε, K) over ``seeds`` runs (and their non-private twins), fitted slopes
    with bootstrap intervals, the measured dominant term and the theorem's slope for it."""
    grid = RATE_GRID if grid is None else grid
    out: dict[str, Any] = {"eta_scale": ETA_SCALE, "radius": RADIUS, "p": P, "dim": DIM, "seeds": seeds, "curves": {}}
    for eps, ks in grid.items():
        runs = []
        for K in ks:
            per_seed = [_excess(K, epsilon=eps, seed=s, insecure_seed=insecure_seed) for s in range(seeds)]
            runs.append({key: [r[key] for r in per_seed] for key in per_seed[0]})
            r = runs[-1]
            log(
                f"  rates eps={eps:g} K={K}: excess worst-group risk {np.mean(r['private']):.4f} "
                f"(non-private twin {np.mean(r['non_private']):.4f}; runs {np.round(r['private'], 4).tolist()}; "
                f"phase-1 noise norm {r['phase1_noise_norm'][0]:.2f})"
            )
        out["curves"][str(eps)] = _fit(list(ks), runs, eps)
    return out


def _noise_piece(K: int, eps: float, z: float) -> float:
    """The proof's privacy piece at the η the run uses: Σ_t μ_w^t·E‖ξ_{t−1}‖² ∝ z²·η·T³/n (its B-part)."""
    n, T = K / P, max(1, math.floor(math.log2(K / P)))
    return z**2 * theorem2_eta(K=K, p=P, d=2 * (DIM + 1), epsilon=eps, delta=K**-1.1) * T**3 / n


def slope_with_ci(
    ks: Sequence[int], values: Sequence[Sequence[float]], *, reps: int = 2000, level: float = 0.95
) -> tuple[float, float, float]:
    """Least-squares log-log slope of the per-K means over ALL ``ks``, and a bootstrap interval
    (the runs of every K resampled with replacement; the interval is the central ``level`` share).

    Example:
        >>> ks = [1000, 4000, 16000]
        >>> s, lo, hi = slope_with_ci(ks, [[2.0 * k**-0.5 * f for f in (0.9, 1.0, 1.1)] for k in ks])
        >>> round(s, 3), lo < s < hi
        (-0.5, True)
    """
    x = np.log(np.asarray(ks, dtype=float))
    vals = [np.asarray(v, dtype=float) for v in values]
    slope = float(np.polyfit(x, np.log([v.mean() for v in vals]), 1)[0])
    rng = np.random.default_rng(0)  # resampling of released numbers: public analysis, not noise
    boot = []
    for _ in range(reps):
        means = [rng.choice(v, size=v.size).mean() for v in vals]
        if min(means) > 0:
            boot.append(np.polyfit(x, np.log(means), 1)[0])
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return slope, float(lo), float(hi)


def _fit(ks: Sequence[int], runs: Sequence[dict[str, list[float]]], eps: float) -> dict[str, Any]:
    d = 2 * (DIM + 1)
    private = [r["private"] for r in runs]
    twin = [r["non_private"] for r in runs]
    slope, lo, hi = slope_with_ci(ks, private)
    share = [1.0 - np.mean(t) / np.mean(v) for v, t in zip(private, twin)]
    # the term carrying the larger share of the excess, each K weighted equally (as in the fit)
    dominant = "privacy" if np.mean(share) > 0.5 else "statistical"
    terms = {t: (lambda K, t=t: theorem2_terms(K, p=P, d=d, epsilon=eps)[t]) for t in ("statistical", "privacy")}
    power = {"statistical": -0.5, "privacy": -1.0}
    curve = {
        "ks": list(ks),
        "excess": [float(np.mean(v)) for v in private],
        "excess_non_private": [float(np.mean(t)) for t in twin],
        "runs": [dict(r) for r in runs],
        "privacy_share": [float(s) for s in share],
        "measured_slope": slope,
        "measured_slope_ci95": [lo, hi],
        "non_private_slope": float(np.polyfit(np.log(ks), np.log([np.mean(t) for t in twin]), 1)[0]),
        "dominant_term": dominant,
        "share_crosses_half": bool(min(share) < 0.5 < max(share)),
        "printed_term_ratio": [terms["privacy"](k) / terms["statistical"](k) for k in ks],
    }
    z = [r["z"][0] for r in runs]
    curve["noise_piece_slope_at_eta_used"] = _local_slope(lambda K: _noise_piece(K, eps, z[list(ks).index(K)]), ks)
    curve.update(
        theorem_slope=power[dominant],
        theorem_slope_with_logs=_local_slope(terms[dominant], ks),
        within_015=abs(slope - power[dominant]) <= 0.15,
    )
    return curve
