"""Per-record selection: every keep/drop/split decision about a record depends on that record alone.

Each record gets pseudo-random uniforms from a keyed hash of its own content (feature bytes and
label; BLAKE2b keyed with the public ``seed``). A stage (test carving, validation split, imbalance
subsampling ...) keeps a record iff its uniform for that stage is below a fixed probability. So
adding or removing one record changes every selected split by at most that record: no other
record's decision looks at it. See ``docs/data.md`` ("Selection and the protected unit").

Count-based rules (``max_train``, exact test rebalancing, CIFAR10-ST's ``minority_count``) cannot
have that property; they rank records by the same keyed hash, so one added record changes the
selection by at most one swap (see :func:`lowest_ranked`).

Example:
    >>> import numpy as np
    >>> x = np.arange(12, dtype=np.uint8).reshape(6, 2)
    >>> y = np.array([0, 1, 0, 1, 0, 1])
    >>> u = record_uniforms(x, y, seed=0)
    >>> u.shape, bool((u >= 0).all() and (u < 1).all())
    ((6, 8), True)
    >>> bool(np.array_equal(record_uniforms(x[1:], y[1:], seed=0), u[1:]))  # depends on the record only
    True
"""

from __future__ import annotations

import hashlib

import numpy as np

from privopt.errors import ConfigError

__all__ = ["STAGES", "stage_index", "record_uniforms", "keep_mask", "lowest_ranked"]

# One independent uniform per stage (column of record_uniforms). Never reorder: that would change
# every published split.
STAGES = ("test", "val", "imbalance", "minority", "max_train", "test_balance", "spare1", "spare2")


def stage_index(stage: str) -> int:
    """Column of :func:`record_uniforms` used by ``stage``."""
    try:
        return STAGES.index(stage)
    except ValueError:
        raise ConfigError(f"unknown selection stage {stage!r}; stages: {', '.join(STAGES)}") from None


def record_uniforms(x: np.ndarray, y: np.ndarray, *, seed: int) -> np.ndarray:
    """``[N, 8]`` uniforms in [0, 1): row ``i`` is a keyed hash of record ``i``'s bytes and label only.

    Identical records get identical uniforms (they always land in the same split).
    """
    n = len(y)
    if n == 0:
        return np.zeros((0, len(STAGES)))
    rows = np.ascontiguousarray(x).reshape(n, -1).view(np.uint8).reshape(n, -1)
    labels = np.ascontiguousarray(np.asarray(y, dtype="<i8")).view(np.uint8).reshape(n, 8)
    key = f"privopt-selection:{int(seed)}".encode()[:64]
    width = 8 * len(STAGES)
    digest = b"".join(
        hashlib.blake2b(r.tobytes() + lab.tobytes(), key=key, digest_size=width).digest()
        for r, lab in zip(rows, labels)
    )
    words = np.frombuffer(digest, dtype="<u8").reshape(n, len(STAGES))
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53  # 53 random bits: exact in float64


def keep_mask(uniforms: np.ndarray, probability: float | np.ndarray) -> np.ndarray:
    """Records whose uniform is below ``probability`` (a number, or one per record)."""
    return np.asarray(uniforms) < np.asarray(probability)


def lowest_ranked(uniforms: np.ndarray, count: int) -> np.ndarray:
    """Sorted indices of the ``count`` records with the smallest uniforms (all of them if fewer).

    Adding one record changes this set by at most one swap (the new record in, the former
    ``count``-th out), removing one by at most one swap the other way.
    """
    u = np.asarray(uniforms)
    if count >= len(u):
        return np.arange(len(u))
    return np.sort(np.argsort(u, kind="stable")[:count])
