"""Communication between the clients of a federated run: one process per client under ``torchrun``
(``torch.distributed``, gloo on CPU, NCCL where there are GPUs) or all clients in one process.

The algorithms talk to a :class:`Communicator` only (sum the clients' messages, broadcast the
server's decision), so the same code runs simulated and distributed; see
``docs/algorithms/sosp.md`` ("Distributed runs").
"""

from privopt.distributed.comm import Communicator, LocalComm, TorchComm, torchrun_comm, torchrun_world_size
from privopt.distributed.sources import client_sources

__all__ = ["Communicator", "LocalComm", "TorchComm", "client_sources", "torchrun_comm", "torchrun_world_size"]
