"""Shared machinery of the second-order methods (Paper C) and their oracles, on one or many clients.

:class:`FederatedOptimizer` is the base of ``gauss-psgd``, ``dp-spider-sosp``, ``ada-dp-spider``
(plain steps on the Ada-DP-SPIDER oracle) and ``fed-dp-sgd`` (DP-SGD on the same clients): it
builds the run's :class:`~privopt.algorithms.federation.Federation` (``clients``, ``split``,
``trust``), the :class:`~privopt.algorithms.ada_dp_spider.AdaDPSpiderOracle`, keeps the model as a
flat vector, declares the oracle's privacy inventory and stops the run (``done``) when the oracle's
budget is spent or the method returns. Every value it logs is a function of released estimates
or a public count. See docs/algorithms/sosp.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.ada_dp_spider import SAMPLINGS, AdaDPSpiderOracle, OracleSettings, oracle_plan
from privopt.algorithms.base import Algorithm, RunContext, register_algorithm
from privopt.algorithms.config import (
    AlgorithmConfig,
    flag,
    one_of,
    optional_int,
    optional_positive,
    param,
    positive,
    positive_int,
    unit_interval,
)
from privopt.algorithms.federation import TRUST_MODES, build_federation
from privopt.algorithms.releases import ReleasePlan
from privopt.errors import ConfigError
from privopt.grads.flat import flat_params, set_flat_params

__all__ = [
    "FederatedConfig",
    "SpiderConfig",
    "FedDPSGDConfig",
    "FederatedOptimizer",
    "AdaDPSpiderSGD",
    "FedDPSGD",
]


@dataclass(frozen=True)
class FederatedConfig(AlgorithmConfig):
    """What every method of this family has.

    Attributes:
        lr: step size η. epochs: data budget in passes over each client's records (an integer
            with ``sampling="disjoint"``). clip: per-sample threshold G of gradient releases.
        sampling: ``"disjoint"`` (each record once per pass, parallel composition) or
            ``"poisson"`` (subsampled, composed; adaptive schedules use the RDP filter).
        clients, split, trust: m clients holding label-sorted (``"label"``) or IID shards;
            ``"local"`` noise (each client privatises its messages) or ``"central"`` (a trusted
            aggregator noises the sum). ``torchrun --nproc_per_node=m`` runs one client per process.
        max_steps: optional cap on oracle queries. chunk_size: per-sample gradient chunk.
        private: ``False`` makes the same clipped queries without noise (reference runs).
    """

    lr: float = param(1e-3, positive, role="lr")
    epochs: float = param(20, positive, role="epochs")
    clip: float = param(1.0, positive, role="clip")
    sampling: str = param("disjoint", one_of(*SAMPLINGS))
    clients: int = param(1, positive_int)
    split: str = param("label", one_of("label", "iid"))
    trust: str = param("local", one_of(*TRUST_MODES))
    max_steps: int | None = param(None, optional_int)
    chunk_size: int = param(1024, positive_int)
    private: bool = param(True, flag)

    def check(self) -> None:
        if self.sampling == "disjoint" and float(self.epochs) != int(self.epochs):
            raise ConfigError(f"sampling 'disjoint' makes whole passes: epochs must be an integer, got {self.epochs}")


@dataclass(frozen=True)
class SpiderConfig(FederatedConfig):
    """The Ada-DP-SPIDER oracle's settings (the paper's printed κ; batch sizes and thresholds are
    the project's defaults where the paper is silent, docs/algorithms/sosp.md).

    Attributes:
        b1, b2: expected O1 (refresh) and O2 (increment) batch sizes per client.
        gamma: M̂, the O2 threshold per unit of distance (``min(cap, M̂·‖x − x_prev‖)``);
            ``None`` uses the fixed ``clip_diff_cap``.
        clip_diff_cap: cap of the O2 threshold. kappa: drift threshold κ of a refresh.
        refresh_share: with ``sampling="poisson"``, the share of O1 queries of the nominal
            schedule that fixes the RDP filter's order and the calibration.
    """

    b1: int = param(256, positive_int, role="refresh_batch")
    b2: int = param(32, positive_int, role="batch")
    gamma: float | None = param(10.0, optional_positive)
    clip_diff_cap: float | None = param(None, optional_positive, role="clip_cap")
    kappa: float = param(0.1, positive)
    refresh_share: float = param(0.1, unit_interval)

    def check(self) -> None:
        super().check()
        if self.gamma is None and self.clip_diff_cap is None:
            raise ConfigError("the O2 threshold needs gamma (step-proportional) or clip_diff_cap (fixed)")


@dataclass(frozen=True)
class FedDPSGDConfig(FederatedConfig):
    """DP-SGD on the clients: a noisy clipped minibatch gradient (expected size ``batch_size``
    per client) at every step, ``epochs`` passes of data."""

    sampling: str = param("poisson", one_of(*SAMPLINGS))
    lr: float = param(0.1, positive, role="lr")
    batch_size: int = param(64, positive_int, role="batch")


class FederatedOptimizer(Algorithm):
    """Steps on a (federated) private gradient oracle; subclasses implement :meth:`step`."""

    Config = FederatedConfig

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.done = False
        self.certified: bool | None = None

    # ------------------------------------------------------------------ the oracle and its privacy
    def oracle_settings(self) -> OracleSettings:
        c = self.config
        return OracleSettings(
            b1=c.b1, b2=c.b2, clip=c.clip, gamma=c.gamma, clip_diff_cap=c.clip_diff_cap, kappa=c.kappa,
            sampling=c.sampling, epochs=c.epochs, refresh_share=c.refresh_share, chunk=c.chunk_size,
        )  # fmt: skip

    def client_size(self, n: int) -> int:
        """Records of the smallest client when ``n`` are split over ``clients`` (public)."""
        if self.config.clients > n:
            raise ConfigError(f"{self.config.clients} clients need at least as many records, got {n}")
        return n // self.config.clients

    def release_plan(self, n: int) -> ReleasePlan:
        """The releases of each client (local trust) or of the aggregator (central trust) when ``n``
        records are split over the clients: the oracle's plan for the smallest client's shard."""
        return oracle_plan(self.oracle_settings(), self.client_size(n))

    def steps_for(self, *, n: int) -> int:
        """A public bound on oracle queries: every non-reusing query consumes at least the smaller
        batch's share of a pass; reuses happen at most once per escape round."""
        s = self.oracle_settings()
        smallest = min(s.rates(self.client_size(n)))
        bound = 2 * math.ceil(self.config.epochs / smallest) + 2
        return min(bound, self.config.max_steps) if self.config.max_steps else bound

    def num_steps(self) -> int:
        return self.steps_for(n=self._ctx.n)

    def setup(self, ctx: RunContext) -> None:
        c = self.config
        self._ctx = ctx
        self.fed = build_federation(ctx, clients=c.clients, split=c.split, trust=c.trust, private=self.private)
        self.oracle = AdaDPSpiderOracle(
            self.fed, self.oracle_settings(), model=ctx.model, loss_fn=ctx.loss_fn, engine=ctx.engine,
            noise=ctx.noise, private=self.private,
        )  # fmt: skip
        self.x = flat_params(ctx.model).clone()
        self.dim = int(self.x.numel())

    # ------------------------------------------------------------------ the model as a vector
    def set_model(self, flat: torch.Tensor) -> None:
        set_flat_params(self._ctx.model, flat)

    def finish(self, output: torch.Tensor, *, certified: bool | None) -> None:
        """End the run with ``output`` as the released model."""
        self.x, self.done, self.certified = output, True, certified
        self.set_model(output)

    def oracle_logs(self, g: torch.Tensor | None) -> dict[str, float]:
        """Public per-step values: data used, query counts, the drift, ‖ĝ‖ (post-processing)."""
        o = self.oracle
        logs = {"epochs_used": o.epochs_used, "o1": o.counts["o1"], "o2": o.counts["o2"], "drift": o.drift}
        if g is not None:
            logs["est_norm"] = float(g.norm())
        if self.done:  # 1: certified SOSP, 0: not certified, -1: the method does not certify
            logs["certified"] = -1.0 if self.certified is None else float(self.certified)
        return logs

    def descend(self) -> dict[str, float]:
        """One plain step ``x ← x − η·ĝ(x)`` (or the end of the run when the oracle is spent)."""
        g = self.oracle.query(self.x)
        if g is None:
            self.finish(self.x, certified=None)
        else:
            self.x = self.x - self.config.lr * g
            self.set_model(self.x)
        return self.oracle_logs(g)

    def finalize(self) -> None:
        if not self.done:
            self.finish(self.x, certified=self.certified)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "x": self.x,
            "done": self.done,
            "certified": self.certified,
            "oracle": self.oracle.state_dict(),
            "federation": self.fed.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.x, self.done, self.certified = state["x"], state["done"], state["certified"]
        self.oracle.load_state_dict(state["oracle"])
        self.fed.load_state_dict(state["federation"])


@register_algorithm
class AdaDPSpiderSGD(FederatedOptimizer):
    """Plain steps ``x ← x − η·ĝ`` on the Ada-DP-SPIDER oracle (no saddle-point escape).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> inv = get_algorithm("ada-dp-spider", epochs=3, b1=100, b2=10).inventory(n=1000)
        >>> inv.composition, [(s.sampling.kind, s.count) for s in inv.steps]
        ('parallel', [('full', 3)])
    """

    name = "ada-dp-spider"
    summary = "SGD on the drift-triggered DP SPIDER oracle (Paper C Alg. 2), one or many clients"
    Config = SpiderConfig

    def step(self, t: int) -> dict[str, float]:
        return {} if self.done else self.descend()


@register_algorithm
class FedDPSGD(FederatedOptimizer):
    """DP-SGD on one or many clients: each client's noisy clipped minibatch gradient, averaged.

    With ``clients=1`` and ``sampling="poisson"`` it is DP-SGD (Poisson batches, one release per
    step, a fixed schedule certified by the plan ledger).

    Example:
        >>> from privopt.algorithms import get_algorithm
        >>> inv = get_algorithm("fed-dp-sgd", epochs=2, batch_size=50).inventory(n=1000)
        >>> inv.composition, [s.count for s in inv.steps]
        ('plan', [40])
    """

    name = "fed-dp-sgd"
    summary = "DP-SGD over m clients (local or central noise); m = 1 is DP-SGD"
    Config = FedDPSGDConfig

    def oracle_settings(self) -> OracleSettings:
        c = self.config
        return OracleSettings(
            b1=c.batch_size, b2=c.batch_size, clip=c.clip, gamma=None, clip_diff_cap=c.clip, kappa=None,
            sampling=c.sampling, epochs=c.epochs, refresh_only=True, chunk=c.chunk_size,
        )  # fmt: skip

    def step(self, t: int) -> dict[str, float]:
        return {} if self.done else self.descend()
