"""UCI Adult (census income) with public feature encoding and demographic groups.

Everything that shapes the features is fixed before reading the data: the category vocabulary of
``adult.names``, fixed per-record transforms (``log1p`` of capital gain/loss) and documented value
bounds (:data:`privopt.data.public.ADULT_NUMERIC_BOUNDS`). Groups for worst-group risk are sex x
race with the three smallest races merged into one fixed "other race" category (the merge is
decided here, not by counting the loaded records). See ``docs/data.md`` ("Adult").
"""

from __future__ import annotations

import numpy as np

from privopt.data import formats
from privopt.data.dataset import Part, RawData
from privopt.data.public import ADULT_NUMERIC_BOUNDS, ADULT_VOCABULARY, PublicScaling
from privopt.data.registry import BuildContext
from privopt.data.tabular import one_hot, record_where, tabular_layout, transform
from privopt.errors import ConfigError, DataError

__all__ = ["adult_source", "ADULT_GROUPINGS", "RACE3"]

# Race merged into three categories: the census's two largest, and the rest together.
RACE3 = {"White": 0, "Black": 1, "Asian-Pac-Islander": 2, "Amer-Indian-Eskimo": 2, "Other": 2}
_RACE3_NAMES = ("White", "Black", "other race")
_SEX = ("Female", "Male")

ADULT_GROUPINGS = {
    "sex_race": [f"{s}, {r}" for s in _SEX for r in _RACE3_NAMES],
    "sex": list(_SEX),
    "race": ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"],
}


def _group_ids(cols: dict, grouping: str, path, lines: np.ndarray) -> np.ndarray:
    sex, race = cols["sex"], cols["race"]
    for col, allowed in (("sex", _SEX), ("race", tuple(RACE3))):
        ok = np.isin(cols[col], allowed)
        if not bool(ok.all()):
            raise DataError(
                f"{path}: {col} of {record_where(ok, lines)} cannot be grouped (expected {', '.join(allowed)})"
            )
    s = np.array([_SEX.index(v) for v in sex], dtype=np.int64)
    if grouping == "sex":
        return s
    if grouping == "race":
        return np.array([ADULT_GROUPINGS["race"].index(v) for v in race], dtype=np.int64)
    return 3 * s + np.array([RACE3[v] for v in race], dtype=np.int64)


def _encode(cols: dict, path, lines: np.ndarray, *, with_missing: bool) -> np.ndarray:
    """Numeric features (fixed transforms) then one-hot categories over the public vocabulary."""
    blocks = []
    for name, (kind, _lo, _hi, _src) in ADULT_NUMERIC_BOUNDS.items():
        v = cols[name] if kind == "identity" else np.maximum(cols[name], 0.0)  # the census codes no negatives
        blocks.append(transform(kind, v)[:, None])
    for name, vocab in ADULT_VOCABULARY.items():
        values = cols[name]
        ok = np.isin(values, (*vocab, "?"))
        if not bool(ok.all()):  # the column, never the value (nor the line unless debugging)
            raise DataError(f"{path}: {name} of {record_where(ok, lines)} is not in the adult.names vocabulary")
        blocks.append(one_hot(values, (*vocab, "?") if with_missing else vocab))
    return np.concatenate([b.astype(np.float64) for b in blocks], axis=1)


def _feature_layout(with_missing: bool) -> tuple[list[str], PublicScaling]:
    numeric = {name: (b[1], b[2]) for name, b in ADULT_NUMERIC_BOUNDS.items()}
    vocab = {col: (*v, "?") if with_missing else v for col, v in ADULT_VOCABULARY.items()}
    return tabular_layout(
        numeric, vocab,
        source="adult.names vocabulary and documented bounds (docs/data.md, 'Adult'); numeric features "
        "min-max scaled with the bounds, one-hot features 0/1",
    )  # fmt: skip


def adult_source(ctx: BuildContext, *, group: str | None, missing: str) -> RawData:
    """``adult.data[.gz]`` (+ ``adult.test[.gz]`` if present) as public-encoded features, label, groups."""
    if group is not None and group not in ADULT_GROUPINGS:
        raise ConfigError(f"adult option group={group!r} unknown; use one of {sorted(ADULT_GROUPINGS)} or None")
    if missing not in ("category", "drop"):
        raise ConfigError(f"adult option missing={missing!r} unknown; use 'category' or 'drop'")
    expected = "adult.data[.gz] (and optionally adult.test[.gz]) in UCI text format"
    root = ctx.dataset_dir(("adult",), expected=expected)
    paths = {"train": ctx.find(root, ("adult.data",)), "test": ctx.find(root, ("adult.test",))}
    if paths["train"] is None:
        raise DataError(f"{root / 'adult.data'}[.gz] is missing; expected {expected}")
    with_missing = missing == "category"
    parts, stats = {}, {"records_per_file": {}, "rows_dropped_missing": {}}
    for split, path in paths.items():
        if path is None:
            continue
        cols, label, lines = formats.read_adult(path, lines=True)
        stats["records_per_file"][str(path)] = len(label)
        keep = np.ones(len(label), dtype=bool)
        if not with_missing:
            for c in ADULT_VOCABULARY:
                keep &= cols[c] != "?"
            stats["rows_dropped_missing"][split] = int((~keep).sum())
        cols, lines = {c: v[keep] for c, v in cols.items()}, lines[keep]
        g = None if group is None else _group_ids(cols, group, path, lines)
        parts[split] = Part(_encode(cols, path, lines, with_missing=with_missing), label[keep], g)
    names, scaling = _feature_layout(with_missing)
    meta = {
        "source": {"format": "UCI adult", "files": [str(p) for p in paths.values() if p is not None]},
        "official_splits_present": sorted(parts),
        "class_names": ["<=50K", ">50K"],
        "feature_names": names,
        "preprocessing": [
            "label 1 = income >50K",
            "fnlwgt (the survey's sampling weight) left out; capital-gain and capital-loss as log1p",
            "categorical columns one-hot encoded over the adult.names vocabulary"
            + ("; '?' (missing) is its own category" if with_missing else "; rows with '?' dropped"),
        ],
    }
    if group is not None:
        meta["group_attribute"] = group
        meta["group_names"] = list(ADULT_GROUPINGS[group])
        if group == "sex_race":
            meta["group_rule"] = (
                "sex x race, with Asian-Pac-Islander, Amer-Indian-Eskimo and Other merged into 'other race' "
                "(a fixed rule, see docs/data.md)"
            )
    if with_missing:
        del stats["rows_dropped_missing"]
    else:
        meta["per_record_selection"] = ["adult missing: drop"]
    return RawData(parts["train"], parts.get("test"), "tabular", 2, scaling, meta=meta, stats=stats)
