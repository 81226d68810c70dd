"""The clients of a federated run: their shards, randomness and ledgers, and how messages are combined.

A run with ``clients = m`` splits the training set into m disjoint shards (IID or label-sorted,
:func:`privopt.data.splits.shard_by_label`, with the run's public seed) and gives client ``j``:

* its shard (the records it holds; the split simulates data that already sits with m parties);
* its own noise and sampling sources (:func:`privopt.distributed.client_sources`);
* in **local** trust mode (each client privatises its own messages, the paper's ICRL-DP), its own
  privacy ledger: every client spends its budget on its own records;

and combines their messages through a :class:`~privopt.distributed.Communicator`: all clients in
this process (the single-process simulator and single-machine runs) or one client per
``torchrun`` process. In **central** trust mode (a trusted aggregator, as Opacus' DDP) clients
send un-noised clipped sums and the aggregator — co-located with client 0, the server — adds the
noise once to their sum and holds the one ledger.

The split itself is the data layer's (:func:`privopt.data.splits.client_shards`); the training
builder hands it to the algorithm as ``ctx.extra["client_split"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from privopt.distributed import Communicator, LocalComm, client_sources
from privopt.errors import ConfigError
from privopt.privacy import ledger_from_dict
from privopt.rng import RandomSource

__all__ = ["Client", "Federation", "build_federation", "TRUST_MODES"]

TRUST_MODES = ("local", "central")


@dataclass
class Client:
    """One client held by this process.

    Attributes:
        index: the client's id ``j`` (0 is the server's).
        x, y: its shard of the training set.
        noise_rng, sampler_rng: its own randomness (secret unless the run is insecurely seeded).
        ledger: its privacy ledger (local trust mode), else ``None``.
    """

    index: int
    x: torch.Tensor
    y: torch.Tensor
    noise_rng: RandomSource
    sampler_rng: RandomSource
    ledger: Any = None
    own: bool = False  # uses the run's own sources and ledger (checkpointed by the training loop)

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    def state_dict(self) -> dict[str, Any]:
        """SECRET (holds the generator keys): for checkpoints only."""
        return {
            "noise_rng": self.noise_rng.state_dict(),
            "sampler_rng": self.sampler_rng.state_dict(),
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise_rng.load_state_dict(state["noise_rng"])
        self.sampler_rng.load_state_dict(state["sampler_rng"])
        if state["ledger"] is not None:
            self.ledger = ledger_from_dict(state["ledger"])


class Federation:
    """The clients of this process, the total number of clients and the communicator.

    Args:
        clients: the clients this process holds (all of them in the simulator, one per process
            under torchrun), in increasing index order.
        num_clients: m, the number of clients of the run.
        shard_sizes: every client's shard size (public), by client index.
        trust: ``"local"`` or ``"central"``.
        comm: the communicator (:class:`~privopt.distributed.LocalComm` when all are here).
        aggregator_ledger: the central ledger (central mode, on the server), else ``None``.
    """

    def __init__(
        self,
        clients: list[Client],
        *,
        num_clients: int,
        shard_sizes: list[int],
        trust: str,
        comm: Communicator,
        aggregator_ledger: Any = None,
    ):
        if trust not in TRUST_MODES:
            raise ConfigError(f"trust mode must be one of {TRUST_MODES}, got {trust!r}")
        self.clients, self.num_clients, self.trust, self.comm = clients, num_clients, trust, comm
        self.shard_sizes = list(shard_sizes)
        self.aggregator_ledger = aggregator_ledger

    @property
    def is_server(self) -> bool:
        return self.comm.is_server

    @property
    def n_total(self) -> int:
        return sum(self.shard_sizes)

    @property
    def server_ledger(self) -> Any:
        """The ledger the server consults before each query: the aggregator's, or (local mode)
        client 0's — every client's ledger sees the same sequence of steps."""
        return self.aggregator_ledger if self.trust == "central" else self.clients[0].ledger

    def sum(self, messages: list[torch.Tensor]) -> torch.Tensor:
        """Σ over all m clients of their messages."""
        return self.comm.sum(messages)

    def decide(self, code: int) -> int:
        """The server's decision (an int) on every rank."""
        return int(self.comm.broadcast(torch.tensor([int(code)], dtype=torch.int64))[0])

    def state_dict(self) -> dict[str, Any]:
        """SECRET: the simulated clients' generator keys and ledgers (the run's own client's are
        the run's sources and ledger, which the training loop checkpoints)."""
        return {"clients": {c.index: c.state_dict() for c in self.clients if not c.own}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for c in self.clients:
            if not c.own:
                c.load_state_dict(state["clients"][c.index])


def _shards(ctx, *, clients: int, split: str) -> list[torch.Tensor]:
    if clients == 1:
        return [torch.arange(ctx.n)]
    split_fn = ctx.extra.get("client_split")
    if split_fn is None:
        raise ConfigError("a run with several clients needs the data layer's client split (ctx.extra['client_split'])")
    return split_fn(ctx.y_train, clients=clients, split=split, seed=int(ctx.extra.get("seed", 0)))


def build_federation(ctx, *, clients: int, split: str, trust: str, private: bool) -> Federation:
    """The run's federation from its context (``ctx.extra``: ``"comm"``, ``"client_split"``, ``"seed"``,
    ``"insecure_seed"``).

    Client 0 (or, under torchrun, this rank's client) uses the run's own sources and ledger;
    the simulator gives clients ``1..m-1`` their own (:func:`~privopt.distributed.client_sources`)
    and fresh copies of the run's ledger.
    """
    comm = ctx.extra.get("comm") or LocalComm()
    if comm.world_size not in (1, clients):
        raise ConfigError(
            f"the run has {clients} clients but was launched with {comm.world_size} processes: use "
            f"torchrun --nproc_per_node={clients} (or no torchrun at all, to simulate them in one process)"
        )
    shards = _shards(ctx, clients=clients, split=split)
    mine = [comm.rank] if comm.world_size > 1 else list(range(clients))
    local_ledgers = private and trust == "local"
    held = []
    for j in mine:
        if j == comm.rank:  # the run's own sources and ledger
            sources = {"noise": ctx.noise_rng, "sampler": ctx.sampler_rng}
            ledger = ctx.ledger
        else:
            sources = client_sources(ctx.extra.get("insecure_seed"), j)
            ledger = ledger_from_dict(ctx.ledger.to_dict()) if local_ledgers else None
        idx = shards[j]
        held.append(
            Client(j, ctx.x_train[idx], ctx.y_train[idx], sources["noise"], sources["sampler"],
                   ledger if local_ledgers else None, own=j == comm.rank)
        )  # fmt: skip
    aggregator = ctx.ledger if (private and trust == "central" and comm.is_server) else None
    return Federation(
        held,
        num_clients=clients,
        shard_sizes=[len(s) for s in shards],
        trust=trust,
        comm=comm,
        aggregator_ledger=aggregator,
    )
