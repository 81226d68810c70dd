"""Gauss-PSGD (Paper C, Algorithm 1) on the Ada-DP-SPIDER oracle: private SGD that escapes saddle
points with its own privacy noise and certifies the point it returns.

Normal steps ``x ← x − η·ĝ(x)``. When the private estimate is small (``‖ĝ‖ ≤ 3χ``) the current
point becomes the escape candidate ``x̃`` and up to ``Q`` escape rounds run, each restarted from
``x̃`` with a fresh refresh of the oracle and at most ``Γ`` steps: a round that moves at least
``R`` away from ``x̃`` has escaped (normal steps continue from there); if no round escapes, ``x̃``
is returned, *certified* (Theorem 1: an α-SOSP with high probability). The run also ends,
uncertified, when the oracle's data or privacy budget is spent (it then returns the current
point, or ``x̃`` in the middle of an escape). The perturbation is the oracle's privacy noise: no
other noise is injected.

One oracle query per loop step: the training loop's steps are PSGD steps. What is implemented,
the departures from the printed box (restart semantics, returned point, stopping rule) and the
privacy inventory: docs/algorithms/sosp.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import auto_or_positive, param, positive, positive_int
from privopt.algorithms.sosp_common import FederatedOptimizer, SpiderConfig
from privopt.errors import ConfigError

__all__ = ["GaussPSGD", "GaussPSGDConfig"]


@dataclass(frozen=True)
class GaussPSGDConfig(SpiderConfig):
    """Gauss-PSGD's hyper-parameters (defaults: the paper's printed χ, κ, Γ, Q and MNIST lr).

    Attributes:
        chi: escape threshold χ (an escape is tried when ``‖ĝ‖ ≤ 3χ``); ``"auto"`` = ψ̂, the
            oracle's effective noise magnitude ``sqrt(σ̂² + r²d)`` (public).
        escape_steps: Γ, the longest escape round. escape_rounds: Q.
        radius: R, the drift radius of a successful escape; ``"auto"`` = ``radius_factor·η·sqrt(Γ)·ψ̂``.
        radius_factor: r_R of the automatic radius.
    """

    chi: str | float = param(0.01, auto_or_positive)
    escape_steps: int = param(10, positive_int)
    escape_rounds: int = param(3, positive_int)
    radius: str | float = param("auto", auto_or_positive)
    radius_factor: float = param(2.0, positive)

    def check(self) -> None:
        super().check()
        for name in ("chi", "radius"):
            if getattr(self, name) is None:
                raise ConfigError(f"{name} must be a number > 0 or 'auto'")


@register_algorithm
class GaussPSGD(FederatedOptimizer):
    """Gauss-PSGD with the Ada-DP-SPIDER oracle, on one machine or m clients.

    After the run, :attr:`certified` says whether the returned point passed the escape test
    (``None``: the budget ended first), :attr:`stats` counts escape attempts, successful escapes
    and rounds.

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> algo = get_algorithm("gauss-psgd", epochs=2, b1=100, b2=20)
        >>> algo.config.chi, algo.config.kappa, algo.config.escape_steps, algo.config.escape_rounds
        (0.01, 0.1, 10, 3)
    """

    name = "gauss-psgd"
    summary = "Gauss-PSGD (Paper C Alg. 1): private SGD with saddle escape and an SOSP certificate"
    Config = GaussPSGDConfig

    def setup(self, ctx) -> None:
        super().setup(ctx)
        c = self.config
        psi = self.oracle.noise_magnitude(self.dim)
        self.chi = psi if c.chi == "auto" else float(c.chi)
        self.radius = c.radius_factor * c.lr * math.sqrt(c.escape_steps) * psi if c.radius == "auto" else c.radius
        self.escape: dict[str, Any] | None = None  # {"anchor", "point", "round", "tau"} while escaping
        self.stats = {"attempts": 0, "escapes": 0, "rounds": 0}

    # ------------------------------------------------------------------ one PSGD step
    def step(self, t: int) -> dict[str, float]:
        if self.done:
            return {}
        esc = self.escape
        at = self.x if esc is None else esc["point"]
        g = self.oracle.query(at, force_refresh=esc is not None and esc["tau"] == 0)
        if g is None:  # the data or privacy budget is spent
            self.finish(self.x if esc is None else esc["anchor"], certified=False)
        elif esc is None:
            self._normal(g)
        else:
            self._escape_step(esc, g)
        return {
            **self.oracle_logs(g),
            **{k: float(v) for k, v in self.stats.items()},
            "escaping": float(esc is not None),
        }

    def _normal(self, g: torch.Tensor) -> None:
        if float(g.norm()) <= 3 * self.chi:  # a candidate SOSP: try to escape from it
            self.stats["attempts"] += 1
            self.escape = {"anchor": self.x.clone(), "point": self.x.clone(), "round": 1, "tau": 0}
            self.stats["rounds"] += 1
            return
        self.x = self.x - self.config.lr * g
        self.set_model(self.x)

    def _escape_step(self, esc: dict[str, Any], g: torch.Tensor) -> None:
        c = self.config
        esc["point"] = esc["point"] - c.lr * g
        esc["tau"] += 1
        if float((esc["point"] - esc["anchor"]).norm()) >= self.radius:  # escaped: continue from there
            self.stats["escapes"] += 1
            self.x, self.escape = esc["point"], None
            self.set_model(self.x)
        elif esc["tau"] >= c.escape_steps:
            if esc["round"] >= c.escape_rounds:  # no round escaped: x̃ is certified
                self.escape = None
                self.finish(esc["anchor"], certified=True)
            else:  # restart from x̃ (the next query refreshes the oracle there)
                esc.update(point=esc["anchor"].clone(), round=esc["round"] + 1, tau=0)
                self.stats["rounds"] += 1

    def finalize(self) -> None:
        if not self.done:  # the step schedule ended first
            self.finish(self.x if self.escape is None else self.escape["anchor"], certified=False)

    def hyperparameters(self) -> dict[str, Any]:
        out = super().hyperparameters()
        if hasattr(self, "chi"):
            out.update(chi_used=self.chi, radius_used=self.radius)  # public: from the calibration
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "escape": self.escape, "stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.escape, self.stats = state["escape"], dict(state["stats"])
