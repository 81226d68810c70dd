"""Covertype for Paper B's experiment: a private training set and a disjoint held-out tuning set.

Both are binary logistic-regression data ("Lodgepole Pine (Cover_Type 2) vs the other six types",
intended to match LIBSVM ``covtype.binary``; label +1 = type 2), scaled with public constants only
and with unit-norm rows (so G = 1). Rows are ranked by a keyed hash of their content: the training
set is the first ``n_train`` rows in that order, the tuning set the next ``n_tune``, so the tuning
set is disjoint from the training set and plays the role of public data from the same population
(``docs/algorithms/erm.md``, "The Covertype comparison"). A row's rank depends on that row alone, but
the set it lands in depends on how many rows rank before it: the split is a function of the whole
file, and the guarantee is about a record of the training set as selected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privopt.errors import ConfigError, DataError
from privopt.objectives.erm import minmax_scale, normalize_rows

__all__ = ["POSITIVE_COVER_TYPE", "load_covertype_binary", "load_covertype_split"]

POSITIVE_COVER_TYPE = 2  # Lodgepole Pine


def _find_covtype_file(data_dir: Path) -> Path:
    """The UCI file in ``data_dir`` or its ``covtype/`` sub-folder (the layout of every privopt data dir)."""
    if data_dir.is_file():
        return data_dir
    for folder in (data_dir, data_dir / "covtype", data_dir / "covertype"):
        cands = sorted(p for p in folder.glob("covtype*.data*") if p.is_file())
        if cands:
            return cands[0]
    raise DataError(
        f"no Covertype file (covtype*.data or covtype*.data.gz) found in {data_dir} or {data_dir / 'covtype'}"
    )


def _ranked_rows(data_dir, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from privopt.data.formats import read_covtype
    from privopt.data.selection import record_uniforms, stage_index

    raw_x, cover = read_covtype(_find_covtype_file(Path(data_dir)))
    rank = record_uniforms(raw_x, cover, seed=seed)[:, stage_index("max_train")]
    return raw_x, cover, np.argsort(rank, kind="stable")


def _prepare(raw_x: np.ndarray, cover: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from privopt.data.public import covtype_bounds

    lower, upper = covtype_bounds()
    x = normalize_rows(minmax_scale(raw_x[rows], lower=lower, upper=upper))
    return x, np.where(cover[rows] == POSITIVE_COVER_TYPE, 1.0, -1.0)


def load_covertype_binary(*, data_dir, n_train: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Covertype as ±1 logistic-regression data with unit-norm rows, scaled with public constants only.

    Every feature is clipped into Covertype's public attribute range and min-max scaled with it
    (``privopt.data.public.covtype_bounds``; sources in docs/data.md, "Covertype"), then each row is
    scaled to unit L2 norm: no record's features depend on another record.

    Args:
        data_dir: a data folder with ``covtype/covtype*.data[.gz]`` (UCI format), the folder
            holding that file, or the file itself.
        n_train: rows to keep (default: all): the rows with the smallest keyed hash of their content
            (``seed`` as key), in hash order, so one row added to or removed from the file changes
            the kept set by at most one swap.
        seed: key of that hash.

    Returns:
        ``(features [n, 54] float64 with ||x_i|| = 1, labels [n] in {-1, +1})``.
    """
    raw_x, cover, order = _ranked_rows(data_dir, seed)
    n_all = raw_x.shape[0]
    if n_train is not None and not (isinstance(n_train, int) and 1 <= n_train <= n_all):
        raise ConfigError(f"n_train must be an integer in [1, {n_all}] for this file, got {n_train!r}")
    return _prepare(raw_x, cover, order[: n_train or n_all])


def load_covertype_split(
    *, data_dir, n_train: int, n_tune: int, seed: int = 0
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The training set (first ``n_train`` rows in keyed-hash order) and the disjoint tuning set
    (the next ``n_tune``), prepared as :func:`load_covertype_binary` does.

    Raises:
        ConfigError: sizes that are not positive integers or exceed the file.
    """
    raw_x, cover, order = _ranked_rows(data_dir, seed)
    n_all = raw_x.shape[0]
    for name, v in (("n_train", n_train), ("n_tune", n_tune)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if n_train + n_tune > n_all:
        raise ConfigError(f"n_train + n_tune = {n_train + n_tune} exceeds the {n_all} rows of the Covertype file")
    return _prepare(raw_x, cover, order[:n_train]), _prepare(raw_x, cover, order[n_train : n_train + n_tune])
