"""privopt.data on neighbouring datasets: public preprocessing and per-record selection.

Attack being regressed (end-to-end privacy issue): with training-statistics standardisation one
outlier record moved every other record's scaling, and seeded count-based subsampling changed
thousands of selected MNIST-ST records when one record was added. Here each test builds two
neighbouring source files (one record added) and checks what the other records become.
"""

from __future__ import annotations

import gzip
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from privopt.data import PrivatePreprocessingWarning, formats, load_dataset
from privopt.data.public import BREAST_CANCER_RANGES, IMAGE_NORMALIZATION, covtype_bounds
from privopt.data.selection import lowest_ranked, record_uniforms

# ----------------------------------------------------------------------------- neighbouring files


def _write_idx(path: Path, arr: np.ndarray) -> None:
    magic = bytes([0, 0, 0x08, arr.ndim])
    dims = b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(magic + dims + arr.astype(np.uint8).tobytes())


def _mnist_world(shared: Path, root: Path, n: int, extra: tuple[np.ndarray, int] | None) -> Path:
    """A data dir with the first ``n`` official training images (+ one extra record) and the test files."""
    x = formats.read_idx(shared / "mnist" / "train-images-idx3-ubyte.gz")[:n]
    y = formats.read_idx(shared / "mnist" / "train-labels-idx1-ubyte.gz")[:n]
    if extra is not None:
        x, y = np.concatenate([x, extra[0][None]]), np.concatenate([y, [extra[1]]])
    d = root / "mnist"
    d.mkdir(parents=True)
    _write_idx(d / "train-images-idx3-ubyte.gz", x)
    _write_idx(d / "train-labels-idx1-ubyte.gz", y)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (d / name).symlink_to(shared / "mnist" / name)
    return root


def _covtype_world(shared: Path, root: Path, n: int, extra_row: str | None) -> Path:
    lines = gzip.decompress((shared / "covtype" / "covtype_first20000.data.gz").read_bytes()).decode().splitlines()
    body = lines[:n] + ([extra_row] if extra_row else [])
    (root / "covtype").mkdir(parents=True)
    (root / "covtype" / "covtype.data").write_text("\n".join(body) + "\n")
    return root


def _records(ds, split: str) -> set[tuple[bytes, int]]:
    x, y = ds.split(split)
    return {(r.numpy().tobytes(), int(t)) for r, t in zip(x, y)}


def _without_paths(public_meta: dict) -> dict:
    return {k: v for k, v in public_meta.items() if k != "source"}  # file paths differ (a/ vs b/)


def _extra_records(a, b, split: str) -> tuple[set, set]:
    ra, rb = _records(a, split), _records(b, split)
    return ra - rb, rb - ra


# ----------------------------------------------------------------------------- the regression tests


@pytest.mark.parametrize("scaling", ["public", "unit"])
def test_outlier_does_not_move_other_records_scaling(shared_data, tmp_path, scaling):
    """Adding one outlier row leaves every other record's features bit-identical (and in the same split)."""
    outlier = ",".join(["999999", "359", "89", "99999", "-9999", "99999", "0", "0", "0", "99999"] + ["1"] + ["0"] * 43)
    outlier += ",2"
    kw = dict(val_fraction=0.2, seed=7, scaling=scaling)
    a = load_dataset("covertype", data_dir=_covtype_world(shared_data, tmp_path / "a", 3000, None), **kw)
    b = load_dataset("covertype", data_dir=_covtype_world(shared_data, tmp_path / "b", 3000, outlier), **kw)
    extra = set()
    for split in ("train", "val", "test"):
        only_a, only_b = _extra_records(a, b, split)
        assert not only_a, f"{split}: {len(only_a)} records of the smaller world changed or vanished"
        extra |= only_b
    assert len(extra) == 1  # the outlier itself, clipped into the public bounds
    assert _without_paths(a.public_meta) == _without_paths(b.public_meta)
    lo, hi = covtype_bounds()
    assert float(b.x_train.max()) <= float((hi - lo).max())  # nothing unbounded reaches the features


def test_data_statistics_scaling_is_the_attack(shared_data, tmp_path):
    """The opt-in scaling='data' warns, and the same outlier then moves every record: the test above can fail."""
    outlier = ",".join(["3858", "0", "0", "0", "0", "0", "0", "0", "0", "0"] + ["1"] + ["0"] * 43) + ",2"
    worlds = []
    for name, row in (("a", None), ("b", outlier)):
        with pytest.warns(PrivatePreprocessingWarning, match="NOT|not differentially private"):
            worlds.append(
                load_dataset(
                    "covertype", data_dir=_covtype_world(shared_data, tmp_path / name, 3000, row), scaling="data"
                )
            )
    only_a, _ = _extra_records(worlds[0], worlds[1], "train")
    assert len(only_a) == worlds[0].n_train  # every training record's features moved
    assert worlds[1].public_meta["scaling"]["private_preprocessing"] is True
    assert "standardization" in worlds[1].private_stats


def test_one_record_changes_mnist_st_selection_by_at_most_itself(shared_data, tmp_path):
    """The attack: one positive record added to MNIST. Every split differs by at most that record."""
    test_x = formats.read_idx(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz")
    new = (test_x[8], 7)  # a real digit, label 7 (positive in MNIST-ST)
    kw = dict(val_fraction=0.1, seed=3)
    a = load_dataset("mnist-st", data_dir=_mnist_world(shared_data, tmp_path / "a", 4000, None), **kw)
    b = load_dataset("mnist-st", data_dir=_mnist_world(shared_data, tmp_path / "b", 4000, new), **kw)
    changed = []
    for split in ("train", "val"):
        only_a, only_b = _extra_records(a, b, split)
        assert not only_a
        changed += list(only_b)
    assert len(changed) <= 1
    assert _records(a, "test") == _records(b, "test")
    assert _without_paths(a.public_meta) == _without_paths(b.public_meta)  # public facts ignore the records
    assert "at most that record" in a.public_meta["selection"]["protected_unit"]


def test_max_train_changes_by_at_most_one_swap(shared_data, tmp_path):
    test_x = formats.read_idx(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz")
    kw = dict(seed=1, max_train=1500, scaling="unit")
    a = load_dataset("mnist", data_dir=_mnist_world(shared_data, tmp_path / "a", 3000, None), **kw)
    small = load_dataset("mnist", data_dir=_mnist_world(shared_data, tmp_path / "s", 1000, None), **kw)
    assert _without_paths(small.public_meta) == _without_paths(a.public_meta)  # even when the cap does not bite
    swaps = 0
    for k in range(3):  # several candidate records: some rank inside the cap, some do not
        b = load_dataset("mnist", data_dir=_mnist_world(shared_data, tmp_path / f"b{k}", 3000, (test_x[k], 1)), **kw)
        only_a, only_b = _extra_records(a, b, "train")
        assert len(only_a) == len(only_b) <= 1 and b.n_train == 1500
        swaps += len(only_b)
    assert swaps >= 1  # the swap case was exercised
    assert "swap" in a.public_meta["selection"]["protected_unit"]


def test_train_fraction_is_per_record(shared_data, tmp_path):
    outlier = ",".join(["2000"] * 10 + ["1"] + ["0"] * 43) + ",2"
    kw = dict(seed=2, train_fraction=0.5)
    a = load_dataset("covertype", data_dir=_covtype_world(shared_data, tmp_path / "a", 2000, None), **kw)
    b = load_dataset("covertype", data_dir=_covtype_world(shared_data, tmp_path / "b", 2000, outlier), **kw)
    only_a, only_b = _extra_records(a, b, "train")
    assert not only_a and len(only_b) <= 1
    assert abs(a.n_train - 0.5 * 0.8 * 2000) < 4 * 20


# ----------------------------------------------------------------------------- the selection primitives


def test_record_uniforms_depend_on_content_and_seed_only():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(500, 3, 4), dtype=np.uint8)
    y = rng.integers(0, 10, size=500)
    u = record_uniforms(x, y, seed=5)
    perm = rng.permutation(500)
    np.testing.assert_array_equal(record_uniforms(x[perm], y[perm], seed=5), u[perm])  # order-free
    assert not np.array_equal(record_uniforms(x, y, seed=6), u)
    y2 = y.copy()
    y2[0] = (y[0] + 1) % 10
    changed = np.flatnonzero((record_uniforms(x, y2, seed=5) != u).any(axis=1))
    assert changed.tolist() == [0]  # the label is part of the record
    # Uniform and independent across stages (loose statistical checks on 500 records).
    assert abs(u.mean() - 0.5) < 0.03 and abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.15


def test_lowest_ranked_swap_property():
    u = np.random.default_rng(1).random(100)
    base = set(lowest_ranked(u, 10).tolist())
    for new in (0.0, 0.5, 0.999):
        with_new = set(lowest_ranked(np.append(u, new), 10).tolist())
        assert len(base - with_new) == len(with_new - base) <= 1


# ----------------------------------------------------------------------------- public constants


def test_mnist_public_normalisation_matches_published_constants(shared_data):
    ds = load_dataset("mnist", data_dir=shared_data, max_train=50)
    raw = formats.read_idx(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz")[:5].astype(np.float64)
    mean, std, _ = IMAGE_NORMALIZATION["mnist"]
    want = (raw / 255.0 - mean[0]) / std[0]
    np.testing.assert_allclose(ds.x_test[:5, 0].numpy(), want, atol=1e-5)
    unit = load_dataset("mnist", data_dir=shared_data, max_train=50, scaling="unit")
    np.testing.assert_allclose(unit.x_test[:5, 0].numpy(), raw / 255.0, atol=1e-6)
    none = load_dataset("mnist", data_dir=shared_data, max_train=50, scaling="none")
    np.testing.assert_array_equal(none.x_test[:5, 0].numpy(), raw)


def test_breast_cancer_ranges_are_scikit_learns_published_table():
    from sklearn.datasets import load_breast_cancer

    rows = re.findall(
        r"^[a-z ]+\((?:mean|standard error|worst)\):\s+([\d.]+)\s+([\d.]+)", load_breast_cancer().DESCR, re.M
    )
    assert [(float(a), float(b)) for a, b in rows] == list(BREAST_CANCER_RANGES)
    ds = load_dataset("breast-cancer")
    assert float(ds.x_train.min()) >= 0.0 and float(ds.x_train.max()) <= 1.0 + 1e-6


def test_covertype_bounds_from_documented_ranges(shared_data):
    lo, hi = covtype_bounds()
    assert (lo[1], hi[1]) == (0, 360) and (lo[2], hi[2]) == (0, 90) and (lo[6], hi[8]) == (0, 255)
    assert (lo[10:] == 0).all() and (hi[10:] == 1).all()
    x, _ = formats.read_covtype(shared_data / "covtype" / "covtype_first20000.data.gz")
    outside = ((x < lo) | (x > hi)).mean()
    assert outside < 1e-3  # the public bounds clip almost nothing of the real file
    ds = load_dataset("covertype", data_dir=shared_data, unit_norm=True, val_fraction=0.1)
    for split in ("train", "val", "test"):
        xs = ds.split(split)[0]
        assert float(xs.norm(dim=1).max()) <= 1.0 + 1e-5 and float(xs.min()) >= 0.0


def test_digits_scaled_by_documented_range():
    ds = load_dataset("digits")
    from sklearn.datasets import load_digits

    imgs = load_digits().images
    assert float(ds.x_train.max()) <= 1.0 and float(ds.x_train.min()) >= 0.0
    assert sorted({round(v * 16) for v in ds.x_test.unique().tolist()}) == sorted(np.unique(imgs).astype(int).tolist())


def test_public_and_private_meta_are_separate(shared_data):
    ds = load_dataset("adult", data_dir=shared_data, val_fraction=0.1)
    assert set(ds.meta) == {"public", "private"}
    for key in ("splits", "label_histogram", "group_histogram", "records_per_file"):
        assert key in ds.private_stats and key not in ds.public_meta
    assert ds.public_meta["group_names"] and ds.public_meta["feature_names"]
    assert "selection" in ds.public_meta and "constants" in ds.public_meta["scaling"]


def test_standardize_alias_is_deprecated_and_public():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = load_dataset("digits", standardize=True)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert not any(issubclass(w.category, PrivatePreprocessingWarning) for w in caught)
    assert torch.equal(a.x_train, load_dataset("digits").x_train)
