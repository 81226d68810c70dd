"""privopt.data: real-format parsers, corrupt/missing files, registry pipeline, DRO variants, samplers.

Expected counts come from shared/data/README.md (checked there against upstream releases), not
from our own code.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from privopt.data import (
    available_datasets,
    dataset_options,
    describe_datasets,
    formats,
    load_dataset,
    shard_by_label,
)
from privopt.errors import ConfigError, DataError

MNIST_HIST = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
MNIST_TRAIN_HIST = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
CIFAR_TRAIN_HIST = [202, 191, 203, 195, 214, 183, 207, 199, 203, 203]
CIFAR_TEST_HIST = [103, 89, 100, 103, 90, 86, 112, 102, 106, 109]
COVTYPE_HIST = [2942, 6022, 2160, 2160, 2396, 2160, 2160]


def total_hist(ds):
    return [sum(v) for v in zip(*ds.private_stats["label_histogram"].values())]


def hist(ds, split):
    return ds.private_stats["label_histogram"][split]


# ----------------------------------------------------------------------------- real files


def test_idx_mnist_counts_and_histogram(shared_data):
    x = formats.read_idx(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz", expect_ndim=3)
    y = formats.read_idx(shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz", expect_ndim=1)
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == MNIST_HIST
    assert abs(x.mean() - 33.79) < 0.01


def test_idx_fashion_counts(shared_data):
    x = formats.read_idx(shared_data / "fashion-mnist" / "t10k-images-idx3-ubyte.gz")
    y = formats.read_idx(shared_data / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz")
    assert x.shape == (10000, 28, 28)
    assert np.bincount(y).tolist() == [1000] * 10
    assert abs(x.mean() - 73.15) < 0.01


def test_cifar_records(shared_data):
    xtr, ytr = formats.read_cifar_bin(shared_data / "cifar10" / "cifar10_train_first2000.bin.gz")
    xte, yte = formats.read_cifar_bin(shared_data / "cifar10" / "cifar10_test_first1000.bin.gz")
    assert xtr.shape == (2000, 3, 32, 32) and xte.shape == (1000, 3, 32, 32)
    assert np.bincount(ytr).tolist() == CIFAR_TRAIN_HIST
    assert np.bincount(yte).tolist() == CIFAR_TEST_HIST
    assert ytr[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert yte[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    np.testing.assert_allclose(xtr.mean(axis=(0, 2, 3)), [125.3, 123.3, 113.9], atol=0.1)
    assert formats.read_class_names(shared_data / "cifar10" / "batches.meta.txt")[0] == "airplane"


def test_covtype_rows(shared_data):
    x, y = formats.read_covtype(shared_data / "covtype" / "covtype_first20000.data.gz")
    assert x.shape == (20000, 54)
    assert np.bincount(y, minlength=8)[1:].tolist() == COVTYPE_HIST
    assert x[0, :10].tolist() == [2596, 51, 3, 258, 0, 510, 221, 232, 148, 6279]
    assert (x[:, 10:14].sum(1) == 1).all() and (x[:, 14:54].sum(1) == 1).all()


def test_adult_rows(shared_data):
    cols, label = formats.read_adult(shared_data / "adult" / "adult.data.gz")
    assert len(label) == 32561
    assert int(label.sum()) == 7841
    assert int((cols["sex"] == "Male").sum()) == 21790
    assert int((cols["workclass"] == "?").sum()) == 1836
    assert int((cols["native-country"] == "?").sum()) == 583


def test_celeba_annotations(shared_data):
    names, ids, attrs = formats.read_celeba_attributes(shared_data / "celeba" / "list_attr_celeba_train_valid.txt.gz")
    part = formats.read_celeba_partition(shared_data / "celeba" / "list_eval_partition.txt.gz")
    assert len(names) == 40 and attrs.shape == (182637, 40) and ids[0] == "000001.jpg"
    assert set(np.unique(attrs)) == {0, 1}
    assert round(float(attrs[:, names.index("Male")].mean()), 3) == 0.420
    assert len(part) == 202599
    assert np.bincount(list(part.values())).tolist() == [162770, 19867, 19962]


# ----------------------------------------------------------------------------- corrupt / missing


def _copy_mnist(shared_data: Path, tmp_path: Path) -> Path:
    d = tmp_path / "mnist"
    d.mkdir()
    for f in (shared_data / "mnist").iterdir():
        shutil.copy(f, d / f.name)
        (d / f.name).chmod(0o644)
    return d


def _rewrite_gz(path: Path, raw: bytes) -> None:
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(raw)


def test_truncated_idx_names_file(shared_data, tmp_path):
    d = _copy_mnist(shared_data, tmp_path)
    img = d / "t10k-images-idx3-ubyte.gz"
    _rewrite_gz(img, gzip.decompress(img.read_bytes())[:-100])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz.*truncated"):
        load_dataset("mnist", data_dir=tmp_path)


def test_bad_magic_names_file(shared_data, tmp_path):
    d = _copy_mnist(shared_data, tmp_path)
    lab = d / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(lab.read_bytes()))
    raw[2] = 0x42
    _rewrite_gz(lab, bytes(raw))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz.*magic"):
        load_dataset("mnist", data_dir=tmp_path)


def test_bad_gzip_names_file(shared_data, tmp_path):
    d = _copy_mnist(shared_data, tmp_path)
    img = d / "t10k-images-idx3-ubyte.gz"
    img.write_bytes(img.read_bytes()[: len(img.read_bytes()) // 2])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz.*gzip"):
        load_dataset("mnist", data_dir=tmp_path)


def test_image_label_count_mismatch(shared_data, tmp_path):
    d = _copy_mnist(shared_data, tmp_path)
    lab = d / "t10k-labels-idx1-ubyte.gz"
    raw = gzip.decompress(lab.read_bytes())
    _rewrite_gz(lab, raw[:4] + (9999).to_bytes(4, "big") + raw[8:-1])
    with pytest.raises(DataError, match="10000 images but .* 9999 labels"):
        load_dataset("mnist", data_dir=tmp_path)


def test_missing_partner_file(shared_data, tmp_path):
    d = _copy_mnist(shared_data, tmp_path)
    (d / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"labels file .*t10k-labels-idx1-ubyte.* is missing"):
        load_dataset("mnist", data_dir=tmp_path)


def test_uncompressed_and_official_train_names(shared_data, tmp_path):
    # Full official layout: uncompressed train-* files next to gzipped t10k-* files.
    d = _copy_mnist(shared_data, tmp_path)
    raw_img = gzip.decompress((d / "t10k-images-idx3-ubyte.gz").read_bytes())
    raw_lab = gzip.decompress((d / "t10k-labels-idx1-ubyte.gz").read_bytes())
    (d / "train-images-idx3-ubyte").write_bytes(raw_img)
    (d / "train-labels-idx1-ubyte").write_bytes(raw_lab)
    ds = load_dataset("mnist", data_dir=tmp_path, scaling="unit")
    assert ds.public_meta["test_split"] == "official test split"
    assert hist(ds, "train") == MNIST_HIST
    assert hist(ds, "test") == MNIST_HIST
    with pytest.warns(UserWarning, match="official test split"):
        load_dataset("mnist", data_dir=tmp_path, test_fraction=0.3)


def test_cifar_wrong_record_size(shared_data, tmp_path):
    d = tmp_path / "cifar10"
    d.mkdir()
    raw = gzip.decompress((shared_data / "cifar10" / "cifar10_test_first1000.bin.gz").read_bytes())
    (d / "test_batch.bin").write_bytes(raw[:-5])
    with pytest.raises(DataError, match=r"test_batch\.bin.*3073"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_covtype_nan_and_bad_row(tmp_path):
    d = tmp_path / "covtype"
    d.mkdir()
    row = ",".join(["1"] * 54 + ["3"])
    (d / "covtype.data").write_text(row + "\n" + ",".join(["nan"] * 54 + ["3"]) + "\n")
    with pytest.raises(DataError, match=r"covtype\.data: some line has a non-finite value"):
        load_dataset("covertype", data_dir=tmp_path)
    (d / "covtype.data").write_text(row + "\n" + ",".join(["1"] * 53 + ["3"]) + "\n")
    with pytest.raises(DataError, match=r"covtype\.data: some line does not have 55 fields"):
        load_dataset("covertype", data_dir=tmp_path)
    (d / "covtype.data").write_text(row + "\n" + ",".join(["1"] * 54 + ["9"]) + "\n")
    with pytest.raises(
        DataError, match=r"covtype\.data: field 55 \(Cover_Type\) of some line is not an integer 1\.\.7"
    ):
        load_dataset("covertype", data_dir=tmp_path)


def test_celeba_truncated(shared_data, tmp_path):
    d = tmp_path / "celeba"
    d.mkdir()
    shutil.copy(shared_data / "celeba" / "list_eval_partition.txt.gz", d)
    lines = gzip.decompress((shared_data / "celeba" / "list_attr_celeba_train_valid.txt.gz").read_bytes()).splitlines()
    (d / "list_attr_celeba.txt").write_bytes(b"\r\n".join(lines[:1000]))
    with pytest.raises(DataError, match=r"list_attr_celeba\.txt: header says 182637 rows"):
        load_dataset("celeba", data_dir=tmp_path)


@pytest.mark.parametrize(
    "country, income, match",
    [
        ("United-States", "maybe", r"adult\.data: field 15 \(income\) of some line is neither '<=50K' nor '>50K'"),
        ("Atlantis", "<=50K", r"adult\.data: native-country of some record is not in the adult.names vocabulary"),
    ],
)
def test_adult_bad_row(tmp_path, country, income, match):
    d = tmp_path / "adult"
    d.mkdir()
    (d / "adult.data").write_text(
        "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
        f"2174, 0, 40, {country}, {income}\n"
    )
    with pytest.raises(DataError, match=match) as err:
        load_dataset("adult", data_dir=tmp_path)
    said = str(err.value).split("adult.data: ", 1)[1]  # (the test's folder is named after its parameters)
    assert country not in said and "maybe" not in said  # the column, never the value
    assert "line 1" not in said and "row" not in said and "1 record" not in said  # nor which, nor how many


def _secret_in_message(path, text, load) -> str:
    path.write_text(text)
    with pytest.raises(DataError) as err:
        load()
    assert "SECRET" not in str(err.value)  # a field of a data file is a record's data
    return str(err.value)


def test_parse_errors_name_file_and_field_never_the_record(tmp_path):
    row = ",".join(["1"] * 54 + ["3"])
    (tmp_path / "covtype").mkdir()
    cov = lambda: load_dataset("covertype", data_dir=tmp_path)
    bad = ",".join(["1"] * 6 + ["SECRET"] + ["1"] * 47 + ["3"])
    msg = _secret_in_message(tmp_path / "covtype" / "covtype.data", f"{row}\n{bad}\n", cov)
    assert msg.endswith("covtype.data: field 7 of some line is not a number")  # not which line: a record
    (tmp_path / "adult").mkdir()
    adult = "39, State-gov, {}, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
    adult += "2174, 0, 40, Cuba, <=50K\n"
    msg = _secret_in_message(
        tmp_path / "adult" / "adult.data",
        adult.format(77516) + adult.format("SECRET"),
        lambda: load_dataset("adult", data_dir=tmp_path),
    )
    assert msg.endswith("adult.data: field 3 ('fnlwgt') of some line is not a number")
    parts = tmp_path / "list_eval_partition.txt"
    msg = _secret_in_message(parts, "a.jpg 0\nb.jpg SECRET\n", lambda: formats.read_celeba_partition(parts))
    assert msg.endswith("list_eval_partition.txt: line 2, field 2 (partition) is not 0, 1 or 2")
    msg = _secret_in_message(parts, "a.jpg 0 SECRET\n", lambda: formats.read_celeba_partition(parts))
    assert msg.endswith("line 1 does not have 2 fields ('<image> <0|1|2>')")  # public metadata: the line is named
    attrs = tmp_path / "list_attr_celeba.txt"
    msg = _secret_in_message(
        attrs, "2\nSmiling Male\na.jpg 1 -1\nb.jpg SECRET 1\n", lambda: formats.read_celeba_attributes(attrs)
    )
    assert msg.endswith("list_attr_celeba.txt: field 2 (attribute 'Smiling') of some row is neither 1 nor -1")
    msg = _secret_in_message(attrs, "SECRET\nSmiling\n", lambda: formats.read_celeba_attributes(attrs))
    assert msg.endswith("list_attr_celeba.txt: line 1 is not the row count (an integer)")


def test_missing_directories(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("mnist", data_dir=tmp_path / "nope")
    with pytest.raises(DataError, match=r"no folder .*mnist"):
        load_dataset("mnist", data_dir=tmp_path)
    (tmp_path / "mnist").mkdir()
    with pytest.raises(DataError, match="no IDX files found"):
        load_dataset("mnist", data_dir=tmp_path)
    monkeypatch.delenv("PRIVOPT_DATA", raising=False)
    with pytest.raises(DataError, match="PRIVOPT_DATA"):
        load_dataset("mnist")


def test_a_missing_relative_data_dir_is_shown_where_it_was_looked_for(tmp_path, monkeypatch):
    """The shipped configs say `data_dir: ../shared/data`, which is read from the current directory (and
    then $PRIVOPT_DATA is not used): the message says where that was."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVOPT_DATA", str(tmp_path))
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir="../shared/data")
    assert str(e.value) == (
        f"data directory ../shared/data ({tmp_path.parent / 'shared' / 'data'}, from the current directory) "
        "does not exist (or is not a directory)"
    )


def test_env_var_data_dir(shared_data, monkeypatch):
    monkeypatch.setenv("PRIVOPT_DATA", str(shared_data))
    assert hist(load_dataset("cifar10"), "test") == CIFAR_TEST_HIST


# ----------------------------------------------------------------------------- registry


def test_registry_names_and_errors():
    names = available_datasets()
    for n in (
        "mnist",
        "mnist-st",
        "fashion-mnist",
        "cifar10",
        "cifar10-st",
        "celeba",
        "covertype",
        "adult",
        "digits",
        "digits-st",
        "breast-cancer",
    ):
        assert n in names
    with pytest.raises(ConfigError, match="unknown dataset 'mnsit'.*mnist-st"):
        load_dataset("mnsit")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['imbalance'\].*imratio"):
        load_dataset("digits-st", imbalance=0.1)
    bads = ({"val_fraction": 1.0}, {"test_fraction": 0.0}, {"max_train": 0}, {"seed": 1.5}, {"scaling": "zscore"})
    for bad in bads + ({"train_fraction": 1.0}, {"standardize": "yes"}):
        with pytest.raises(ConfigError):
            load_dataset("digits", **bad)
    assert dataset_options("mnist-st") == {"imratio": 0.1, "test_imratio": 0.5}


def test_embedded_datasets_need_no_files(monkeypatch):
    monkeypatch.delenv("PRIVOPT_DATA", raising=False)
    ds = load_dataset("digits")
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert len(ds.y_train) + len(ds.y_test) == 1797
    bc = load_dataset("breast-cancer", val_fraction=0.2)
    assert bc.input_shape == (30,) and bc.num_classes == 2
    assert len(bc.y_train) + len(bc.y_val) + len(bc.y_test) == 569
    assert total_hist(bc) == [212, 357]


def test_splits_deterministic_disjoint_and_proportional(shared_data):
    a = load_dataset("covertype", data_dir=shared_data, seed=3, val_fraction=0.1, scaling="unit")
    b = load_dataset("covertype", data_dir=shared_data, seed=3, val_fraction=0.1, scaling="unit")
    c = load_dataset("covertype", data_dir=shared_data, seed=4, val_fraction=0.1, scaling="unit")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_test, c.x_test)
    # README: all 20,000 rows are distinct, so disjoint splits give 20,000 distinct rows in total.
    rows = {tuple(r) for x in (a.x_train, a.x_val, a.x_test) for r in x.tolist()}
    assert len(rows) == 20000
    # Independent per-record coins: sizes are binomial (4 std ~ 230 records for the test split).
    sizes = a.private_stats["splits"]
    assert abs(sizes["test"] - 4000) < 230 and abs(sizes["val"] - 1600) < 200
    # binary = Cover_Type 2 vs rest: 6022 positives overall (README class counts).
    assert total_hist(a) == [20000 - 6022, 6022]
    for s in ("train", "val", "test"):
        h = hist(a, s)
        assert abs(h[1] / sum(h) - 6022 / 20000) < 0.05


def test_mnist_official_splits(shared_data):
    ds = load_dataset("mnist", data_dir=shared_data, max_train=3000)
    assert ds.private_stats["splits"]["test"] == 10000
    assert hist(ds, "test") == MNIST_HIST
    assert ds.private_stats["splits"]["train"] == 3000  # capped from the 60,000 official training images
    x = formats.read_idx(shared_data / "mnist" / "train-labels-idx1-ubyte.gz", expect_ndim=1)
    assert np.bincount(x).tolist() == MNIST_TRAIN_HIST


def test_mnist_only_t10k_is_carved(shared_data, tmp_path):
    only_test = tmp_path / "mnist"
    only_test.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (only_test / name).symlink_to(shared_data / "mnist" / name)
    ds = load_dataset("mnist", data_dir=tmp_path, test_fraction=0.25, max_train=3000)
    assert ds.input_shape == (1, 28, 28)
    assert abs(ds.private_stats["splits"]["test"] - 2500) < 4 * 44 and ds.private_stats["splits"]["train"] == 3000
    assert "carved per record" in ds.public_meta["test_split"]
    assert any("only the official test" in p for p in ds.public_meta["preprocessing"])
    # per-record coins: each class keeps about its share (4 binomial std)
    for k, h in enumerate(hist(ds, "test")):
        assert abs(h - MNIST_HIST[k] / 4) <= 4 * (MNIST_HIST[k] * 0.25 * 0.75) ** 0.5


def test_classes_option(shared_data):
    ds = load_dataset("fashion-mnist", data_dir=shared_data, classes=[7, 3])
    assert ds.num_classes == 2
    assert total_hist(ds) == [7000, 7000]  # 6,000 training + 1,000 test images per class
    assert ds.class_names == ["Sneaker", "Dress"]
    with pytest.raises(ConfigError, match="classes"):
        load_dataset("fashion-mnist", data_dir=shared_data, classes=[3, 3])


# ----------------------------------------------------------------------------- DRO / task variants


@pytest.mark.parametrize("imratio", [0.1, 0.2])
def test_mnist_st_imbalance(shared_data, imratio):
    ds = load_dataset("mnist-st", data_dir=shared_data, imratio=imratio, val_fraction=0.1)
    tr = np.add(hist(ds, "train"), hist(ds, "val"))
    # Majority class (digits 0-4) of the official 60,000-image training set kept whole.
    assert tr[0] == sum(MNIST_TRAIN_HIST[:5])
    # Positives (29,404) kept with probability imratio/(1-imratio) * 30,596/29,404: binomial, 4 std.
    n_neg, n_pos = sum(MNIST_TRAIN_HIST[:5]), sum(MNIST_TRAIN_HIST[5:])
    p = imratio / (1 - imratio) * n_neg / n_pos
    assert abs(tr[1] - n_pos * p) < 4 * (n_pos * p * (1 - p)) ** 0.5
    assert abs(tr[1] / tr.sum() - imratio) < 0.005
    te = hist(ds, "test")
    assert te[0] == te[1] == sum(MNIST_HIST[5:])  # balanced exactly: negatives cut to the 4,861 positives
    assert ds.num_classes == 2 and int(ds.y_train.max()) == 1


def test_digits_st_and_keep_test():
    ds = load_dataset("digits-st", imratio=0.25, test_imratio=None, seed=5)
    h = ds.private_stats["label_histogram"]
    assert abs(h["train"][1] / sum(h["train"]) - 0.25) < 0.05
    assert abs(sum(h["test"]) - 0.2 * 1797) < 4 * 17  # carved test split, untouched by test_imratio=None


def test_cifar10_st_keeps_last_images(shared_data):
    ds = load_dataset("cifar10-st", data_dir=shared_data, scaling="unit", minority_count=100, minority_fraction=None)
    assert hist(ds, "train") == [100] * 5 + CIFAR_TRAIN_HIST[5:]
    assert hist(ds, "test") == CIFAR_TEST_HIST
    assert "count-based" in ds.public_meta["selection"]["protected_unit"]
    x, y = formats.read_cifar_bin(shared_data / "cifar10" / "cifar10_train_first2000.bin.gz")
    want = {bytes(im) for im in x[y == 0][-100:]}
    got = {bytes(np.rint(im.numpy() * 255).astype(np.uint8)) for im in ds.x_train[ds.y_train == 0]}
    assert got == want
    frac = load_dataset("cifar10-st", data_dir=shared_data, minority_fraction=0.5)
    h = hist(frac, "train")
    assert h[5:] == CIFAR_TRAIN_HIST[5:]
    for got, full in zip(h[:5], CIFAR_TRAIN_HIST[:5]):  # each kept with probability 0.5: 4 std
        assert abs(got - full / 2) < 4 * (full / 4) ** 0.5
    assert "one record of the source" in frac.public_meta["selection"]["protected_unit"]
    with pytest.raises(ConfigError, match="exactly one"):
        load_dataset("cifar10-st", data_dir=shared_data, minority_count=100)


def test_covertype_unit_norm(shared_data):
    ds = load_dataset("covertype", data_dir=shared_data, unit_norm=True, val_fraction=0.1)
    for x in (ds.x_train, ds.x_val, ds.x_test):
        assert float(x.norm(dim=1).max()) <= 1.0 + 1e-5 and float(x.min()) >= 0.0
    multi = load_dataset("covertype", data_dir=shared_data, task="multiclass")
    assert total_hist(multi) == COVTYPE_HIST


def test_shard_by_label():
    y = np.repeat(np.arange(10), 60)
    shards = shard_by_label(y, 5, rng=np.random.default_rng(0))
    assert sorted(np.concatenate(shards).tolist()) == list(range(600))
    assert all(len(np.unique(y[s])) <= 3 for s in shards)
    iid = shard_by_label(y, 5, rng=np.random.default_rng(0), iid=True)
    assert all(len(np.unique(y[s])) == 10 for s in iid)


def test_describe_datasets():
    info = describe_datasets()
    assert set(info) == set(available_datasets())
    assert info["digits"]["needs_files"] is False and info["mnist"]["needs_files"] is True
    assert info["covertype"]["options"]["unit_norm"] is False
    assert all(v["description"] for v in info.values())
