"""``dp-spider-sosp``: a RECONSTRUCTION of the baseline of Paper C's experiments (Liu et al.,
"Private (stochastic) non-convex optimization revisited: second-order stationary points and
excess risks"), whose exact algorithm is not in the paper.

What the paper says of it, and what is built from that: a DP SPIDER estimator refreshed on a
fixed period *and* when the drift reaches κ; near a saddle point (a small private gradient,
``‖ĝ‖ ≤ 3χ``) and when not "frozen", a forced refresh plus an extra isotropic Gaussian
perturbation of the same scale as the DP noise of a refresh, followed by a frozen period of
``frozen_steps`` steps without extra noise; the output is the last iterate (its private model
selection by AboveThreshold is not run: the paper compares training curves). The extra
perturbation is data-independent noise added to a released value: post-processing, no privacy
cost. Releases, accounting and clients are the Ada-DP-SPIDER oracle's. See
docs/algorithms/sosp.md ("The Liu et al. baseline").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.ada_dp_spider import OracleSettings
from privopt.algorithms.base import register_algorithm
from privopt.algorithms.config import param, positive, positive_int
from privopt.algorithms.sosp_common import FederatedOptimizer, SpiderConfig

__all__ = ["DPSpiderSOSP", "DPSpiderSOSPConfig"]


@dataclass(frozen=True)
class DPSpiderSOSPConfig(SpiderConfig):
    """The reconstruction's hyper-parameters (not in the paper; the project's choices).

    Attributes:
        period: refresh at least every ``period`` queries (besides the drift trigger κ).
        chi: the small-gradient threshold (perturb when ``‖ĝ‖ ≤ 3χ``).
        frozen_steps: steps without a new perturbation after one.
    """

    period: int = param(32, positive_int, role="phase")
    chi: float = param(0.01, positive)
    frozen_steps: int = param(10, positive_int)


@register_algorithm
class DPSpiderSOSP(FederatedOptimizer):
    """The Liu et al. baseline as reconstructed here (flagged: not the authors' code).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> get_algorithm("dp-spider-sosp", epochs=2, b1=100, b2=20).config.period
        32
    """

    name = "dp-spider-sosp"
    summary = "RECONSTRUCTED baseline of Paper C (Liu et al.): DP SPIDER + perturbation near saddles"
    Config = DPSpiderSOSPConfig

    def oracle_settings(self) -> OracleSettings:
        from dataclasses import replace

        return replace(super().oracle_settings(), period=self.config.period)

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.frozen, self.perturb_next, self.perturbations = 0, False, 0

    def _perturbation(self) -> torch.Tensor:
        """N(0, r²I) with r the per-coordinate std of a refresh's DP noise, drawn by the server and
        broadcast (every client takes the same step)."""
        std = self.oracle.noise_std() or self.chi_scale()
        server = self.fed.clients[0] if self.fed.is_server else None
        noise = server.noise_rng.normal(self.x.shape) * std if server is not None else torch.zeros_like(self.x)
        return self.fed.comm.broadcast(noise)

    def chi_scale(self) -> float:
        """Perturbation std without privacy noise (reference runs): χ per coordinate."""
        return self.config.chi

    def step(self, t: int) -> dict[str, float]:
        if self.done:
            return {}
        g = self.oracle.query(self.x, force_refresh=self.perturb_next)
        if g is None:
            self.finish(self.x, certified=None)
            return self.oracle_logs(None)
        move = g
        if self.perturb_next:
            move = g + self._perturbation()
            self.perturb_next, self.frozen, self.perturbations = False, self.config.frozen_steps, self.perturbations + 1
        elif self.frozen > 0:
            self.frozen -= 1
        elif float(g.norm()) <= 3 * self.config.chi:
            self.perturb_next = True  # the next query refreshes and its step is perturbed
        self.x = self.x - self.config.lr * move
        self.set_model(self.x)
        return {**self.oracle_logs(g), "perturbations": float(self.perturbations)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "frozen": self.frozen, "perturb_next": self.perturb_next,
                "perturbations": self.perturbations}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.frozen, self.perturb_next, self.perturbations = (
            state["frozen"],
            state["perturb_next"],
            state["perturbations"],
        )
