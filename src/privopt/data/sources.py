"""Readers that turn a dataset folder (or an embedded scikit-learn dataset) into :class:`RawData`.

Each source records in ``meta["source"]`` the files it read and which official splits were present
(public facts), and in ``stats["records_per_file"]`` how many records each file held (private).
Test splits are NOT carved here (see
:meth:`privopt.data.registry.BuildContext.with_test`), so variants can transform the official
splits first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privopt.data import formats
from privopt.data.dataset import Part, RawData
from privopt.data.public import PublicScaling, breast_cancer_scaling, image_scaling
from privopt.data.registry import BuildContext
from privopt.errors import ConfigError, DataError, some

__all__ = ["idx_source", "cifar10_source", "covtype_source", "celeba_source", "sklearn_source"]

_IDX_NAMES = {
    # split -> (images names, labels names); the dotted variants are used by some official mirrors.
    "train": (
        ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
        ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    ),
    "test": (
        ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
        ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
    ),
}


def _no_train_note(meta: dict, split_name: str) -> None:
    meta["official_splits_present"] = [split_name]
    meta.setdefault("preprocessing", []).append(
        f"only the official {split_name} split is in the data directory: train and test are both carved from it"
    )


def idx_source(
    ctx: BuildContext, *, folders: tuple[str, ...], class_names: list[str], normalization: str | None
) -> RawData:
    """MNIST-format IDX files: ``train-*`` and/or ``t10k-*`` image/label pairs (``.gz`` or not).

    ``normalization`` names the published constants of :data:`privopt.data.public.IMAGE_NORMALIZATION`.
    """
    expected = (
        "train-images-idx3-ubyte[.gz] + train-labels-idx1-ubyte[.gz] and/or "
        "t10k-images-idx3-ubyte[.gz] + t10k-labels-idx1-ubyte[.gz]"
    )
    root = ctx.dataset_dir(folders, expected=expected)
    parts: dict[str, Part] = {}
    files: dict[str, int] = {}
    for split, (img_names, lab_names) in _IDX_NAMES.items():
        img, lab = ctx.find(root, img_names), ctx.find(root, lab_names)
        if img is None and lab is None:
            continue
        if img is None or lab is None:
            have, missing = (img, lab_names[0]) if lab is None else (lab, img_names[0])
            missing_kind = "labels" if lab is None else "images"
            raise DataError(f"{have} found but its {missing_kind} file {root / missing}[.gz] is missing")
        x = formats.read_idx(img, expect_ndim=3)
        y = formats.read_idx(lab, expect_ndim=1).astype(np.int64)
        if len(x) != len(y):
            raise DataError(f"{img} holds {len(x)} images but {lab} holds {len(y)} labels")
        bad = np.flatnonzero((y < 0) | (y >= len(class_names)))
        if bad.size:  # not which (unless debugging: errors.some), nor its value
            raise DataError(f"{lab}: {some('label', int(bad[0]))} is outside 0..{len(class_names) - 1}")
        files[str(img)], files[str(lab)] = len(x), len(y)
        parts[split] = Part(x[:, None, :, :], y)
    if not parts:
        raise DataError(f"{root}: no IDX files found; expected {expected}")
    return _image_raw(parts, files, "IDX", class_names, image_scaling(255, 1, normalization=normalization))


def _image_raw(parts: dict, files: dict, fmt: str, class_names: list[str], scaling: PublicScaling) -> RawData:
    meta = {"source": {"format": fmt, "files": sorted(files)}, "class_names": class_names}
    stats = {"records_per_file": files}
    k = len(class_names)
    if "train" in parts:
        meta["official_splits_present"] = sorted(parts)
        return RawData(parts["train"], parts.get("test"), "image", k, scaling, meta=meta, stats=stats)
    _no_train_note(meta, "test")
    return RawData(parts["test"], None, "image", k, scaling, meta=meta, stats=stats)


def cifar10_source(ctx: BuildContext) -> RawData:
    """CIFAR-10 binary batches: every ``*.bin[.gz]`` whose name contains ``test`` is test data,
    every one containing ``train`` or ``data_batch`` is training data (in sorted name order)."""
    expected = "CIFAR-10 binary batches (*.bin or *.bin.gz: data_batch_*.bin / test_batch.bin or *train*/*test*)"
    root = ctx.dataset_dir(("cifar10", "cifar-10-batches-bin", "cifar10/cifar-10-batches-bin"), expected=expected)
    groups: dict[str, list[Path]] = {"train": [], "test": []}
    for f in sorted([*root.glob("*.bin"), *root.glob("*.bin.gz")]):
        low = f.name.lower()
        if "test" in low:
            groups["test"].append(f)
        elif "train" in low or "data_batch" in low:
            groups["train"].append(f)
        else:
            raise DataError(
                f"{f}: cannot tell whether this CIFAR-10 batch is train or test data "
                "(name it *train*/data_batch_* or *test*)"
            )
    if not groups["train"] and not groups["test"]:
        raise DataError(f"{root}: no CIFAR-10 batch files found; expected {expected}")
    meta_file = root / "batches.meta.txt"
    names = formats.read_class_names(meta_file) if meta_file.is_file() else [str(i) for i in range(10)]
    if len(names) != 10:
        raise DataError(f"{meta_file}: expected 10 class names, found {len(names)}")
    files: dict[str, int] = {}
    parts = {}
    for split, paths in groups.items():
        if not paths:
            continue
        xs, ys = [], []
        for p in paths:
            x, y = formats.read_cifar_bin(p)
            files[str(p)] = len(y)
            xs.append(x)
            ys.append(y)
        parts[split] = Part(np.concatenate(xs), np.concatenate(ys))
    return _image_raw(parts, files, "CIFAR-10 binary", names, image_scaling(255, 3, normalization="cifar10"))


def covtype_source(ctx: BuildContext) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """``covtype.data[.gz]`` (any ``covtype*.data[.gz]``): features [N, 54], Cover_Type 1..7, public meta, stats."""
    expected = "covtype.data[.gz] (UCI Covertype text, 55 comma-separated integers per row)"
    root = ctx.dataset_dir(("covtype", "covertype"), expected=expected)
    path = ctx.find(root, ("covtype.data",))
    if path is None:
        cands = sorted([*root.glob("covtype*.data"), *root.glob("covtype*.data.gz")])
        if not cands:
            raise DataError(f"{root}: covtype file missing; expected {expected}")
        if len(cands) > 1:
            raise DataError(
                f"{root}: several covtype files {[c.name for c in cands]}; keep one or name it covtype.data[.gz]"
            )
        path = cands[0]
    x, y = formats.read_covtype(path)
    meta = {"source": {"format": "UCI covtype.data", "files": [str(path)]}}
    return x, y, meta, {"records_per_file": {str(path): len(y)}}


def celeba_source(ctx: BuildContext, *, target: str, group: str, groups: str) -> RawData:
    """CelebA attribute annotations as a tabular stand-in (no images): features = the other attributes.

    Train = official partition 0; test = partition 2 when its rows are present, else the official
    validation partition 1 (the shared data holds only partitions 0 and 1). Attributes are 0/1.
    """
    if groups not in ("attribute", "target_x_attribute"):
        raise ConfigError(f"celeba option groups={groups!r} unknown; use 'attribute' or 'target_x_attribute'")
    expected = "list_attr_celeba[_train_valid].txt[.gz] and list_eval_partition.txt[.gz]"
    root = ctx.dataset_dir(("celeba", "CelebA"), expected=expected)
    attr_path = ctx.find(root, ("list_attr_celeba.txt", "list_attr_celeba_train_valid.txt"))
    part_path = ctx.find(root, ("list_eval_partition.txt",))
    for p, n in ((attr_path, "list_attr_celeba.txt"), (part_path, "list_eval_partition.txt")):
        if p is None:
            raise DataError(f"{root / n}[.gz] is missing; expected {expected}")
    names, ids, attrs = formats.read_celeba_attributes(attr_path)
    partition = formats.read_celeba_partition(part_path)
    for a in (target, group):
        if a not in names:
            raise ConfigError(f"celeba attribute {a!r} unknown; attributes: {', '.join(names)}")
    if target == group:
        raise ConfigError(f"celeba target and group must differ, both are {target!r}")
    try:
        part = np.array([partition[i] for i in ids], dtype=np.int64)
    except KeyError as exc:
        raise DataError(f"{part_path}: image {exc.args[0]} of {attr_path} has no partition entry") from None
    ti, gi = names.index(target), names.index(group)
    feat_idx = [j for j in range(len(names)) if j not in (ti, gi)]
    x, y, gattr = attrs[:, feat_idx].astype(np.float32), attrs[:, ti].astype(np.int64), attrs[:, gi].astype(np.int64)
    g, gnames = _celeba_groups(y, gattr, target=target, group=group, groups=groups)
    counts = {str(k): int((part == k).sum()) for k in (0, 1, 2)}
    test_k = 2 if counts["2"] else 1
    if counts["0"] == 0 or counts[str(test_k)] == 0:
        raise DataError(
            f"{attr_path}: needs rows of partition 0 (train) and of partition 1 or 2 (test); counts {counts}"
        )
    sel = lambda k: Part(x[part == k], y[part == k], g[part == k])
    meta = {
        "source": {"format": "CelebA annotations", "files": [str(attr_path), str(part_path)]},
        "official_splits_present": ["train", "val"] + (["test"] if counts["2"] else []),
        "test_split": "official test partition 2"
        if test_k == 2
        else "official validation partition 1 (test rows absent)",
        "stand_in": "attribute-only tabular stand-in for CelebA images: features are the 38 other binary attributes",
        "class_names": [f"not {target}", target],
        "feature_names": [names[j] for j in feat_idx],
        "target_attribute": target,
        "group_attribute": group,
        "group_names": gnames,
        "preprocessing": ["attributes mapped from -1/1 to 0/1"],
    }
    if test_k == 2 and counts["1"]:
        meta["unused"] = "official validation partition 1 is not used; carve a validation split with val_fraction"
    stats = {"records_per_file": {str(attr_path): len(ids), str(part_path): len(partition)}, "partition_counts": counts}
    box = PublicScaling.box(np.zeros(len(feat_idx)), np.ones(len(feat_idx)), source="binary attributes (0/1)")
    return RawData(sel(0), sel(test_k), "tabular", 2, box, meta=meta, stats=stats)


def _celeba_groups(y, gattr, *, target: str, group: str, groups: str) -> tuple[np.ndarray, list[str]]:
    if groups == "attribute":
        return gattr, [f"not {group}", group]
    names = [
        f"not {target}, not {group}",
        f"not {target}, {group}",
        f"{target}, not {group}",
        f"{target}, {group}",
    ]
    return 2 * y + gattr, names


def sklearn_source(which: str) -> RawData:
    """Datasets embedded in scikit-learn (no files): ``digits`` (8x8 images) or ``breast_cancer``."""
    from sklearn import datasets as skd

    if which == "digits":
        b = skd.load_digits()
        x = b.images.astype(np.float64)[:, None, :, :]
        return RawData(
            Part(x, b.target.astype(np.int64)), None, "image", 10, image_scaling(16, 1, normalization=None),
            meta={"source": {"format": "scikit-learn load_digits"}, "class_names": [str(i) for i in range(10)]},
            stats={"records": len(x)},
        )  # fmt: skip
    if which == "breast_cancer":
        b = skd.load_breast_cancer()
        return RawData(
            Part(b.data.astype(np.float64), b.target.astype(np.int64)), None, "tabular", 2, breast_cancer_scaling(),
            meta={
                "source": {"format": "scikit-learn load_breast_cancer"},
                "class_names": [str(n) for n in b.target_names],
                "feature_names": [str(n) for n in b.feature_names],
            },
            stats={"records": len(b.target)},
        )  # fmt: skip
    raise ConfigError(f"unknown scikit-learn dataset {which!r}")
