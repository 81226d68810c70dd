"""Randomness for privacy noise and batch sampling: secret by default, seeded only on request.

A DP guarantee holds only if the attacker cannot predict the noise or the batches. privopt draws
both from a :class:`RandomSource`:

* :class:`SecureSource` (the default): AES-256 in counter mode (the ``cryptography`` package)
  keyed from OS entropy. Its key is never written to a record; a checkpoint that stores the
  source's state holds the key and is as secret as the training data itself.
* :class:`TorchSource`: a seeded ``torch.Generator`` (Mersenne Twister), for reproducible
  research runs only (``insecure_seed``). Anyone who knows the seed can replay the noise.

Both implement the same small interface, so samplers and noisy releases never know which one
they use. See ``docs/privacy.md`` for the threat model.

Example:
    >>> src = TorchSource(seed=0)
    >>> src.normal((3,)).shape
    torch.Size([3])
    >>> sec = SecureSource()
    >>> bool((sec.uniform((1000,)) < 1).all())
    True
    >>> sorted(sec.randperm(5).tolist())
    [0, 1, 2, 3, 4]
"""

from __future__ import annotations

import abc
import math
import os
from collections.abc import Sequence
from typing import Any, ClassVar, Union

import numpy as np
import torch

from privopt.errors import ConfigError

__all__ = ["RandomSource", "SecureSource", "TorchSource", "as_source", "make_sources"]

Shape = Union[int, Sequence[int]]


def _shape(shape: Shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


class RandomSource(abc.ABC):
    """What samplers and noisy releases draw from."""

    secure: ClassVar[bool] = False

    @abc.abstractmethod
    def normal(
        self, shape: Shape, *, dtype: torch.dtype = torch.float32, device: torch.device | None = None
    ) -> torch.Tensor:
        """Standard normal samples of the given shape."""

    @abc.abstractmethod
    def uniform(self, shape: Shape) -> torch.Tensor:
        """Uniform samples in ``[0, 1)`` (float32 or float64, implementation's choice)."""

    @abc.abstractmethod
    def randint(self, high: int, shape: Shape) -> torch.Tensor:
        """Uniform integers in ``[0, high)`` (int64)."""

    @abc.abstractmethod
    def randperm(self, n: int) -> torch.Tensor:
        """A uniformly random permutation of ``0..n-1`` (int64)."""

    @abc.abstractmethod
    def binomial(self, count: int, prob: float, size: int) -> torch.Tensor:
        """``size`` independent Binomial(count, prob) draws (int64)."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Resumable state (SECRET for :class:`SecureSource`: it contains the key)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class TorchSource(RandomSource):
    """A seeded ``torch.Generator``: reproducible, NOT secret. For research runs that opt in.

    Args:
        seed: the generator seed (anyone who knows it can replay every draw).
        generator: wrap an existing generator instead of seeding a new one.
    """

    secure = False

    def __init__(self, seed: int | None = None, *, generator: torch.Generator | None = None):
        if (seed is None) == (generator is None):
            raise ConfigError("TorchSource needs exactly one of seed / generator")
        self.generator = generator if generator is not None else torch.Generator().manual_seed(int(seed))

    def normal(self, shape, *, dtype=torch.float32, device=None):
        return torch.randn(_shape(shape), generator=self.generator, dtype=dtype).to(device or "cpu")

    def uniform(self, shape):
        return torch.rand(_shape(shape), generator=self.generator)

    def randint(self, high, shape):
        return torch.randint(int(high), _shape(shape), generator=self.generator)

    def randperm(self, n):
        return torch.randperm(int(n), generator=self.generator)

    def binomial(self, count, prob, size):
        return torch.binomial(
            torch.full((int(size),), float(count)), torch.full((int(size),), float(prob)), generator=self.generator
        ).to(torch.int64)

    def state_dict(self):
        return {"kind": "torch", "state": self.generator.get_state()}

    def load_state_dict(self, state):
        if state.get("kind") != "torch":
            raise ConfigError(f"cannot restore a {state.get('kind')!r} random state into a seeded torch source")
        self.generator.set_state(state["state"])


class SecureSource(RandomSource):
    """AES-256-CTR keystream keyed from OS entropy (a cryptographically secure generator).

    Uniforms use 53 random bits; normals use the Box–Muller transform in float64 (tails reach
    ≈ 8.6 standard deviations; the float64 → float32 cast is the only rounding).

    Args:
        key: 32 bytes; default ``os.urandom(32)``. Pass one only to restore a checkpoint.
    """

    secure = True
    _BLOCK = 16

    def __init__(self, key: bytes | None = None, *, block: int = 0):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self._key = os.urandom(32) if key is None else bytes(key)
        if len(self._key) != 32:
            raise ConfigError("SecureSource key must be 32 bytes")
        self._block = int(block)
        self._cipher = Cipher(algorithms.AES(self._key), modes.CTR(self._block.to_bytes(16, "big")))
        self._enc = self._cipher.encryptor()

    def _bytes(self, n: int) -> bytes:
        n = -(-n // self._BLOCK) * self._BLOCK  # whole blocks keep the counter state exact
        self._block += n // self._BLOCK
        return self._enc.update(bytes(n))

    def _u64(self, count: int) -> np.ndarray:
        return np.frombuffer(self._bytes(8 * count), dtype=np.uint64)[:count]

    def _uniform64(self, count: int) -> np.ndarray:
        return (self._u64(count) >> np.uint64(11)).astype(np.float64) * (2.0**-53)

    def normal(self, shape, *, dtype=torch.float32, device=None):
        shp = _shape(shape)
        count = math.prod(shp)
        m = (count + 1) // 2
        u = torch.from_numpy(self._uniform64(2 * m))
        radius = torch.sqrt(-2.0 * torch.log1p(-u[:m]))  # 1 - u in (0, 1]: log is finite
        theta = (2.0 * math.pi) * u[m:]
        z = torch.cat([radius * torch.cos(theta), radius * torch.sin(theta)])[:count]
        return z.reshape(shp).to(dtype=dtype, device=device or "cpu")

    def uniform(self, shape):
        shp = _shape(shape)
        return torch.from_numpy(self._uniform64(math.prod(shp))).reshape(shp)

    def randint(self, high, shape):
        high = int(high)
        if high < 1:
            raise ConfigError(f"randint needs high >= 1, got {high}")
        shp = _shape(shape)
        count = math.prod(shp)
        limit = np.uint64((2**64 // high) * high - 1)  # rejection keeps the draw exactly uniform
        out = np.empty(count, dtype=np.uint64)
        filled = 0
        while filled < count:
            r = self._u64(count - filled)
            r = r[r <= limit]
            out[filled : filled + r.size] = r
            filled += r.size
        return torch.from_numpy((out % np.uint64(high)).astype(np.int64)).reshape(shp)

    def randperm(self, n):
        n = int(n)
        while True:
            keys = self._u64(n)
            if np.unique(keys).size == n:  # ties (probability ~n²/2^65) would bias argsort
                return torch.from_numpy(np.argsort(keys, kind="stable").astype(np.int64))

    def binomial(self, count, prob, size):
        from scipy.stats import binom

        u = self._uniform64(int(size))
        return torch.from_numpy(binom.ppf(u, int(count), float(prob)).astype(np.int64))

    def state_dict(self):
        return {"kind": "secure-aes-ctr", "key": self._key, "block": self._block}

    def load_state_dict(self, state):
        if state.get("kind") != "secure-aes-ctr":
            raise ConfigError(f"cannot restore a {state.get('kind')!r} random state into a secure source")
        self.__init__(key=state["key"], block=state["block"])


def as_source(rng: RandomSource | torch.Generator) -> RandomSource:
    """Accept a :class:`RandomSource` or a plain ``torch.Generator`` (wrapped, insecure)."""
    if isinstance(rng, RandomSource):
        return rng
    if isinstance(rng, torch.Generator):
        return TorchSource(generator=rng)
    raise ConfigError(f"expected a RandomSource or torch.Generator, got {type(rng).__name__}")


def make_sources(*, insecure_seed: int | None = None) -> dict[str, RandomSource]:
    """The two sources of a run: ``"noise"`` (privacy noise) and ``"sampler"`` (batches).

    Default: two independent :class:`SecureSource`. With ``insecure_seed`` both are seeded
    torch generators derived from it (reproducible by anyone who reads the seed).

    Example:
        >>> s = make_sources(insecure_seed=0)
        >>> type(s["noise"]).__name__, s["noise"].secure
        ('TorchSource', False)
    """
    if insecure_seed is None:
        return {"noise": SecureSource(), "sampler": SecureSource()}
    if isinstance(insecure_seed, bool) or not isinstance(insecure_seed, (int, np.integer)) or insecure_seed < 0:
        raise ConfigError(f"insecure_seed must be a non-negative integer, got {insecure_seed!r}")
    s = int(insecure_seed)
    return {"noise": TorchSource(s * 1_000_003 + 17), "sampler": TorchSource(s * 1_000_003 + 29)}
