"""Communicators: the sum of every client's message and the server's broadcast.

* :class:`LocalComm` — all clients live in this process (the single-process simulator, and
  single-machine runs): the sum is taken in client order.
* :class:`TorchComm` — one client per process, started by ``torchrun``: ``all_reduce`` (SUM) of
  the messages and ``broadcast`` from rank 0, the server (gloo on CPU).

For two clients the sum is bitwise the same either way (floating-point addition of two numbers is
commutative), which is what the equivalence test of the simulator and ``torchrun`` relies on; for
more clients the all-reduce may add in another order (last-bit differences).

Example:
    >>> import torch
    >>> comm = LocalComm()
    >>> comm.sum([torch.ones(2), torch.ones(2)]).tolist(), comm.rank, comm.world_size
    ([2.0, 2.0], 0, 1)
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import datetime
import hashlib
import os

import torch

from privopt.errors import ConfigError, RunFailed
from privopt.quiet import PEER_FAILED

__all__ = ["Communicator", "LocalComm", "TorchComm", "torchrun_comm", "torchrun_world_size"]

# Collectives wait at most this long for a peer (e.g. while rank 0 evaluates the model).
DEFAULT_TIMEOUT_S = 900
_AT_EXIT = {"wait_for_peers": True}


class Communicator(abc.ABC):
    """What a federated algorithm needs from the transport."""

    rank: int = 0
    world_size: int = 1

    @abc.abstractmethod
    def sum(self, messages: list[torch.Tensor]) -> torch.Tensor:
        """The sum over ALL clients of their messages; ``messages`` are this process's clients' ones."""

    @abc.abstractmethod
    def broadcast(self, value: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``value`` on every rank (the server's decision)."""

    @property
    def is_server(self) -> bool:
        """Whether this process acts as the server (and, in central-noise mode, the aggregator)."""
        return self.rank == 0


class LocalComm(Communicator):
    """Every client in this process."""

    def sum(self, messages: list[torch.Tensor]) -> torch.Tensor:
        if not messages:
            raise ConfigError("nothing to sum: no local client")
        total = messages[0].clone()
        for m in messages[1:]:
            total = total + m
        return total

    def broadcast(self, value: torch.Tensor) -> torch.Tensor:
        return value


class TorchComm(Communicator):
    """One client per process over an initialised ``torch.distributed`` process group."""

    def __init__(self):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialised (launch with torchrun)")
        self._dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def sum(self, messages: list[torch.Tensor]) -> torch.Tensor:
        if len(messages) != 1:
            raise ConfigError(f"a torch.distributed process holds one client, got {len(messages)} messages")
        total = messages[0].detach().clone().contiguous()
        self._collective("sum", lambda: self._dist.all_reduce(total, op=self._dist.ReduceOp.SUM))
        return total

    def broadcast(self, value: torch.Tensor) -> torch.Tensor:
        out = value.detach().clone().contiguous()
        self._collective("broadcast", lambda: self._dist.broadcast(out, src=0))
        return out

    def _collective(self, what: str, run) -> None:
        try:
            run()
        except RuntimeError as e:  # gloo: a peer's connection closed, or the timeout passed
            raise RunFailed(
                f"client process {self.rank}: the {what} {PEER_FAILED}: another process failed, was "
                "stopped or did not answer in time (that process's own error says why)"
            ) from e

    def check_same(self, text: str, *, what: str) -> None:
        """Refuse to go on unless every process was given the same ``text`` (e.g. its config): a
        rank with another seed, ε or step size would send messages the server's record does not
        describe. Every rank raises the same :class:`ConfigError`, before anything is written."""
        mine = torch.tensor(list(hashlib.sha256(text.encode()).digest()), dtype=torch.int32)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        self._collective("comparison of configs", lambda: self._dist.all_gather(every, mine))
        differ = [r for r, d in enumerate(every) if not torch.equal(d, every[0])]
        if differ:
            ranks = ", ".join(map(str, differ))
            raise ConfigError(
                f"the {self.world_size} processes of this torchrun launch were given different {what}s: "
                f"rank(s) {ranks} differ from rank 0; give every process the same {what} and options "
                "(--config, --set, --insecure-seed, --plugin)"
            )

    def leave_at_once(self) -> None:
        """This process failed: at exit it leaves without waiting for the others, which may be blocked
        in a collective it will never join (they fail as soon as its connections close)."""
        _AT_EXIT["wait_for_peers"] = False


def torchrun_world_size() -> int:
    """``WORLD_SIZE`` as set by ``torchrun`` (1 when not launched by it)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} is not an integer") from None


def torchrun_comm(*, device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> TorchComm | None:
    """The communicator of a ``torchrun`` launch with several processes (``None`` otherwise).

    Initialises the default process group from torchrun's environment (gloo for a run on the CPU,
    NCCL for one on CUDA: the backend follows where the messages live, not whether the machine has
    a GPU) and gives each process an equal share of the CPU threads.
    """
    world = torchrun_world_size()
    if world <= 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if str(device).startswith("cuda") and torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        atexit.register(_destroy_process_group)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    return TorchComm()


def _destroy_process_group() -> None:
    # Left to interpreter teardown, gloo's threads can outlive the group and abort the process
    # ("terminate called without an active exception", exit -6) after a run that succeeded.
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    # Leave together: a rank that tears down while another still talks to it aborts. If another
    # rank failed or left already, its error is the one to report. A rank that failed leaves at once:
    # a peer blocked in a collective never reaches the barrier, and the barrier's timeout did not end
    # the wait of a rank other than 0 (gloo, torch 2.13: the run hung until the collectives' timeout).
    if _AT_EXIT["wait_for_peers"]:
        with contextlib.suppress(RuntimeError):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    dist.destroy_process_group()
