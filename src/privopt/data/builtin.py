"""The datasets privopt ships: plain benchmarks and the task variants of the papers (SPEC §2.8, §3.7).

Variants ("-ST" = imbalanced, Qi et al. 2022 / Zhang et al. 2025c):

* ``mnist-st`` / ``digits-st``: digits 0-4 -> label 0, 5-9 -> label 1; the TRAINING split keeps all
  of its majority class and subsamples the other so positives are ``imratio`` of it (default 0.1,
  SPEC E-A.22); the test split is rebalanced to ``test_imratio`` (default 0.5; None keeps it).
* ``cifar10-st``: classes 0-4 keep only their LAST ``minority_count`` training images (paper: 100
  of 5,000). On a subset of CIFAR-10 use ``minority_fraction`` (0.02 reproduces 100/5000) instead.
* ``fashion-mnist``: SPEC E-A.22 says to use it unmodified (10 classes); no -ST variant exists.
* ``celeba``: attribute-only tabular stand-in (no images), target Blond_Hair, group Male.
* ``covertype``: binary "class 2 (Lodgepole Pine) vs rest" as LIBSVM ``covtype.binary``;
  ``unit_norm=True`` gives min-max scaling then unit-L2 rows (||x|| <= 1, SPEC E-B.8).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privopt.data.dataset import Part, RawData
from privopt.data.registry import BuildContext, register_dataset
from privopt.data.sources import adult_source, celeba_source, cifar10_source, covtype_source, idx_source, sklearn_source
from privopt.data.splits import positive_ratio_indices
from privopt.errors import ConfigError

MNIST_FOLDERS = ("mnist", "MNIST", "MNIST/raw")
FASHION_FOLDERS = ("fashion-mnist", "fashion_mnist", "FashionMNIST", "FashionMNIST/raw")
DIGITS = [str(i) for i in range(10)]
FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


# ------------------------------------------------------------------------------- transforms


def select_classes(raw: RawData, classes: Sequence[int] | None) -> RawData:
    """Keep only ``classes`` (labels renumbered 0..k-1 in the given order)."""
    if classes is None:
        return raw
    classes = list(classes)
    if (
        len(classes) < 2
        or len(set(classes)) != len(classes)
        or any(
            isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < raw.num_classes for c in classes
        )
    ):
        raise ConfigError(f"classes must be >= 2 distinct labels in 0..{raw.num_classes - 1}, got {classes!r}")
    lut = np.full(raw.num_classes, -1, dtype=np.int64)
    lut[classes] = np.arange(len(classes))

    def pick(p: Part | None) -> Part | None:
        if p is None:
            return None
        q = p.take(np.flatnonzero(lut[p.y] >= 0))
        q.y = lut[q.y]
        return q

    raw.train, raw.test = pick(raw.train), pick(raw.test)
    names = raw.meta.get("class_names")
    if names:
        raw.meta["class_names"] = [names[c] for c in classes]
    raw.meta["class_map"] = {str(int(c)): i for i, c in enumerate(classes)}
    raw.num_classes = len(classes)
    return raw


def binarize(raw: RawData, positive: Sequence[int], description: str) -> RawData:
    """Label 1 for original labels in ``positive``, else 0."""
    for p in (raw.train, raw.test):
        if p is not None:
            p.y = np.isin(p.y, list(positive)).astype(np.int64)
    raw.num_classes = 2
    raw.meta["class_names"] = ["negative", "positive"]
    raw.meta.setdefault("preprocessing", []).append(description)
    return raw


def imbalance(raw: RawData, ctx: BuildContext, *, imratio: float, test_imratio: float | None) -> RawData:
    """Subsample so positives are ``imratio`` of the training split (and ``test_imratio`` of test)."""
    for name, value in (("imratio", imratio), ("test_imratio", test_imratio)):
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < 1):
            raise ConfigError(f"{name} must be in (0, 1){' or None' if name == 'test_imratio' else ''}, got {value!r}")
    if imratio is None:
        raise ConfigError("imratio must be in (0, 1), got None")
    before = len(raw.train)
    raw.train = raw.train.take(positive_ratio_indices(raw.train.y, imratio, ctx.rng("imbalance-train")))
    prep = raw.meta.setdefault("preprocessing", [])
    prep.append(
        f"training split subsampled from {before} to {len(raw.train)} records so positives are {imratio:g} of it"
    )
    if test_imratio is not None:
        before = len(raw.test)
        raw.test = raw.test.take(positive_ratio_indices(raw.test.y, test_imratio, ctx.rng("imbalance-test")))
        prep.append(
            f"test split subsampled from {before} to {len(raw.test)} records so positives are {test_imratio:g} of it"
        )
    raw.meta["imratio"] = {"train": imratio, "test": test_imratio}
    return raw


_ST_DESC = "binary task: original labels 0-4 -> 0, 5-9 -> 1"


# ------------------------------------------------------------------------------- images


@register_dataset("mnist")
def _mnist(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """MNIST handwritten digits (IDX files in <data_dir>/mnist), 10 classes, [1, 28, 28]."""
    return select_classes(ctx.with_test(idx_source(ctx, folders=MNIST_FOLDERS, class_names=DIGITS)), classes)


@register_dataset("fashion-mnist")
def _fashion(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """Fashion-MNIST (IDX files in <data_dir>/fashion-mnist), 10 classes, used unmodified (SPEC E-A.22)."""
    return select_classes(ctx.with_test(idx_source(ctx, folders=FASHION_FOLDERS, class_names=FASHION)), classes)


@register_dataset("mnist-st")
def _mnist_st(ctx: BuildContext, *, imratio: float = 0.1, test_imratio: float | None = 0.5) -> RawData:
    """MNIST-ST: binary 0-4 vs 5-9, positives subsampled to ``imratio`` of the training split."""
    raw = ctx.with_test(idx_source(ctx, folders=MNIST_FOLDERS, class_names=DIGITS))
    return imbalance(binarize(raw, range(5, 10), _ST_DESC), ctx, imratio=imratio, test_imratio=test_imratio)


@register_dataset("cifar10")
def _cifar10(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """CIFAR-10 (binary batches in <data_dir>/cifar10), 10 classes, [3, 32, 32]."""
    return select_classes(ctx.with_test(cifar10_source(ctx)), classes)


@register_dataset("cifar10-st")
def _cifar10_st(
    ctx: BuildContext, *, minority_count: int | None = 100, minority_fraction: float | None = None
) -> RawData:
    """CIFAR10-ST: classes 0-4 keep only their last training images (paper: 100 each); test unchanged."""
    if (minority_count is None) == (minority_fraction is None):
        raise ConfigError(
            f"cifar10-st: set exactly one of minority_count / minority_fraction "
            f"(got {minority_count!r} / {minority_fraction!r}; pass minority_count=None to use a fraction)"
        )
    if minority_count is not None and (
        isinstance(minority_count, bool) or not isinstance(minority_count, int) or minority_count < 1
    ):
        raise ConfigError(f"cifar10-st: minority_count must be a positive integer, got {minority_count!r}")
    if minority_fraction is not None and not (
        isinstance(minority_fraction, (int, float)) and 0 < minority_fraction <= 1
    ):
        raise ConfigError(f"cifar10-st: minority_fraction must be in (0, 1], got {minority_fraction!r}")
    raw = ctx.with_test(cifar10_source(ctx))
    y = raw.train.y
    keep = np.ones(len(y), dtype=bool)
    kept = {}
    for c in range(5):
        idx = np.flatnonzero(y == c)  # file order, so idx[-k:] are the LAST k images of class c
        k = minority_count if minority_count is not None else max(1, int(round(minority_fraction * len(idx))))
        keep[idx[: max(len(idx) - k, 0)]] = False
        kept[str(c)] = int(min(k, len(idx)))
    raw.train = raw.train.take(np.flatnonzero(keep))
    rule = f"last {minority_count}" if minority_count is not None else f"last {minority_fraction:g} share"
    raw.meta.setdefault("preprocessing", []).append(
        f"CIFAR10-ST: classes 0-4 keep only the {rule} of their training images in file order (kept {kept}); "
        "classes 5-9 and the test split unchanged"
    )
    return raw


@register_dataset("digits", needs_files=False)
def _digits(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes, [1, 8, 8]); no files needed."""
    return select_classes(ctx.with_test(sklearn_source("digits")), classes)


@register_dataset("digits-st", needs_files=False)
def _digits_st(ctx: BuildContext, *, imratio: float = 0.1, test_imratio: float | None = 0.5) -> RawData:
    """digits binarised 0-4 vs 5-9 and imbalanced like MNIST-ST (offline demo); no files needed."""
    raw = ctx.with_test(sklearn_source("digits"))
    return imbalance(binarize(raw, range(5, 10), _ST_DESC), ctx, imratio=imratio, test_imratio=test_imratio)


# ------------------------------------------------------------------------------- tabular


@register_dataset("breast-cancer", needs_files=False)
def _breast_cancer(ctx: BuildContext) -> RawData:
    """scikit-learn's Wisconsin breast cancer (569 x 30, binary: 1 = benign); no files needed."""
    return ctx.with_test(sklearn_source("breast_cancer"))


@register_dataset("covertype")
def _covertype(
    ctx: BuildContext,
    *,
    task: str = "binary",
    positive_class: int = 2,
    unit_norm: bool = False,
    classes: Sequence[int] | None = None,
) -> RawData:
    """UCI Covertype, 54 features; binary (Cover_Type == 2 vs rest, LIBSVM covtype.binary) or 7 classes."""
    if task not in ("binary", "multiclass"):
        raise ConfigError(f"covertype option task={task!r} unknown; use 'binary' or 'multiclass'")
    if task == "binary" and classes is not None:
        raise ConfigError("covertype option classes applies to task='multiclass' only")
    if not (isinstance(positive_class, int) and 1 <= positive_class <= 7):
        raise ConfigError(f"covertype positive_class must be a Cover_Type in 1..7, got {positive_class!r}")
    if not isinstance(unit_norm, bool):
        raise ConfigError(f"covertype unit_norm must be True or False, got {unit_norm!r}")
    x, cover, meta = covtype_source(ctx)
    meta["official_splits_present"] = ["all rows (one file)"]
    if task == "binary":
        y = (cover == positive_class).astype(np.int64)
        meta["class_names"] = ["other cover types", f"Cover_Type {positive_class}"]
        meta["preprocessing"] = [
            f"binary label: 1 iff Cover_Type == {positive_class} "
            "(LIBSVM covtype.binary uses 2 = Lodgepole Pine vs rest)"
        ]
        k = 2
    else:
        y = cover - 1
        meta["class_names"] = [f"Cover_Type {i}" for i in range(1, 8)]
        meta["preprocessing"] = ["label = Cover_Type - 1 (0..6)"]
        k = 7
    raw = RawData(Part(x, y), None, "tabular", k, scaling="minmax_unit_norm" if unit_norm else "standardize", meta=meta)
    return select_classes(ctx.with_test(raw), classes)


@register_dataset("adult")
def _adult(ctx: BuildContext, *, group: str | None = "sex", missing: str = "category") -> RawData:
    """UCI Adult income (>50K = 1), numeric + one-hot features; groups by ``sex`` (or ``race``)."""
    return ctx.with_test(adult_source(ctx, group=group, missing=missing))


@register_dataset("celeba")
def _celeba(
    ctx: BuildContext, *, target: str = "Blond_Hair", group: str = "Male", groups: str = "attribute"
) -> RawData:
    """CelebA attribute-only stand-in: predict ``target`` from the other attributes; groups from ``group``."""
    return celeba_source(ctx, target=target, group=group, groups=groups)
