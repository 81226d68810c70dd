"""Fixed feature extractors: per-record (no statistic of the data), cached exactly, clear errors."""

import pytest
import torch

from privopt.data import Dataset
from privopt.data.features import apply_features, available_features, build_feature_map, feature_cache_dir
from privopt.errors import ConfigError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVOPT_CACHE", str(tmp_path))
    return tmp_path


def _images(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g)


def _dataset(x, **kw):
    y = torch.arange(x.shape[0]) % 2
    return Dataset.from_tensors(x, y, x_test=x[:4], y_test=y[:4], num_classes=2, **kw)


def test_scattering_is_a_per_record_function():
    x = _images()
    fmap = build_feature_map("scattering", input_shape=(1, 8, 8), J=1)
    together = fmap.transform(x)
    alone = torch.cat([fmap.transform(x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.allclose(together, alone, atol=1e-6)
    # Another dataset around record 0 leaves its features unchanged: nothing depends on the other records.
    other = torch.cat([x[:1], _images(seed=1)[1:]])
    assert torch.allclose(fmap.transform(other)[0], together[0], atol=1e-6)
    assert torch.allclose(together.norm(dim=1), torch.ones(x.shape[0]), atol=1e-5)


def test_apply_features_replaces_every_split_and_notes_it(cache):
    ds = _dataset(_images())
    f = apply_features(ds, "scattering", J=1)
    assert f.input_shape == (144,) and f.x_train.shape == (12, 144) and f.x_test.shape == (4, 144)
    assert f.x_val.shape == (0, 144) and f.x_train.dtype == torch.float32
    assert "scattering(J=1, L=8, groups=27)" in f.meta["public"]["features"]
    assert torch.equal(f.y_train, ds.y_train)
    assert apply_features(ds, None) is ds and apply_features(ds, "none") is ds


def test_scale_multiplies_the_cached_features_by_a_public_constant(cache):
    ds = _dataset(_images())
    unit = apply_features(ds, "scattering", J=1)
    scaled = apply_features(ds, "scattering", J=1, scale=64.0)  # a cache hit, then scaled
    assert torch.allclose(scaled.x_train, 64.0 * unit.x_train) and torch.allclose(scaled.x_test, 64.0 * unit.x_test)
    assert torch.allclose(scaled.x_train.norm(dim=1), torch.full((12,), 64.0), rtol=1e-3)
    assert "x 64" in scaled.meta["public"]["features"]
    for bad in (0.0, -1.0, float("inf"), True, "64"):
        with pytest.raises(ConfigError, match="feature scale"):
            apply_features(ds, "scattering", J=1, scale=bad)
    with pytest.raises(ConfigError, match="without a feature map"):
        apply_features(ds, None, scale=2.0)


def test_cache_reuses_records_across_splits_and_recovers_from_torn_blocks(cache):
    x = _images(16)
    first = apply_features(_dataset(x[:12]), "scattering", J=1)
    blocks = list(feature_cache_dir().rglob("*.pt"))
    assert blocks and all(b.stat().st_mode & 0o077 == 0 for b in blocks)  # private to its owner
    # A dataset sharing 12 records with the cached one computes only the 4 new ones.
    second = apply_features(_dataset(x[4:]), "scattering", J=1)
    assert torch.equal(second.x_train[:8], first.x_train[4:12])
    uncached = apply_features(_dataset(x[4:]), "scattering", J=1, cache=False)
    assert torch.equal(second.x_train, uncached.x_train)
    for b in feature_cache_dir().rglob("*.pt"):
        b.write_bytes(b"torn")
    again = apply_features(_dataset(x[4:]), "scattering", J=1)
    assert torch.equal(again.x_train, uncached.x_train)


def test_pooling_averages_each_channel_map_after_the_cache(cache):
    ds = _dataset(_images())
    full = apply_features(ds, "scattering", J=1)  # 9 channels of 4x4 maps
    pooled = apply_features(ds, "scattering", J=1, pool=2, scale=8.0)
    assert len(list(feature_cache_dir().iterdir())) == 1  # one cache: the pooled map reuses the coefficients
    maps = full.x_train.reshape(12, 9, 2, 2, 2, 2)  # [n, channel, row block, row, col block, col]
    expected = maps.mean(dim=(3, 5)).reshape(12, -1)
    expected = 8.0 * expected / expected.norm(dim=1, keepdim=True)
    assert pooled.input_shape == (36,) and pooled.x_val.shape == (0, 36)
    torch.testing.assert_close(pooled.x_train, expected)
    assert "pool=2" in pooled.meta["public"]["features"]


@pytest.mark.parametrize(
    ("name", "shape", "params", "match"),
    [
        ("nope", (1, 8, 8), {}, "unknown feature map"),
        ("scattering", (30,), {}, "image inputs"),
        ("scattering", (1, 8, 8), {"J": 4}, "at least 16x16"),
        ("scattering", (1, 8, 8), {"J": 0}, "positive integer"),
        ("scattering", (1, 8, 8), {"width": 3}, "width"),
        ("scattering", (1, 8, 8), {"J": 1, "pool": 0}, "pool must be a positive integer"),
        ("scattering", (1, 8, 8), {"J": 1, "pool": 5}, "pool=5 exceeds the 4x4 maps"),
    ],
)
def test_bad_feature_requests_fail_clearly(name, shape, params, match):
    with pytest.raises(ConfigError, match=match):
        build_feature_map(name, input_shape=shape, **params)


def test_an_unknown_option_is_named_beside_the_valid_ones():
    """A typo in a config's `features:` used to surface as Python's "ScatteringFeatures.__init__() got an
    unexpected keyword argument 'scal'", without the options the map takes."""
    with pytest.raises(ConfigError) as e:
        build_feature_map("scattering", input_shape=(1, 8, 8), scal=64.0, J=1)
    assert str(e.value) == (
        "feature map 'scattering': unknown option(s) ['scal']; its options: J, L, groups, pool (and scale, for any map)"
    )


def test_registry_lists_scattering():
    assert available_features() == ["none", "scattering"]
    with pytest.raises(ConfigError, match="without a feature map"):
        apply_features(_dataset(_images()), None, J=1)
