"""The Ada-DP-SPIDER gradient oracle (drift-triggered SPIDER with DP noise), on one or many clients.

Each query at a point ``x`` returns a private estimate ``ĝ`` of the gradient of the (mean over
clients of the) empirical risk:

* **O1 (refresh)** — the noisy mean of per-sample gradients clipped at ``G`` on a batch of expected
  size ``b1``; then the drift is reset to 0;
* **O2 (increment)** — ``ĝ ← ĝ + `` the noisy mean of per-sample differences
  ``∇f(x; z) − ∇f(x_prev; z)`` on a batch of expected size ``b2``, clipped at the step-proportional
  threshold ``min(cap, M̂·‖x − x_prev‖)`` (a function of released points only);
* **reuse** — a query at the previous point returns the previous estimate (no data, no noise).

Before each query the server adds ``‖x − x_prev‖²`` to the drift (so a jump back to an escape
point counts too) and refreshes once the drift reaches ``κ`` (and, for the Liu et al.
reconstruction, every ``period`` queries or on demand). ``refresh_only`` makes every query an O1:
DP-SGD's oracle.

Batches and accounting (``sampling``):

* ``"disjoint"`` (the paper's argument): every record of a client draws a secret uniform arrival
  time per pass; each query takes the records whose time falls in the next window of width
  ``b/n`` of the pass. Adding, removing or replacing one record changes one window only, so
  each record is in at most one release per pass: a :class:`~privopt.privacy.ParallelLedger`
  charges one Gaussian per pass, whatever the number of O1 and O2 queries (they share one
  noise multiplier). The number of refreshes, chosen from released values, does not enter the
  guarantee at all; ``epochs`` passes are composed.
* ``"poisson"``: each query samples every record independently (rate ``b/n``) and the releases
  compose with amplification. The number of O1 queries depends on released values, so the run is
  certified by the RDP filter (``PrivacyLedger(mode="filter")``, valid under fully adaptive
  composition): the noise is calibrated for a nominal schedule (``refresh_share`` of the queries
  being O1) and the run stops when the filter refuses a query. With ``refresh_only`` the schedule
  is fixed (DP-SGD) and a plain plan ledger certifies it.

Either way a query stops the run (returns ``None``) when the data budget (``epochs`` passes) or
the privacy budget would be exceeded. Each client noises its own messages (local trust, ICRL-DP,
:mod:`privopt.algorithms.federation`) or sends clipped sums to a trusted aggregator that adds the
noise once (central trust). See docs/algorithms/sosp.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from privopt.algorithms.releases import Fixed, Phase, PoissonBatch, Query, ReleasePlan, StepProportional
from privopt.errors import ConfigError
from privopt.grads.flat import params_from_flat, zero_flat
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import BoundedSum, chunked_clipped_sum
from privopt.privacy import FullBatch, Inventory

__all__ = ["OracleSettings", "AdaDPSpiderOracle", "PassWindows", "oracle_plan", "oracle_inventory", "SAMPLINGS"]

SAMPLINGS = ("disjoint", "poisson")
STOP, REFRESH, CORRECT, REUSE = 0, 1, 2, 3
NEW_PASS = 4  # added to a decision code: the query starts a new pass over the data
_TOL = 1e-9


@dataclass(frozen=True)
class OracleSettings:
    """What an oracle needs from its algorithm's config (see :class:`AdaDPSpiderOracle`)."""

    b1: int
    b2: int
    clip: float
    gamma: float | None
    clip_diff_cap: float | None
    kappa: float | None
    sampling: str = "disjoint"
    epochs: float = 1.0
    refresh_share: float = 0.1
    period: int | None = None
    refresh_only: bool = False
    chunk: int = 1024

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.sampling == "disjoint" and float(self.epochs) != int(self.epochs):
            raise ConfigError(f"disjoint sampling makes whole passes: epochs must be an integer, got {self.epochs}")

    def rates(self, n_client: int) -> tuple[float, float]:
        """Window widths / Poisson rates of O1 and O2 for the smallest client's ``n_client`` records."""
        if max(self.b1, self.b2) > n_client:
            raise ConfigError(f"batch sizes b1={self.b1}, b2={self.b2} exceed the smallest client's {n_client} records")
        return self.b1 / n_client, self.b2 / n_client

    def thresholds(self):
        return Fixed(self.clip), StepProportional(self.gamma, self.clip_diff_cap)


@dataclass(frozen=True)
class PassWindows:
    """The batches of ``disjoint`` sampling: windows of a pass over a client's ``n`` records. Each
    record is in at most one window of a pass, so a whole pass is accounted as one full-batch
    Gaussian (parallel composition). The oracle draws the windows itself."""

    n: int

    @property
    def sampling(self) -> FullBatch:
        return FullBatch()

    @property
    def normalizer(self) -> float:
        return float(self.n)

    def sampler(self, rng):
        raise ConfigError("the Ada-DP-SPIDER oracle draws the windows of a pass itself")


def oracle_plan(settings: OracleSettings, n_client: int) -> ReleasePlan:
    """The release plan of one client (local trust) or of the aggregator (central trust).

    ``disjoint``: one phase per pass whose family ``"pass"`` covers every O1 and O2 window of the
    pass (O1 at ``clip``, O2 at the step-proportional threshold, one noise multiplier), composed in
    parallel; ``poisson``: O1 and O2 on Poisson batches, their counts a nominal schedule
    (``refresh_share`` of the queries are O1) that fixes the RDP filter's order; ``refresh_only``
    with ``poisson``: a fixed schedule of O1 steps (DP-SGD).

    Example:
        >>> s = OracleSettings(b1=100, b2=10, clip=1.0, gamma=3.0, clip_diff_cap=0.1, kappa=1.0,
        ...                    sampling="poisson", epochs=2, refresh_share=0.5)
        >>> plan = oracle_plan(s, 1000)
        >>> plan.composition, [(p.name, p.count) for p in plan.phases]
        ('filter', [('refresh', 19), ('increment', 17)])
    """
    f1, f2 = settings.rates(n_client)
    epochs = float(settings.epochs)
    o1_thr, o2_thr = settings.thresholds()
    if settings.sampling == "disjoint":
        windows = Query("pass", o1_thr, batch=PassWindows(n_client))
        return ReleasePlan((Phase("pass", int(epochs), (windows,)),), composition="parallel")
    o1 = Query("o1", o1_thr, batch=PoissonBatch(settings.b1, n_client))
    if settings.refresh_only:
        return ReleasePlan((Phase("refresh", _count(epochs / f1), (o1,)),))
    share = settings.refresh_share
    nominal = epochs / (share * f1 + (1 - share) * f2)
    k1 = max(1, math.ceil(share * nominal))
    k2 = max(1, math.floor(nominal - k1))
    o2 = Query("o2", o2_thr, batch=PoissonBatch(settings.b2, n_client))
    return ReleasePlan((Phase("refresh", k1, (o1,)), Phase("increment", k2, (o2,))), composition="filter")


def oracle_inventory(settings: OracleSettings, n_client: int) -> Inventory:
    """The accounting inventory of :func:`oracle_plan`."""
    return oracle_plan(settings, n_client).inventory()


def _declared_samplings(plan: ReleasePlan) -> dict[str, Any]:
    """The accounted sampling of O1 and O2 releases, as the plan declares them."""
    if plan.composition == "parallel":
        return dict.fromkeys(("o1", "o2"), plan.phase("pass").query("pass").batch.sampling)
    out = {q.name: q.batch.sampling for p in plan.phases for q in p.queries}
    return {"o1": out["o1"], "o2": out.get("o2", out["o1"])}


def _count(x: float) -> int:
    return max(1, math.floor(x + _TOL))


class AdaDPSpiderOracle:
    """The oracle over a :class:`~privopt.algorithms.federation.Federation` (m = 1: one machine).

    Args:
        federation: the clients of this process and the communicator.
        settings: batch sizes, thresholds, trigger, sampling and budget.
        model, loss_fn, engine: for per-sample gradients (the model's parameters are never read:
            points are flat vectors).
        noise: calibrated multipliers (``"pass"`` for disjoint sampling, else ``"o1"``/``"o2"``).
        private: ``False`` makes the same clipped queries without noise or ledgers.
    """

    def __init__(self, federation, settings: OracleSettings, *, model, loss_fn, engine, noise, private: bool):
        self.fed, self.s, self.private = federation, settings, private
        self._model, self._loss, self._engine = model, loss_fn, engine
        z = noise.get("pass") if settings.sampling == "disjoint" else None
        self.z = {"o1": z or noise.get("o1", 1.0), "o2": z or noise.get("o2", noise.get("o1", 1.0))}
        self.n_client = min(federation.shard_sizes)
        self.f = dict(zip(("o1", "o2"), settings.rates(self.n_client)))
        self._thr = dict(zip(("o1", "o2"), settings.thresholds()))
        self._sampling = _declared_samplings(oracle_plan(settings, self.n_client))
        # Server state (replicated on every rank; decisions come from the server).
        self.prev: torch.Tensor | None = None
        self.estimate: torch.Tensor | None = None
        self.drift = 0.0
        self.cursor, self.passes, self.since_refresh = 1.0, 0, 0
        self.counts = {"o1": 0, "o2": 0, "reuse": 0}
        self.exhausted = False
        # Client state: own estimate (local trust) and arrival times of the current pass.
        self.client_estimates: dict[int, torch.Tensor] = {}
        self.arrivals: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------ public facts
    @property
    def epochs_used(self) -> float:
        """Data consumed so far, in passes (expected batch sizes: public)."""
        return self.counts["o1"] * self.f["o1"] + self.counts["o2"] * self.f["o2"]

    def noise_std(self) -> float:
        """Per-coordinate std of the privacy noise in an O1 estimate as the server sees it (public)."""
        if not self.private:
            return 0.0
        m, per_client = self.fed.num_clients, self.z["o1"] * self.s.clip / self.s.b1
        return per_client / (math.sqrt(m) if self.fed.trust == "local" else m)

    def noise_magnitude(self, dim: int) -> float:
        """ψ̂ = sqrt(σ̂² + r²·d): sampling std bound ``G/sqrt(m·b1)`` and privacy noise ``r`` of O1."""
        sampling = self.s.clip / math.sqrt(self.fed.num_clients * self.s.b1)
        return math.sqrt(sampling**2 + self.noise_std() ** 2 * dim)

    # ------------------------------------------------------------------ the server's decision
    def _decide(self, distance: float, force_refresh: bool) -> int:
        s = self.s
        refresh = (
            self.estimate is None
            or s.refresh_only
            or force_refresh
            or (s.kappa is not None and self.drift + distance**2 >= s.kappa)
            or (s.period is not None and self.since_refresh >= s.period)
        )
        if not refresh and distance == 0.0:
            return REUSE
        kind = "o1" if refresh else "o2"
        new_pass = s.sampling == "disjoint" and self.cursor + self.f[kind] > 1.0 + _TOL
        if new_pass and self.passes >= int(s.epochs):
            return STOP
        if s.sampling == "poisson" and self.epochs_used + self.f[kind] > s.epochs * (1 + _TOL):
            return STOP
        if self.private and not self._affordable(kind, new_pass):
            return STOP
        return (REFRESH if refresh else CORRECT) + (NEW_PASS if new_pass else 0)

    def _affordable(self, kind: str, new_pass: bool) -> bool:
        ledger = self.fed.server_ledger
        if self.s.sampling == "disjoint":
            return not new_pass or ledger.fits_pass()
        if ledger.filter is not None:
            return ledger.filter.fits(self._step(kind))
        return True  # a fixed schedule: the data budget above is the plan

    def _step(self, kind: str):
        from privopt.privacy import Gaussian, Step

        return Step(self._sampling[kind], (Gaussian(self.z[kind], name=kind),))

    # ------------------------------------------------------------------ a query
    def query(self, x: torch.Tensor, *, force_refresh: bool = False) -> torch.Tensor | None:
        """The private gradient estimate at ``x`` (a flat vector), or ``None`` once a budget is spent."""
        if self.exhausted:
            return None
        distance = 0.0 if self.prev is None else float((x - self.prev).norm())
        code = self.fed.decide(self._decide(distance, force_refresh) if self.fed.is_server else 0)
        action = code % NEW_PASS
        if action == STOP:
            self.exhausted = True
            return None
        self.drift += distance**2
        if code >= NEW_PASS:
            self._begin_pass()
        if action == REUSE:
            self.counts["reuse"] += 1
            return self.estimate
        kind = "o1" if action == REFRESH else "o2"
        window = self._advance(kind)
        messages = [self._message(c, kind, x, distance, window) for c in self.fed.clients]
        total = self.fed.sum(messages)
        if self.fed.trust == "local":
            value = total / self.fed.num_clients
        else:
            value = total / (self.f[kind] * self.fed.n_total)
            value = value if kind == "o1" else self.estimate + value
        self.estimate, self.prev = value, x.detach().clone()
        self.counts[kind] += 1
        self.since_refresh = 0 if kind == "o1" else self.since_refresh + 1
        if kind == "o1":
            self.drift = 0.0
        return value

    def _begin_pass(self) -> None:
        self.cursor, self.passes = 0.0, self.passes + 1
        for c in self.fed.clients:
            self.arrivals[c.index] = c.sampler_rng.uniform(c.n)
        if self.private:
            for ledger in self._ledgers():
                ledger.begin_pass()

    def _ledgers(self) -> list:
        if self.fed.trust == "central":
            return [self.fed.aggregator_ledger] if self.fed.aggregator_ledger is not None else []
        return [c.ledger for c in self.fed.clients]

    def _advance(self, kind: str) -> tuple[float, float] | None:
        if self.s.sampling != "disjoint":
            return None
        lo = self.cursor
        self.cursor = lo + self.f[kind]
        return lo, self.cursor

    # ------------------------------------------------------------------ one client's message
    def _batch(self, client, kind: str, window) -> torch.Tensor:
        if window is None:
            return torch.nonzero(client.sampler_rng.uniform(client.n) < self.f[kind]).squeeze(1)
        u = self.arrivals[client.index]
        return torch.nonzero((u >= window[0]) & (u < window[1])).squeeze(1)

    def _statistic(self, client, kind: str, idx, x, threshold: float) -> BoundedSum:
        if idx.numel() == 0:
            return BoundedSum(zero_flat(self._model), bound=threshold)
        prev = params_from_flat(self._model, self.prev) if kind == "o2" else None
        return chunked_clipped_sum(
            self._engine, self._model, self._loss, client.x[idx], client.y[idx], clip=threshold,
            chunk=self.s.chunk, params=params_from_flat(self._model, x), params_prev=prev,
        )  # fmt: skip

    def _message(self, client, kind: str, x, distance: float, window) -> torch.Tensor:
        threshold = self._thr[kind].threshold(distance if kind == "o2" else None)
        stat = self._statistic(client, kind, self._batch(client, kind, window), x, threshold)
        sampling = self._sampling[kind]
        if self.fed.trust == "central":
            if client.index != 0:
                return stat.value  # to the trusted aggregator, which noises the total once
            ledger = self.fed.aggregator_ledger if self.private else None
            batch = PrivateBatch(ledger, sampling, {kind: self.z[kind]}, rng=client.noise_rng)
            return batch.gaussian(kind, stat, normalizer=1.0)
        ledger = client.ledger if self.private else None
        batch = PrivateBatch(ledger, sampling, {kind: self.z[kind]}, rng=client.noise_rng)
        noisy_mean = batch.gaussian(kind, stat, normalizer=self.f[kind] * client.n)
        before = self.client_estimates.get(client.index)
        own = noisy_mean if kind == "o1" else before + noisy_mean
        self.client_estimates[client.index] = own
        return own

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """SECRET (arrival times are sampling randomness): for checkpoints only."""
        keys = ("prev", "estimate", "drift", "cursor", "passes", "since_refresh", "exhausted")
        return {
            **{k: getattr(self, k) for k in keys},
            "counts": dict(self.counts),
            "client_estimates": dict(self.client_estimates),
            "arrivals": dict(self.arrivals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in ("prev", "estimate", "drift", "cursor", "passes", "since_refresh", "exhausted"):
            setattr(self, k, state[k])
        self.counts = dict(state["counts"])
        self.client_estimates = dict(state["client_estimates"])
        self.arrivals = dict(state["arrivals"])
