"""Lower bounds on ε from membership guesses: the one-run audit and the Clopper–Pearson audit.

Both turn the outcome of a membership game into a statement "with confidence 1 − β, a mechanism
that produced this outcome is NOT (ε, δ)-DP for any ε below the bound". What each bound assumes
and how to read it: ``docs/audit.md``.

* :func:`one_run_bound` — Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1)
  training run": m canaries, each included independently with probability ½; the auditor guesses
  "in" for its ``k_in`` highest scores, "out" for its ``k_out`` lowest and abstains elsewhere. For an
  (ε, δ)-DP mechanism the number W of correct guesses among the r = k_in + k_out made satisfies
  ``P[W ≥ v] ≤ f(v) + 2mδ · max_{1≤i≤v} (f(v − i) − f(v)) / i`` with
  ``f(v) = P[Binomial(r, e^ε/(1+e^ε)) ≥ v]`` (:func:`one_run_p_value`). The bound is the largest ε
  whose p-value for the observed count is at most β. Several guess counts are tried; each is
  tested at level β / (number tried) (Bonferroni), so picking the best one afterwards keeps the
  confidence.
* :func:`many_run_bound` — one canary per training run, included in some of R runs (the runs are
  independent given which ones include it). A threshold on the score gives a test with
  false-positive rate FPR and false-negative rate FNR; (ε, δ)-DP forces
  ``FPR + e^ε FNR ≥ 1 − δ`` and ``FNR + e^ε FPR ≥ 1 − δ``. With Clopper–Pearson upper confidence
  bounds on both rates, ``ε ≥ max(log((1 − δ − FPR⁺)/FNR⁺), log((1 − δ − FNR⁺)/FPR⁺))``. The
  threshold is chosen on the first half of the runs and the rates are bounded on the second half
  (choosing it on the same runs would overstate the confidence).

Binomial tails and beta quantiles come from :mod:`scipy.stats`.

Example:
    >>> import numpy as np
    >>> included = np.array([True] * 50 + [False] * 50)
    >>> perfect = included.astype(float)          # scores that separate members perfectly
    >>> b = one_run_bound(perfect, included, delta=0.0, confidence=0.95, guesses=((50, 50),))
    >>> b.correct, b.guesses, round(b.epsilon, 3)    # 100 right of 100: logit(0.05 ** (1/100))
    (100, 100, 3.493)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats

from privopt.errors import ConfigError

__all__ = [
    "OneRunBound",
    "ManyRunBound",
    "one_run_p_value",
    "one_run_epsilon",
    "one_run_bound",
    "default_guess_counts",
    "clopper_pearson_upper",
    "epsilon_from_rates",
    "many_run_bound",
]

# The search for the largest rejected ε stops here: e^50 is far beyond any meaningful claim.
_EPS_MAX = 50.0


def _check_level(confidence: float) -> float:
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    return 1.0 - float(confidence)


def _check_delta(delta: float) -> float:
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise ConfigError(f"delta must be in [0, 1), got {delta!r}")
    return float(delta)


def _check_scores(scores, included) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    b = np.asarray(included, dtype=bool).reshape(-1)
    if s.shape != b.shape or s.size == 0:
        raise ConfigError(f"need one inclusion flag per score, got {s.size} scores and {b.size} flags")
    if not np.all(np.isfinite(s)):
        raise ConfigError("membership scores must be finite")
    return s, b


# ----------------------------------------------------------------------------- one run
def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Largest probability that an (ε, δ)-DP mechanism lets ``correct`` or more of ``guesses``
    membership guesses on ``canaries`` randomly included canaries be right (Steinke et al. 2023).

    Example:
        >>> round(one_run_p_value(canaries=10, guesses=10, correct=10, epsilon=0.0, delta=0.0), 6)  # 2^-10
        0.000977
    """
    m, r, v = int(canaries), int(guesses), int(correct)
    if not 0 <= v <= r <= m:
        raise ConfigError(f"need 0 <= correct <= guesses <= canaries, got {v}, {r}, {m}")
    p = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomized response
    tail = float(stats.binom.sf(v - 1, r, p))  # f(v) = P[Binomial(r, p) >= v]
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    # (f(v − i) − f(v)) = P[v − i <= Binomial < v], i = 1..v: cumulative sums of the pmf below v.
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, p))
    slope = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * slope, 1.0)


def one_run_epsilon(*, canaries: int, guesses: int, correct: int, delta: float, level: float) -> float:
    """Largest ε at which the observed count has p-value ≤ ``level`` (0 when none does).

    Example:
        >>> one_run_epsilon(canaries=100, guesses=10, correct=5, delta=0.0, level=0.05)  # chance level
        0.0
    """

    def excess(eps: float) -> float:
        return one_run_p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=eps, delta=delta) - level

    if excess(0.0) > 0:  # not even ε = 0 is rejected
        return 0.0
    if excess(_EPS_MAX) <= 0:
        return _EPS_MAX
    # The p-value grows with ε (the binomial tail does), so the rejected set is an interval [0, ε*].
    return float(optimize.brentq(excess, 0.0, _EPS_MAX, xtol=1e-6))


@dataclass(frozen=True)
class OneRunBound:
    """Result of :func:`one_run_bound`.

    Attributes:
        epsilon: the lower bound on ε (0: nothing rejected).
        guesses, correct: guesses made and right at the best guess count.
        k_in, k_out: that guess count ("in" for the k_in top scores, "out" for the k_out bottom).
        canaries, included: m and how many were included.
        confidence, delta: as given; ``tried``: guess counts tried (Bonferroni factor).
    """

    epsilon: float
    guesses: int
    correct: int
    k_in: int
    k_out: int
    canaries: int
    included: int
    confidence: float
    delta: float
    tried: int

    def to_dict(self) -> dict:
        return asdict(self)


def default_guess_counts(canaries: int) -> tuple[tuple[int, int], ...]:
    """Guess counts tried by default: "in" guesses only, and as many "out" guesses, for k = 10, 20,
    50, 100, ... up to m/2 (only "in" guesses suit subsampled training, where an included canary
    that was rarely sampled looks excluded; two-sided guesses suit full-batch releases).

    Example:
        >>> default_guess_counts(100)
        ((10, 0), (10, 10), (20, 0), (20, 20), (50, 0), (50, 50))
    """
    m = int(canaries)
    ks, base = [], 10
    while base <= max(m // 2, 1):
        for mult in (1, 2, 5):
            if base * mult <= max(m // 2, 1):
                ks.append(base * mult)
        base *= 10
    ks = sorted(set(ks)) or [max(1, m // 2)]
    return tuple(pair for k in ks for pair in ((k, 0), (k, k)))


def one_run_bound(
    scores,
    included,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[tuple[int, int]] | None = None,
) -> OneRunBound:
    """One-run ε lower bound from per-canary ``scores`` (higher = "more likely included") and the
    secret inclusion flags.

    Args:
        scores: one score per canary (length m).
        included: whether each canary was in the training data.
        delta: the δ of the claim under test.
        confidence: 1 − β.
        guesses: ``(k_in, k_out)`` pairs to try (default :func:`default_guess_counts`); each is
            tested at level β / len(guesses).
    """
    s, b = _check_scores(scores, included)
    beta, delta = _check_level(confidence), _check_delta(delta)
    pairs = tuple(guesses) if guesses is not None else default_guess_counts(s.size)
    if not pairs or any(ki < 0 or ko < 0 or ki + ko == 0 or ki + ko > s.size for ki, ko in pairs):
        raise ConfigError(f"guess counts must be (k_in, k_out) >= 0 with 0 < k_in + k_out <= {s.size}, got {pairs}")
    order = np.argsort(-s, kind="stable")  # descending scores
    ranked = b[order]
    best = None
    for k_in, k_out in pairs:
        right = int(ranked[:k_in].sum()) + int((~ranked[s.size - k_out :]).sum() if k_out else 0)
        eps = one_run_epsilon(
            canaries=s.size, guesses=k_in + k_out, correct=right, delta=delta, level=beta / len(pairs)
        )
        if best is None or eps > best[0]:
            best = (eps, k_in + k_out, right, k_in, k_out)
    eps, r, v, k_in, k_out = best
    return OneRunBound(eps, r, v, k_in, k_out, int(s.size), int(b.sum()), float(confidence), delta, len(pairs))


# ----------------------------------------------------------------------------- many runs
def clopper_pearson_upper(errors: int, trials: int, *, level: float) -> float:
    """One-sided Clopper–Pearson upper confidence bound (at ``1 − level``) on a binomial rate.

    Example:
        >>> round(clopper_pearson_upper(0, 20, level=0.05), 4)   # 1 − 0.05^(1/20)
        0.1391
    """
    k, n = int(errors), int(trials)
    if not 0 <= k <= n or n == 0:
        raise ConfigError(f"need 0 <= errors <= trials and trials > 0, got {k}, {n}")
    return 1.0 if k == n else float(stats.beta.ppf(1.0 - level, k + 1, n - k))


def epsilon_from_rates(fpr: float, fnr: float, *, delta: float) -> float:
    """Smallest ε compatible with a test of false-positive rate ``fpr`` and false-negative rate
    ``fnr`` under (ε, δ)-DP (0 when the rates are compatible with ε = 0).

    Example:
        >>> round(epsilon_from_rates(0.1, 0.1, delta=0.0), 4)    # log(0.9 / 0.1)
        2.1972
    """
    out = 0.0
    for a, b in ((fpr, fnr), (fnr, fpr)):
        if b <= 0:
            return math.inf if 1.0 - delta - a > 0 else out
        if 1.0 - delta - a > b:
            out = max(out, math.log((1.0 - delta - a) / b))
    return out


@dataclass(frozen=True)
class ManyRunBound:
    """Result of :func:`many_run_bound`: the bound, the threshold and the held-out error counts."""

    epsilon: float
    threshold: float
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    fpr_upper: float
    fnr_upper: float
    runs: int
    confidence: float
    delta: float

    def to_dict(self) -> dict:
        return asdict(self)


def _threshold_bound(s, b, threshold: float, *, delta: float, level: float) -> tuple[float, tuple]:
    fp, neg = int(((s >= threshold) & ~b).sum()), int((~b).sum())
    fn, pos = int(((s < threshold) & b).sum()), int(b.sum())
    fpr_u = clopper_pearson_upper(fp, neg, level=level / 2)  # both bounds hold together: β/2 each
    fnr_u = clopper_pearson_upper(fn, pos, level=level / 2)
    return epsilon_from_rates(fpr_u, fnr_u, delta=delta), (fp, neg, fn, pos, fpr_u, fnr_u)


def many_run_bound(scores, included, *, delta: float, confidence: float = 0.95) -> ManyRunBound:
    """Clopper–Pearson ε lower bound from one score per training run (higher = "canary in").

    The first half of the runs picks the threshold (the one with the best bound there); the
    second half, untouched by that choice, gives the error counts and the bound. Each half needs
    runs with and without the canary.
    """
    s, b = _check_scores(scores, included)
    beta, delta = _check_level(confidence), _check_delta(delta)
    half = s.size // 2
    pick, test = slice(0, half), slice(half, s.size)
    for part in (pick, test):
        if b[part].all() or not b[part].any():
            raise ConfigError("each half of the runs needs runs with and without the canary; run more of them")
    levels = np.unique(s[pick])
    candidates = np.concatenate([(levels[:-1] + levels[1:]) / 2, levels[-1:] + 1.0])  # between observed scores
    scored = [(_threshold_bound(s[pick], b[pick], t, delta=delta, level=beta)[0], t) for t in candidates]
    threshold = max(scored, key=lambda et: et[0])[1]
    eps, (fp, neg, fn, pos, fpr_u, fnr_u) = _threshold_bound(s[test], b[test], threshold, delta=delta, level=beta)
    return ManyRunBound(eps, float(threshold), fp, neg, fn, pos, fpr_u, fnr_u, int(s.size), float(confidence), delta)
