"""Selection steps of the loading pipeline, each decided per record (see :mod:`privopt.data.selection`).

* :func:`carve` / :func:`thin_label`: independent keyed coins; adding or removing one record
  changes the result by at most that record.
* :func:`cap_count` / :func:`balance_exact`: exact counts, ranked by the same keyed hash; one
  record changes the result by at most one swap. Used for ``max_train`` and for rebalancing the
  (evaluation-only) test split.

All return splits in source order (the "last images of a class" rule of CIFAR10-ST needs it).
``shard_by_label`` (distributed clients) and :func:`label_histogram` live here too.
"""

from __future__ import annotations

import numpy as np

from privopt.data.dataset import Part
from privopt.data.selection import keep_mask, lowest_ranked, record_uniforms, stage_index
from privopt.errors import ConfigError

__all__ = [
    "uniforms",
    "carve",
    "thin_label",
    "cap_count",
    "balance_exact",
    "label_histogram",
    "shard_by_label",
    "client_shards",
    "CLIENT_SPLITS",
]

CLIENT_SPLITS = ("label", "iid")


def uniforms(part: Part, *, seed: int, stage: str) -> np.ndarray:
    """The ``stage`` uniform of every record of ``part`` (computed once per part, then cached)."""
    if part.u is None:
        part.u = record_uniforms(part.x, part.y, seed=seed)
    return part.u[:, stage_index(stage)]


def carve(part: Part, fraction: float, *, seed: int, stage: str) -> tuple[Part, Part]:
    """``(kept, held_out)``: each record is held out iff its ``stage`` uniform is below ``fraction``.

    Example:
        >>> import numpy as np
        >>> p = Part(np.arange(2000, dtype=np.int64)[:, None], np.zeros(2000, dtype=np.int64))
        >>> kept, held = carve(p, 0.25, seed=0, stage="test")
        >>> len(kept) + len(held), abs(len(held) - 500) < 70
        (2000, True)
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"split fraction must be in (0, 1), got {fraction}")
    held = keep_mask(uniforms(part, seed=seed, stage=stage), fraction)
    return part.take(np.flatnonzero(~held)), part.take(np.flatnonzero(held))


def thin_label(part: Part, label: int, keep_probability: float, *, seed: int, stage: str) -> Part:
    """Keep every record of other labels; keep each record of ``label`` iff its uniform < ``keep_probability``."""
    u = uniforms(part, seed=seed, stage=stage)
    keep = (part.y != label) | keep_mask(u, keep_probability)
    return part.take(np.flatnonzero(keep))


def cap_count(part: Part, count: int, *, seed: int, stage: str) -> Part:
    """The ``count`` records with the smallest ``stage`` uniforms (all if fewer)."""
    return part.take(lowest_ranked(uniforms(part, seed=seed, stage=stage), count))


def balance_exact(part: Part, ratio: float, *, seed: int, stage: str) -> Part:
    """Subsample binary labels so label 1 is exactly ``ratio`` of the records (up to rounding).

    Only the label in excess is subsampled, keeping its lowest-ranked records. Counts are used, so
    this is meant for the test split (evaluation data), not for training data.
    """
    if not 0.0 < ratio < 1.0:
        raise ConfigError(f"imbalance ratio (share of positives) must be in (0, 1), got {ratio}")
    y = np.asarray(part.y)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if len(pos) + len(neg) != len(y):
        raise ConfigError("balance_exact needs binary labels 0/1")
    u = uniforms(part, seed=seed, stage=stage)
    want_pos = int(round(ratio / (1.0 - ratio) * len(neg)))
    if want_pos <= len(pos):
        pos = pos[lowest_ranked(u[pos], max(want_pos, 1))]
    else:
        want_neg = max(int(round((1.0 - ratio) / ratio * len(pos))), 1)
        neg = neg[lowest_ranked(u[neg], want_neg)]
    return part.take(np.sort(np.concatenate([pos, neg])))


def label_histogram(y: np.ndarray, num_classes: int) -> list[int]:
    """Counts per label ``0..num_classes-1`` as plain ints (JSON-friendly)."""
    return [int(c) for c in np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes)[:num_classes]]


def shard_by_label(y: np.ndarray, num_shards: int, *, rng: np.random.Generator, iid: bool = False) -> list[np.ndarray]:
    """Split record indices into ``num_shards`` disjoint, (near-)equal shards for distributed runs.

    ``iid=False`` sorts by label (ties broken at random) before cutting, so each client sees few
    classes (the heterogeneous split recommended for Paper C); ``iid=True`` cuts a random permutation.
    Shard boundaries depend on the label counts: the protected unit of a distributed run is the
    client's shard.
    """
    if num_shards < 1 or num_shards > len(y):
        raise ConfigError(f"num_shards must be in [1, {len(y)}], got {num_shards}")
    perm = rng.permutation(len(y))
    if not iid:
        perm = perm[np.argsort(np.asarray(y)[perm], kind="stable")]
    return [np.sort(s) for s in np.array_split(perm, num_shards)]


def client_shards(y, *, clients: int, split: str, seed: int) -> list:
    """Disjoint index shards (int64 tensors) of a federated run's ``clients`` clients, from the public ``seed``:
    ``split="label"`` (label-sorted, heterogeneous clients) or ``"iid"`` (:func:`shard_by_label`).

    Example:
        >>> import torch
        >>> y = torch.tensor([0, 1, 0, 1, 2, 2])
        >>> [sorted(y[s].tolist()) for s in client_shards(y, clients=3, split="label", seed=0)]
        [[0, 0], [1, 1], [2, 2]]
    """
    import torch

    if split not in CLIENT_SPLITS:
        raise ConfigError(f"client split must be one of {CLIENT_SPLITS}, got {split!r}")
    rng = np.random.default_rng([int(seed), 0x5050])
    shards = shard_by_label(np.asarray(y), clients, rng=rng, iid=split == "iid")
    return [torch.as_tensor(s, dtype=torch.int64) for s in shards]
