"""Group data for worst-group risk: Adult (sex x race), CelebA (Blond_Hair x Male), synthetic-groups.

Expected counts come from shared/data/README.md (checked there against the upstream releases).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privopt.data import formats, load_dataset
from privopt.data.adult import ADULT_GROUPINGS, RACE3
from privopt.data.public import ADULT_VOCABULARY
from privopt.data.synthetic import group_means
from privopt.errors import ConfigError


def total(ds, key):
    return [sum(v) for v in zip(*ds.private_stats[key].values())]


def test_adult_sex_race_groups(shared_data):
    ds = load_dataset("adult", data_dir=shared_data, val_fraction=0.1)
    assert sum(ds.private_stats["splits"].values()) == 32561
    assert total(ds, "label_histogram") == [24720, 7841]
    assert ds.group_names == ADULT_GROUPINGS["sex_race"] and ds.num_groups == 6
    g = total(ds, "group_histogram")
    assert sum(g[:3]) == 10771 and sum(g[3:]) == 21790  # README: Female / Male
    assert g[0] + g[3] == 27816 and g[1] + g[4] == 3124  # README: White, Black
    assert g[2] + g[5] == 1039 + 311 + 271  # Asian-Pac-Islander + Amer-Indian-Eskimo + Other
    for split in ("train", "val", "test"):
        gs = ds.groups(split)
        assert gs is not None and gs.shape == ds.split(split)[1].shape and gs.dtype == torch.int64
    # Group ids agree with the features' own sex/race one-hot columns.
    names = ds.public_meta["feature_names"]
    male = ds.x_train[:, names.index("sex=Male")].round().long()
    assert torch.equal(male, (ds.g_train >= 3).long())
    assert "other race" in ds.public_meta["group_rule"]


def test_adult_split_reproducible_and_options(shared_data):
    a = load_dataset("adult", data_dir=shared_data, seed=4)
    b = load_dataset("adult", data_dir=shared_data, seed=4)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.g_train, b.g_train)
    assert abs(a.private_stats["splits"]["test"] - 0.2 * 32561) < 4 * 73  # per-record coins
    assert a.input_shape == (5 + sum(len(v) + 1 for v in ADULT_VOCABULARY.values()),)
    assert float(a.x_train.min()) >= 0.0 and float(a.x_train.max()) <= 1.0 + 1e-6
    sex = load_dataset("adult", data_dir=shared_data, group="sex")
    assert total(sex, "group_histogram") == [10771, 21790]
    race = load_dataset("adult", data_dir=shared_data, group="race", missing="drop")
    assert race.num_groups == 5 and "workclass=?" not in race.public_meta["feature_names"]
    assert sum(race.private_stats["splits"].values()) == 32561 - sum(
        race.private_stats["rows_dropped_missing"].values()
    )
    none = load_dataset("adult", data_dir=shared_data, group=None)
    assert none.g_train is None and none.num_groups == 0
    with pytest.raises(ConfigError, match="group="):
        load_dataset("adult", data_dir=shared_data, group="age")


def test_adult_vocabulary_covers_the_data(shared_data):
    cols, _ = formats.read_adult(shared_data / "adult" / "adult.data.gz")
    for name, vocab in ADULT_VOCABULARY.items():
        assert set(cols[name]) <= set(vocab) | {"?"}, name
    assert set(RACE3) == set(ADULT_VOCABULARY["race"])


def test_celeba_sagawa_groups(shared_data):
    ds = load_dataset("celeba", data_dir=shared_data, max_train=20000, val_fraction=0.05)
    assert ds.input_shape == (38,) and ds.num_classes == 2 and ds.num_groups == 4
    assert "Male" not in ds.public_meta["feature_names"] and "Blond_Hair" not in ds.public_meta["feature_names"]
    assert len(ds.y_test) == 19867  # official validation partition used as test (test rows absent)
    assert "partition 1" in ds.public_meta["test_split"] and "stand-in" in ds.public_meta["stand_in"]
    assert ds.group_names == [
        "not Blond_Hair, not Male",
        "not Blond_Hair, Male",
        "Blond_Hair, not Male",
        "Blond_Hair, Male",
    ]
    names, _, attrs = formats.read_celeba_attributes(shared_data / "celeba" / "list_attr_celeba_train_valid.txt.gz")
    part = formats.read_celeba_partition(shared_data / "celeba" / "list_eval_partition.txt.gz")
    val_rows = np.array([v == 1 for v in part.values()])[: len(attrs)]
    blond, male = attrs[val_rows, names.index("Blond_Hair")], attrs[val_rows, names.index("Male")]
    want = np.bincount(2 * blond + male, minlength=4).tolist()
    assert ds.private_stats["group_histogram"]["test"] == want
    assert torch.equal(ds.g_test // 2, ds.y_test)  # the group encodes the target
    single = load_dataset("celeba", data_dir=shared_data, max_train=1000, groups="attribute")
    assert single.group_names == ["not Male", "Male"]


def test_synthetic_groups_benchmark():
    ds = load_dataset("synthetic-groups", num_groups=3, dim=6, n_train=900, n_test_per_group=300, seed=2)
    assert ds.num_groups == 3 and ds.input_shape == (6,) and ds.n_train == 900
    assert ds.private_stats["group_histogram"]["train"] == [300, 300, 300]
    assert ds.private_stats["group_histogram"]["test"] == [300, 300, 300]
    assert float(ds.x_train.norm(dim=1).max()) <= 1.0 + 1e-6
    again = load_dataset("synthetic-groups", num_groups=3, dim=6, n_train=900, n_test_per_group=300, seed=2)
    assert torch.equal(ds.x_train, again.x_train)
    # Each group's labels follow its own direction: the group mean direction separates the classes.
    mu = torch.tensor(group_means(num_groups=3, dim=6, separation=2.0, spread=90.0), dtype=torch.float32)
    for i in range(3):
        sel = ds.g_test == i
        score = ds.x_test[sel] @ mu[i]
        acc = float(((score > 0).long() == ds.y_test[sel]).float().mean())
        assert acc > 0.8
    skew = load_dataset("synthetic-groups", num_groups=2, n_train=1000, group_fractions=[0.9, 0.1])
    assert skew.private_stats["group_histogram"]["train"] == [900, 100]
    with pytest.raises(ConfigError, match="group_fractions"):
        load_dataset("synthetic-groups", num_groups=2, group_fractions=[0.5, 0.6])
    with pytest.raises(ConfigError, match="n_train"):
        load_dataset("synthetic-groups", n_train=0)
