"""The steps :func:`privopt.data.load_dataset` runs after a builder: per-record selection of the
validation and training splits, public scaling, tensors, and the public/private metadata split."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from privopt.data.dataset import Dataset, RawData
from privopt.data.preprocess import scale_splits
from privopt.data.registry import BuildContext
from privopt.data.splits import cap_count, label_histogram, uniforms
from privopt.errors import DataError

__all__ = ["finish", "protected_unit"]


def protected_unit(count_based: list[str]) -> str:
    """What one record of the source can change in the training split, given the count-based steps used."""
    if not count_based:
        return (
            "one record of the source data (add/remove): every selection step decides each record by "
            "its own keyed hash, so neighbouring sources give training splits that differ in at most "
            "that record"
        )
    return (
        f"count-based selection ({'; '.join(count_based)}): neighbouring sources give training splits "
        "that differ by at most one swap (one record in, one out: a replace-one neighbour, i.e. two "
        "add/remove steps)"
    )


def _select(raw: RawData, ctx: BuildContext, *, val_fraction: float, max_train, train_fraction):
    """Validation carve, then thinning/capping of the training split; returns the parts and notes."""
    public = raw.meta
    count_based = list(public.pop("count_based_selection", []))
    per_record = list(public.pop("per_record_selection", []))
    train, test = raw.train, raw.test
    val = train.take(np.zeros(0, dtype=np.int64))
    if val_fraction > 0:
        train, val = ctx.carve(train, val_fraction, "val")
        public["val_split"] = (
            f"carved per record: each training record moves to validation with probability {val_fraction:g} "
            f"(keyed hash, seed {ctx.seed})"
        )
        per_record.append(f"validation carve: val_fraction {val_fraction:g}")
    if train_fraction is not None:
        u = uniforms(train, seed=ctx.seed, stage="max_train")
        train = train.take(np.flatnonzero(u < train_fraction))
        public["train_fraction"] = f"each training record kept with probability {train_fraction:g} (per record)"
        per_record.append(f"train_fraction {train_fraction:g}")
    if max_train is not None:  # noted whether or not it bites: the public facts must not depend on the count
        train = cap_count(train, int(max_train), seed=ctx.seed, stage="max_train")
        public["max_train"] = (
            f"training split capped at {int(max_train)} records: the lowest-ranked by keyed hash (seed {ctx.seed})"
        )
        count_based.append("max_train cap")
    public["selection"] = {
        "rule": "per record: keyed BLAKE2b hash of the record's content (public seed as key) gives one uniform "
        "per stage; a record is kept/moved iff its uniform is below the stage's fixed probability",
        "protected_unit": protected_unit(count_based),
        "count_based": list(count_based),  # the steps named, whatever the counts: public
        "per_record": per_record,  # steps that may take a replaced record in or out of the training split
    }
    return {"train": train, "val": val, "test": test}


def finish(
    raw: RawData, *, ctx: BuildContext, val_fraction: float, max_train, train_fraction, mode: str, options: dict
) -> Dataset:
    """Selection, public scaling and tensors for a builder's :class:`RawData` (see :func:`load_dataset`)."""
    parts = _select(raw, ctx, val_fraction=val_fraction, max_train=max_train, train_fraction=train_fraction)
    k = raw.num_classes
    for s, p in parts.items():
        if len(p) and (p.y.min() < 0 or p.y.max() >= k):
            raise DataError(f"dataset {ctx.name!r}: {s} labels outside 0..{k - 1}")
        if not np.isfinite(p.x).all():
            raise DataError(f"dataset {ctx.name!r}: non-finite feature values in the {s} split")
    xs, steps, scale_public, scale_private = scale_splits(
        {s: p.x for s, p in parts.items()}, scaling=raw.scaling, mode=mode, kind=raw.kind, unit_norm=raw.unit_norm
    )
    public = dict(raw.meta)
    public["preprocessing"] = list(public.get("preprocessing", [])) + steps
    public.update(
        name=ctx.name, seed=ctx.seed, options=_jsonable(options), scaling=scale_public,
        input_shape=[int(d) for d in parts["train"].x.shape[1:]],
    )  # fmt: skip
    private = {**raw.stats, **scale_private}
    private.update(
        splits={s: len(p) for s, p in parts.items()},
        label_histogram={s: label_histogram(p.y, k) for s, p in parts.items()},
    )
    has_groups = parts["train"].g is not None
    if has_groups:
        ng = len(public.get("group_names", ())) or int(max(p.g.max() for p in parts.values() if len(p)) + 1)
        private["group_histogram"] = {s: label_histogram(p.g, ng) for s, p in parts.items()}

    def t(a, dtype):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)

    g = {s: t(p.g, torch.int64) if has_groups else None for s, p in parts.items()}
    return Dataset(
        name=ctx.name,
        x_train=torch.from_numpy(xs["train"]), y_train=t(parts["train"].y, torch.int64),
        x_val=torch.from_numpy(xs["val"]), y_val=t(parts["val"].y, torch.int64),
        x_test=torch.from_numpy(xs["test"]), y_test=t(parts["test"].y, torch.int64),
        num_classes=k, input_shape=tuple(public["input_shape"]),
        g_train=g["train"], g_val=g["val"], g_test=g["test"],
        meta={"public": public, "private": private},
    )  # fmt: skip


def _jsonable(options: dict) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, (tuple, range)) else v for k, v in options.items()}
