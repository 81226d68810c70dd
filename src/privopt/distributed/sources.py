"""Each client's own noise and sampling randomness.

Client 0 uses the run's sources (so a one-client run draws exactly what a single-machine run
draws); client ``j >= 1`` gets its own. With secret randomness every client's sources are fresh
:class:`~privopt.rng.SecureSource` objects; with an ``insecure_seed`` they are seeded from
``(seed, j)``, identically in the single-process simulator and in the ``torchrun`` process of
client ``j``, which is what makes the two give the same model.

Example:
    >>> a, b = client_sources(7, 1), client_sources(7, 1)
    >>> bool((a["noise"].normal((3,)) == b["noise"].normal((3,))).all())
    True
    >>> client_sources(None, 1)["noise"].secure
    True
"""

from __future__ import annotations

import numpy as np

from privopt.errors import ConfigError
from privopt.rng import RandomSource, SecureSource, TorchSource, make_sources

__all__ = ["client_sources"]


def client_sources(insecure_seed: int | None, client: int) -> dict[str, RandomSource]:
    """The ``"noise"`` and ``"sampler"`` sources of client ``client``."""
    if isinstance(client, bool) or not isinstance(client, int) or client < 0:
        raise ConfigError(f"client index must be an integer >= 0, got {client!r}")
    if client == 0:
        return make_sources(insecure_seed=insecure_seed)
    if insecure_seed is None:
        return {"noise": SecureSource(), "sampler": SecureSource()}
    noise, sampler = np.random.SeedSequence([int(insecure_seed), client]).generate_state(2, dtype=np.uint32)
    return {"noise": TorchSource(int(noise)), "sampler": TorchSource(int(sampler))}
