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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["ETA_SCALE", "RATE_EPSILONS", "RATE_KS", "run_rates", "theorem2_eta", "theorem2_terms"]

RATE_KS = (1000, 2000, 4000, 8000, 16000, 32000, 64000)
RATE_EPSILONS = (20.0, 2.0)  # 20: the statistical term dominates; 2: the noise of the phases shows
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


def _excess(K: int, *, epsilon: float, seed: int, insecure_seed: int | None) -> float:
    from privopt.config import RunConfig
    from privopt.data import load_dataset
    from privopt.eval.worst_group import evaluate_groups
    from privopt.training import LoopState, run_loop
    from privopt.training.builder import build_run

    data = load_dataset(
        "synthetic-groups", seed=seed, n_train=K, num_groups=P, dim=DIM, n_test_per_group=N_TEST_PER_GROUP
    )
    delta = K**-1.1
    eta = theorem2_eta(K=K, p=P, d=2 * (DIM + 1), epsilon=epsilon, delta=delta)
    params = {"eta": eta, "radius": RADIUS, "feature_norm": 1.0, "group_sizes": "public"}
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
    return m["worst_group_loss"] - _population_minimax(data, seed)


def run_rates(
    *, seeds: int, ks: Sequence[int] = RATE_KS, epsilons: Sequence[float] = RATE_EPSILONS, insecure_seed=None, log=print
) -> dict[str, Any]:
    """Mean excess worst-group risk per (ε, K) over ``seeds`` runs, the fitted slopes and the theorem's."""
    out: dict[str, Any] = {"ks": list(ks), "eta_scale": ETA_SCALE, "radius": RADIUS, "p": P, "dim": DIM, "curves": {}}
    for eps in epsilons:
        means = []
        for K in ks:
            vals = [_excess(K, epsilon=eps, seed=s, insecure_seed=insecure_seed) for s in range(seeds)]
            means.append(float(np.mean(vals)))
            log(
                f"  rates eps={eps:g} K={K}: excess worst-group risk {means[-1]:.4f} "
                f"(runs {np.round(vals, 4).tolist()})"
            )
        out["curves"][str(eps)] = _fit(ks, means, eps)
    return out


def _fit(ks: Sequence[int], means: Sequence[float], eps: float) -> dict[str, Any]:
    d = 2 * (DIM + 1)
    positive = [(k, m) for k, m in zip(ks, means) if m > 0]
    slope = float(np.polyfit(np.log([k for k, _ in positive]), np.log([m for _, m in positive]), 1)[0])
    terms = {t: (lambda K, t=t: theorem2_terms(K, p=P, d=d, epsilon=eps)[t]) for t in ("statistical", "privacy")}
    mid = math.sqrt(ks[0] * ks[-1])
    dominant = max(terms, key=lambda t: terms[t](mid))
    power = {"statistical": -0.5, "privacy": -1.0}
    return {
        "excess": list(means),
        "measured_slope": slope,
        "dominant_term": dominant,
        "theorem_slope": power[dominant],
        "theorem_slope_with_logs": _local_slope(terms[dominant], ks),
        "within_0.15": abs(slope - power[dominant]) <= 0.15,
        "term_ratio_at_mid_K": terms["privacy"](mid) / terms["statistical"](mid),
    }
