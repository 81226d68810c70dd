"""Seeded, deterministic index manipulations: stratified splits, subsampling, imbalance, shards.

All functions take an explicit :class:`numpy.random.Generator` and return sorted index arrays
(sorted so that the original file order survives inside each split — the "last 100 images of a
class" rule of CIFAR10-ST depends on file order).
"""

from __future__ import annotations

import numpy as np

from privopt.errors import ConfigError

__all__ = [
    "stratified_split",
    "stratified_subsample",
    "positive_ratio_indices",
    "label_histogram",
    "shard_by_label",
]


def _alloc(counts: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` over classes proportionally to ``counts`` (largest-remainder rounding)."""
    exact = counts * (total / counts.sum())
    take = np.floor(exact).astype(np.int64)
    rest = total - int(take.sum())
    if rest > 0:
        order = np.argsort(-(exact - take), kind="stable")
        take[order[:rest]] += 1
    return np.minimum(take, counts)


def stratified_split(y: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into ``(kept, held_out)`` with ``round(fraction * n)`` held out, per-class proportional.

    Example:
        >>> import numpy as np
        >>> keep, out = stratified_split(np.array([0] * 8 + [1] * 2), 0.5, np.random.default_rng(0))
        >>> len(out), int((np.array([0] * 8 + [1] * 2)[out] == 1).sum())
        (5, 1)
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"split fraction must be in (0, 1), got {fraction}")
    y = np.asarray(y)
    n_out = int(round(fraction * len(y)))
    if n_out == 0 or n_out == len(y):
        raise ConfigError(f"split fraction {fraction} of {len(y)} records leaves an empty split")
    held = stratified_subsample(y, n_out, rng)
    mask = np.ones(len(y), dtype=bool)
    mask[held] = False
    return np.flatnonzero(mask), held


def stratified_subsample(y: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` indices drawn without replacement, keeping the class proportions of ``y``."""
    y = np.asarray(y)
    if size >= len(y):
        return np.arange(len(y))
    _classes, inverse = np.unique(y, return_inverse=True)
    take = _alloc(np.bincount(inverse), size)
    out = [rng.choice(np.flatnonzero(inverse == c), size=int(k), replace=False) for c, k in enumerate(take) if k]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def positive_ratio_indices(y: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a subsample of binary labels ``y`` whose share of label 1 is ``ratio``.

    Only the class in excess is subsampled (the other is kept whole), so the subsample is as
    large as possible. ``ratio = 0.5`` balances the classes.
    """
    if not 0.0 < ratio < 1.0:
        raise ConfigError(f"imbalance ratio (share of positives) must be in (0, 1), got {ratio}")
    y = np.asarray(y)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if len(pos) + len(neg) != len(y):
        raise ConfigError("positive_ratio_indices needs binary labels 0/1")
    want_pos = int(round(ratio / (1.0 - ratio) * len(neg)))
    if want_pos <= len(pos):
        pos = rng.choice(pos, size=max(want_pos, 1), replace=False)
    else:
        neg = rng.choice(neg, size=max(int(round((1.0 - ratio) / ratio * len(pos))), 1), replace=False)
    return np.sort(np.concatenate([pos, neg]))


def label_histogram(y: np.ndarray, num_classes: int) -> list[int]:
    """Counts per label ``0..num_classes-1`` as plain ints (JSON-friendly)."""
    return [int(c) for c in np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes)[:num_classes]]


def shard_by_label(y: np.ndarray, num_shards: int, *, rng: np.random.Generator, iid: bool = False) -> list[np.ndarray]:
    """Split record indices into ``num_shards`` disjoint, (near-)equal shards for distributed runs.

    ``iid=False`` sorts by label (ties broken at random) before cutting, so each client sees few
    classes (the heterogeneous split recommended for Paper C); ``iid=True`` cuts a random permutation.
    """
    if num_shards < 1 or num_shards > len(y):
        raise ConfigError(f"num_shards must be in [1, {len(y)}], got {num_shards}")
    perm = rng.permutation(len(y))
    if not iid:
        perm = perm[np.argsort(np.asarray(y)[perm], kind="stable")]
    return [np.sort(s) for s in np.array_split(perm, num_shards)]
