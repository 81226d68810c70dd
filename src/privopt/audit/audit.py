"""``run_audit``: an empirical privacy audit of one algorithm and config (``docs/audit.md``).

Two designs, two threat models:

* **one-run** (Steinke, Nasr & Jagielski 2023): m canaries, each inserted independently with
  probability ½ into ONE training run; every canary is scored, the auditor guesses the membership
  of the highest (and lowest) scores, and the number of right guesses bounds ε
  (:func:`privopt.audit.bounds.one_run_bound`).
* **many-run** (Clopper–Pearson): R training runs with one canary, inserted in half of each half
  of the runs (secret random order); a threshold on its score gives false-positive and
  false-negative rates whose confidence bounds bound ε (:func:`privopt.audit.bounds.many_run_bound`).

Each in a **white-box** mode (gradient canaries, scores from the released noisy gradients) and a
**black-box** mode (input canaries, scores from the released model's loss).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from privopt.audit.bounds import many_run_bound, one_run_bound
from privopt.audit.canaries import draw_inclusion
from privopt.audit.runner import CanaryRun, black_box_run, input_canaries, load_base, white_box_run
from privopt.config import RunConfig
from privopt.errors import ConfigError
from privopt.plugins import load_plugins
from privopt.rng import RandomSource, SecureSource

__all__ = ["AuditResult", "AuditReport", "run_audit", "MODES", "METHODS"]

MODES = ("white-box", "black-box")
METHODS = ("one-run", "many-run")


@dataclass
class AuditResult:
    """One audit (a mode and a method): the bound, the accounted ε and the evidence.

    ``scores``/``included`` (one per canary, or one per run) are kept for the plot, not serialised.
    """

    mode: str
    method: str
    epsilon_lower_bound: float
    epsilon_accounted: float
    delta: float
    bound: dict[str, Any]
    runs: list[dict[str, Any]]
    wall_time_s: float
    scores: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    included: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def exceeds(self) -> bool:
        """The empirical lower bound is above the accounted ε: the claim is refuted."""
        return self.epsilon_lower_bound > self.epsilon_accounted

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "method": self.method,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "epsilon_accounted": self.epsilon_accounted,
            "delta": self.delta,
            "exceeds": self.exceeds,
            "bound": self.bound,
            "runs": self.runs,
            "wall_time_s": self.wall_time_s,
        }


@dataclass
class AuditReport:
    """Everything one ``privopt audit`` measured."""

    config: dict[str, Any]
    confidence: float
    results: list[AuditResult]
    wall_time_s: float

    @property
    def passed(self) -> bool:
        """No empirical lower bound exceeds its accounted ε."""
        return not any(r.exceeds for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "algorithm": c["algorithm"],
            "dataset": c["dataset"],
            "model": c["model"],
            "epsilon_target": c["privacy"]["epsilon"],
            "delta": c["privacy"]["delta"],
            "confidence": self.confidence,
            "passed": self.passed,
            "audits": [r.to_dict() for r in self.results],
            "wall_time_s": self.wall_time_s,
            "config": c,
        }


def _run_summary(run: CanaryRun) -> dict[str, Any]:
    out = {"n_train": run.n, "steps": run.steps, "epsilon_accounted": run.epsilon, "wall_time_s": run.wall_time_s}
    if run.test_accuracy is not None:
        out["test_accuracy"] = run.test_accuracy
    if run.releases:
        out["releases"] = run.releases
    return out


def _one_run(cfg, base, mode: str, *, canaries: int, confidence: float, rng, say) -> AuditResult:
    t0 = time.perf_counter()
    if mode == "white-box":
        included = draw_inclusion(canaries, rng=rng)
        say(f"{mode} one-run: training with {int(included.sum())} of {canaries} gradient canaries")
        run = white_box_run(cfg, base, included)
    else:
        pool = input_canaries(base, canaries, seed=cfg.seed)
        included = draw_inclusion(len(pool[1]), rng=rng)
        say(f"{mode} one-run: training with {int(included.sum())} of {len(pool[1])} input canaries")
        run = black_box_run(cfg, base, pool, included)
    flags = included.numpy().astype(bool)
    bound = one_run_bound(run.scores, flags, delta=run.delta, confidence=confidence)
    return AuditResult(
        mode=mode,
        method="one-run",
        epsilon_lower_bound=bound.epsilon,
        epsilon_accounted=run.epsilon,
        delta=run.delta,
        bound=bound.to_dict(),
        runs=[_run_summary(run)],
        wall_time_s=time.perf_counter() - t0,
        scores=run.scores,
        included=flags,
    )


def _many_run(cfg, base, mode: str, *, runs: int, confidence: float, rng, say) -> AuditResult:
    t0 = time.perf_counter()
    coins = _balanced_coins(runs, rng)
    pool = input_canaries(base, 1, seed=cfg.seed) if mode == "black-box" else None
    scores, summaries = np.zeros(runs), []
    for j in range(runs):
        flag = coins[j : j + 1]
        run = white_box_run(cfg, base, flag) if pool is None else black_box_run(cfg, base, pool, flag)
        scores[j] = run.scores[0]
        summaries.append(_run_summary(run))
        say(f"{mode} many-run: run {j + 1}/{runs} done ({run.wall_time_s:.1f} s)")
    flags = coins.numpy().astype(bool)
    delta = float(cfg.privacy.delta)
    bound = many_run_bound(scores, flags, delta=delta, confidence=confidence)
    accounted = max(s["epsilon_accounted"] for s in summaries)  # the runs differ in n by one
    return AuditResult(
        mode=mode,
        method="many-run",
        epsilon_lower_bound=bound.epsilon,
        epsilon_accounted=accounted,
        delta=delta,
        bound=bound.to_dict(),
        runs=summaries,
        wall_time_s=time.perf_counter() - t0,
        scores=scores,
        included=flags,
    )


def _balanced_coins(runs: int, rng: RandomSource | None) -> torch.Tensor:
    """Which runs include the canary: half of each half of the runs, in a secret random order (the
    threshold is picked on the first half and tested on the second; each needs both kinds of run)."""
    source = rng if rng is not None else SecureSource()
    parts = []
    for size in (runs // 2, runs - runs // 2):
        flags = torch.arange(size) < size // 2
        parts.append(flags[source.randperm(size)])
    return torch.cat(parts)


def _check_args(mode: str, method: str, canaries: int, runs: int, confidence: float) -> tuple[str, ...]:
    modes = MODES if mode == "both" else (mode,)
    if any(m not in MODES for m in modes):
        raise ConfigError(f"audit mode must be one of {MODES + ('both',)}, got {mode!r}")
    if method not in METHODS:
        raise ConfigError(f"audit method must be one of {METHODS}, got {method!r}")
    if method == "one-run" and not (isinstance(canaries, int) and canaries >= 2):
        raise ConfigError(f"the number of canaries must be an integer >= 2, got {canaries!r}")
    if method == "many-run" and not (isinstance(runs, int) and runs >= 4):
        raise ConfigError(f"a many-run audit needs an integer number of runs >= 4, got {runs!r}")
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    return modes


def run_audit(
    cfg: RunConfig,
    *,
    mode: str = "both",
    method: str = "one-run",
    canaries: int = 1000,
    runs: int = 100,
    confidence: float = 0.95,
    progress: Callable[[str], None] | None = None,
    inclusion_rng: RandomSource | None = None,
) -> AuditReport:
    """Audit the privacy claim of ``cfg`` (its algorithm, data, model and target (ε, δ)).

    Args:
        cfg: the run configuration to audit (``privopt train``'s).
        mode: ``"white-box"``, ``"black-box"`` or ``"both"``.
        method: ``"one-run"`` (``canaries`` canaries in one run) or ``"many-run"`` (``runs`` runs).
        canaries: canaries of a one-run audit (black-box: at most the test split's size).
        runs: training runs of a many-run audit.
        confidence: the confidence of the lower bounds (1 − β).
        progress: called with a line of text after each stage (``None``: silent).
        inclusion_rng: where the canaries' inclusion (coins, or the order of the runs) comes
            from; default a fresh :class:`~privopt.rng.SecureSource` (secret). Pass a seeded
            source only for tests.

    Returns:
        An :class:`AuditReport`; ``report.passed`` is False when an empirical lower bound exceeds
        the ε the run accounted (a refuted privacy claim).
    """
    modes = _check_args(mode, method, canaries, runs, confidence)
    # First: the config may name what they register. Their absolute paths, for the audited runs'
    # configs (without a dataset's params, so without the config file's folder either).
    plugins = load_plugins(cfg)
    from privopt.algorithms import get_algorithm

    if not get_algorithm(cfg.algorithm, **cfg.algorithm_params).private:
        raise ConfigError(f"algorithm {cfg.algorithm!r} is not private: there is no privacy claim to audit")
    if cfg.privacy.epsilon is None or not math.isfinite(cfg.privacy.epsilon):
        raise ConfigError("the audited config needs a finite privacy.epsilon (a privacy claim to test)")
    say = progress or (lambda line: None)
    t0 = time.perf_counter()
    base = load_base(cfg)
    results, audited = [], cfg
    cfg = replace(cfg, plugins=plugins)
    for m in modes:
        if method == "one-run":
            results.append(_one_run(cfg, base, m, canaries=canaries, confidence=confidence, rng=inclusion_rng, say=say))
        else:
            results.append(_many_run(cfg, base, m, runs=runs, confidence=confidence, rng=inclusion_rng, say=say))
    return AuditReport(audited.to_dict(), float(confidence), results, time.perf_counter() - t0)
