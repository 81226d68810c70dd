"""The datasets privopt ships: plain benchmarks, the task variants of the papers, and group data.

See ``docs/data.md`` for each dataset's construction, public preprocessing and groups. Variants
("-ST" = imbalanced, Qi et al. 2022 / Zhang et al. 2025c):

* ``mnist-st`` / ``digits-st``: digits 0-4 -> label 0, 5-9 -> label 1; each positive TRAINING
  record is kept with a fixed probability (``imratio / (1 - imratio)`` times the official source's
  public negatives-per-positive ratio), so positives are ``imratio`` of the training split in
  expectation; the test split is rebalanced exactly to ``test_imratio`` (default 0.5; None keeps it).
* ``cifar10-st``: each training image of classes 0-4 is kept with probability
  ``minority_fraction`` (default 0.02 = the paper's 100 of 5,000); ``minority_count`` instead
  keeps the paper's exact "last k images" (count-based).
* ``fashion-mnist``: used unmodified (10 classes); no -ST variant exists.
* ``celeba``: attribute-only tabular stand-in (no images), target ``Blond_Hair``, groups
  ``Male`` x ``Blond_Hair`` (Sagawa et al.).
* ``adult``: income, groups sex x race (see :mod:`privopt.data.adult`).
* ``covertype``: binary "class 2 (Lodgepole Pine) vs rest" as LIBSVM ``covtype.binary``;
  ``unit_norm=True`` gives public min-max bounds then unit-L2 rows (||x|| <= 1).
* ``csv``: your own CSV file, encoded with the public schema of the config (:mod:`privopt.data.csv_dataset`).
* ``synthetic-groups``: p-group Gaussian-mixture logistic benchmark (:mod:`privopt.data.synthetic`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import privopt.data.synthetic  # noqa: F401  (registers synthetic-groups)
from privopt.data.adult import adult_source
from privopt.data.csv_dataset import csv_source
from privopt.data.dataset import Part, RawData
from privopt.data.public import covtype_scaling
from privopt.data.registry import BuildContext, is_int, is_real, register_dataset
from privopt.data.sources import celeba_source, cifar10_source, covtype_source, idx_source, sklearn_source
from privopt.data.splits import balance_exact, thin_label, uniforms
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
        or any(not is_int(c) or not 0 <= c < raw.num_classes for c in classes)
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
    raw.per_record(f"classes {classes} kept by label")
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
    raw.note(description)
    return raw


# Negatives (original labels 0-4) per positive (5-9) in the official sources: public label counts
# (MNIST training set: 30,596 / 29,404 per its published histogram; scikit-learn digits: 901 / 896).
MNIST_ST_CLASS_RATIO = 30596 / 29404
DIGITS_ST_CLASS_RATIO = 901 / 896


def imbalance(
    raw: RawData, ctx: BuildContext, *, imratio: float, test_imratio: float | None, class_ratio: float
) -> RawData:
    """Thin the training split per record so positives are about ``imratio`` of it; rebalance test exactly.

    ``class_ratio`` is the public number of negatives per positive in the official source, so the
    expected positive share is exactly ``imratio`` on the official files.
    """
    for name, value in (("imratio", imratio), ("test_imratio", test_imratio)):
        if value is not None and not (is_real(value) and 0 < value < 1):
            raise ConfigError(f"{name} must be in (0, 1){' or None' if name == 'test_imratio' else ''}, got {value!r}")
    if imratio is None:
        raise ConfigError("imratio must be in (0, 1), got None")
    # A fixed keep probability (public constants, not the loaded counts): each record's fate is its own.
    odds = imratio / (1.0 - imratio) * class_ratio
    label, p = (1, odds) if odds <= 1 else (0, 1.0 / odds)
    before = len(raw.train)
    raw.train = thin_label(raw.train, label, p, seed=ctx.seed, stage="imbalance")
    raw.note(
        f"training split: each label-{label} record kept with probability {p:.6g} "
        f"(= imratio/(1-imratio) x {class_ratio:.6g} public negatives per positive; per record, so positives "
        f"are {imratio:g} of the split in expectation on the official files)"
    )
    raw.stats["imbalance"] = {"train_before": before, "train_after": len(raw.train)}
    raw.per_record(f"imratio {imratio:g}: label-{label} records thinned")
    if test_imratio is not None:
        before = len(raw.test)
        raw.test = balance_exact(raw.test, test_imratio, seed=ctx.seed, stage="test_balance")
        raw.note(
            f"test split (evaluation only) subsampled so positives are exactly {test_imratio:g} of it "
            "(the lowest-ranked records by keyed hash of the class in excess)"
        )
        raw.stats["imbalance"].update(test_before=before, test_after=len(raw.test))
    raw.meta["imratio"] = {"train": imratio, "test": test_imratio}
    return raw


_ST_DESC = "binary task: original labels 0-4 -> 0, 5-9 -> 1"


# ------------------------------------------------------------------------------- images


def _idx(ctx: BuildContext, folders, names, normalization: str) -> RawData:
    return ctx.with_test(idx_source(ctx, folders=folders, class_names=names, normalization=normalization))


@register_dataset("mnist")
def _mnist(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """MNIST handwritten digits (IDX files in <data_dir>/mnist), 10 classes, [1, 28, 28]."""
    return select_classes(_idx(ctx, MNIST_FOLDERS, DIGITS, "mnist"), classes)


@register_dataset("fashion-mnist")
def _fashion(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """Fashion-MNIST (IDX files in <data_dir>/fashion-mnist), 10 classes, used unmodified."""
    return select_classes(_idx(ctx, FASHION_FOLDERS, FASHION, "fashion-mnist"), classes)


@register_dataset("mnist-st")
def _mnist_st(ctx: BuildContext, *, imratio: float = 0.1, test_imratio: float | None = 0.5) -> RawData:
    """MNIST-ST: binary 0-4 vs 5-9, positives thinned per record to about ``imratio`` of the training split."""
    raw = binarize(_idx(ctx, MNIST_FOLDERS, DIGITS, "mnist"), range(5, 10), _ST_DESC)
    return imbalance(raw, ctx, imratio=imratio, test_imratio=test_imratio, class_ratio=MNIST_ST_CLASS_RATIO)


@register_dataset("cifar10")
def _cifar10(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """CIFAR-10 (binary batches in <data_dir>/cifar10), 10 classes, [3, 32, 32]."""
    return select_classes(ctx.with_test(cifar10_source(ctx)), classes)


def _check_minority(minority_count, minority_fraction) -> None:
    if (minority_count is None) == (minority_fraction is None):
        raise ConfigError(
            f"cifar10-st: set exactly one of minority_count / minority_fraction "
            f"(got {minority_count!r} / {minority_fraction!r}; pass minority_fraction=None to use a count)"
        )
    if minority_count is not None and not (is_int(minority_count) and minority_count >= 1):
        raise ConfigError(f"cifar10-st: minority_count must be a positive integer, got {minority_count!r}")
    if minority_fraction is not None and not (is_real(minority_fraction) and 0 < minority_fraction <= 1):
        raise ConfigError(f"cifar10-st: minority_fraction must be in (0, 1], got {minority_fraction!r}")


@register_dataset("cifar10-st")
def _cifar10_st(
    ctx: BuildContext, *, minority_count: int | None = None, minority_fraction: float | None = 0.02
) -> RawData:
    """CIFAR10-ST: training images of classes 0-4 kept with probability minority_fraction (paper: 100 of 5,000)."""
    _check_minority(minority_count, minority_fraction)
    raw = ctx.with_test(cifar10_source(ctx))
    minority = raw.train.y < 5
    if minority_fraction is not None:
        keep = ~minority | (uniforms(raw.train, seed=ctx.seed, stage="minority") < minority_fraction)
        rule = f"each image of classes 0-4 kept with probability {minority_fraction:g} (per record, keyed hash)"
        raw.per_record(f"cifar10-st minority_fraction {minority_fraction:g}")
    else:
        keep = ~minority
        for c in range(5):
            idx = np.flatnonzero(raw.train.y == c)  # file order: idx[-k:] are the LAST k images of class c
            keep[idx[max(len(idx) - minority_count, 0) :]] = True
        rule = f"classes 0-4 keep only their last {minority_count} training images in file order (count-based)"
        raw.meta["count_based_selection"] = [f"cifar10-st minority_count={minority_count}"]
    raw.train = raw.train.take(np.flatnonzero(keep))
    raw.note(f"CIFAR10-ST: {rule}; classes 5-9 and the test split unchanged")
    return raw


@register_dataset("digits", needs_files=False)
def _digits(ctx: BuildContext, *, classes: Sequence[int] | None = None) -> RawData:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes, [1, 8, 8]); no files needed."""
    return select_classes(ctx.with_test(sklearn_source("digits")), classes)


@register_dataset("digits-st", needs_files=False)
def _digits_st(ctx: BuildContext, *, imratio: float = 0.1, test_imratio: float | None = 0.5) -> RawData:
    """digits binarised 0-4 vs 5-9 and imbalanced like MNIST-ST (offline demo); no files needed."""
    raw = binarize(ctx.with_test(sklearn_source("digits")), range(5, 10), _ST_DESC)
    return imbalance(raw, ctx, imratio=imratio, test_imratio=test_imratio, class_ratio=DIGITS_ST_CLASS_RATIO)


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
    if not (is_int(positive_class) and 1 <= positive_class <= 7):
        raise ConfigError(f"covertype positive_class must be a Cover_Type in 1..7, got {positive_class!r}")
    if not isinstance(unit_norm, bool):
        raise ConfigError(f"covertype unit_norm must be True or False, got {unit_norm!r}")
    x, cover, meta, stats = covtype_source(ctx)
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
    raw = RawData(Part(x, y), None, "tabular", k, covtype_scaling(), unit_norm=unit_norm, meta=meta, stats=stats)
    return select_classes(ctx.with_test(raw), classes)


@register_dataset("adult")
def _adult(ctx: BuildContext, *, group: str | None = "sex_race", missing: str = "category") -> RawData:
    """UCI Adult income (>50K = 1), public feature encoding; groups sex x race (or ``sex``, ``race``)."""
    return ctx.with_test(adult_source(ctx, group=group, missing=missing))


@register_dataset("celeba")
def _celeba(
    ctx: BuildContext, *, target: str = "Blond_Hair", group: str = "Male", groups: str = "target_x_attribute"
) -> RawData:
    """CelebA attribute-only stand-in: predict ``target`` from the other attributes; groups target x ``group``."""
    return celeba_source(ctx, target=target, group=group, groups=groups)


@register_dataset("csv", needs_files=False)
def _csv(
    ctx: BuildContext,
    *,
    path: str | None = None,
    test_path: str | None = None,
    label: dict | None = None,
    features: dict | None = None,
    group: dict | None = None,
    missing: str = "error",
    delimiter: str = ",",
    encoding: str = "utf-8",
) -> RawData:
    """Your own CSV file (header line; label, group and features declared with public ranges/categories)."""
    return csv_source(ctx, path=path, test_path=test_path, label=label, features=features, group=group,
                      missing=missing, delimiter=delimiter, encoding=encoding)  # fmt: skip
