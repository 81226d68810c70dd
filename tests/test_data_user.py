"""Your own data as a Dataset: from_tensors / from_numpy, the dtype rule, clear errors, validate()."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from privopt.data import Dataset, PrivatePreprocessingWarning, ensure_dataset
from privopt.errors import DataError


def _xy(n=40, d=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64).to(dtype)
    return x, (x[:, 0] > 0.5).long()


def test_from_tensors_builds_a_valid_dataset():
    x, y = _xy()
    xt, yt = _xy(10, seed=1)
    groups, gt = y.clone(), yt.clone()
    ds = Dataset.from_tensors(
        x, y, x_test=xt, y_test=yt, groups=groups, groups_test=gt, num_classes=2, group_names=["a", "b"], name="mine"
    )
    assert ds.name == "mine" and ds.input_shape == (3,) and ds.n_train == 40 and len(ds.y_test) == 10
    assert ds.num_groups == 2 and ds.group_names == ["a", "b"] and torch.equal(ds.g_test, gt)
    assert ds.x_val.shape == (0, 3) and ds.g_val.shape == (0,)
    assert ds.private_stats["label_histogram"]["train"] == torch.bincount(y, minlength=2).tolist()
    assert "public constants" in ds.public_meta["preprocessing"][0]


def test_float64_and_other_dtypes_are_cast_by_the_documented_rule():
    x64, y = _xy(dtype=torch.float64)
    ds = Dataset.from_tensors(x64, y, num_classes=2)
    assert ds.x_train.dtype == torch.float32
    torch.testing.assert_close(ds.x_train, x64.float())  # round to nearest
    assert "float64 features cast to float32" in ds.public_meta["preprocessing"][0]
    ints = Dataset.from_tensors(torch.randint(0, 5, (20, 2)), torch.zeros(20, dtype=torch.uint8), num_classes=2)
    assert ints.x_train.dtype == torch.int64 and ints.y_train.dtype == torch.int64  # integer ids stay integer
    half = Dataset.from_tensors(x64.half(), y.bool(), num_classes=2)
    assert half.x_train.dtype == torch.float32 and half.y_train.dtype == torch.int64
    with pytest.raises(DataError, match="beyond float32's range") as e:
        Dataset.from_tensors(torch.full((4, 2), 1e300, dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    assert "1e+300" not in str(e.value)  # a training record's value is never printed


def test_from_numpy_matches_from_tensors():
    rng = np.random.default_rng(0)
    x = rng.random((30, 2, 3, 3))  # float64 images
    y = rng.integers(0, 3, 30)
    ds = Dataset.from_numpy(x, y, x_test=x[:5], y_test=y[:5], num_classes=3)
    ref = Dataset.from_tensors(torch.from_numpy(x), torch.from_numpy(y), num_classes=3)
    assert ds.input_shape == (2, 3, 3) and torch.equal(ds.x_train, ref.x_train)
    with pytest.raises(DataError, match="NumPy array, got list"):
        Dataset.from_numpy(x.tolist(), y)
    with pytest.raises(DataError, match="use Dataset.from_tensors"):
        Dataset.from_numpy(torch.from_numpy(x), y)
    with pytest.raises(DataError, match="dtype <U1"):
        Dataset.from_numpy(x, np.array(["a"] * 30))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, y: Dataset.from_tensors(x.numpy(), y), "use Dataset.from_numpy"),
        (lambda x, y: Dataset.from_tensors((x, y), y), "x must be a torch.Tensor, got tuple"),
        (lambda x, y: Dataset.from_tensors(x[:, 0], y), r"shape \[N, features...\].*unsqueeze"),
        (lambda x, y: Dataset.from_tensors(x, y[:-1]), "y has 39 entries for 40 feature rows"),
        (lambda x, y: Dataset.from_tensors(x, y.float()), "integer ids, got torch.float32"),
        (lambda x, y: Dataset.from_tensors(x, y[:, None]), r"1-D \[N\]"),
        (lambda x, y: Dataset.from_tensors(x, y, x_test=x[:5, :2], y_test=y[:5]), "test features have shape"),
        (lambda x, y: Dataset.from_tensors(x, y, x_test=x[:5]), "give both x_test and y_test"),
        (lambda x, y: Dataset.from_tensors(x, y, num_classes=1), "labels outside 0..0"),
        (lambda x, y: Dataset.from_tensors(x, y, groups=y, x_test=x[:4], y_test=y[:4]), "pass groups_test"),
        (lambda x, y: Dataset.from_tensors(x, y, groups=y + 5, group_names=["a"]), r"group ids outside 0..0"),
        (lambda x, y: Dataset.from_tensors(x.to(torch.complex64), y), "complex"),
    ],
)
def test_bad_inputs_get_clear_errors(call, match):
    x, y = _xy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivatePreprocessingWarning)
        with pytest.raises(DataError, match=match):
            call(x, y)


def test_inferring_num_classes_warns():
    x, y = _xy()
    with pytest.warns(PrivatePreprocessingWarning, match="num_classes=2 inferred"):
        ds = Dataset.from_tensors(x, y)
    assert ds.num_classes == 2


def test_validate_flags_absurd_magnitudes_and_casts():
    x, y = _xy()
    x[3, 1] = 1e37  # finite, but far beyond anything scaled with public constants
    with pytest.raises(DataError, match=r"train split has a feature of magnitude above 1e\+06.*public constants") as e:
        Dataset.from_tensors(x, y, num_classes=2)
    assert "1e+37" not in str(e.value)  # a training record's value is never printed
    with pytest.raises(DataError, match=r"test split has a feature of magnitude 1e\+37"):
        Dataset.from_tensors(_xy()[0], y, x_test=x, y_test=y, num_classes=2)  # test records are public
    x2, _ = _xy(dtype=torch.float64)
    ds = Dataset(
        name="raw", x_train=x2, y_train=y.int(), x_val=x2[:0], y_val=y[:0], x_test=x2[:4], y_test=y[:4],
        num_classes=2, input_shape=(3,),
    )  # fmt: skip
    assert ds.validate().x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    with pytest.raises(DataError, match="magnitude"):
        ds.validate(max_abs=0.5)


def test_ensure_dataset():
    x, y = _xy()
    ds = Dataset.from_tensors(x, y, num_classes=2)
    assert ensure_dataset(ds) is ds
    with pytest.raises(DataError, match="got tuple; build one with Dataset.from_tensors"):
        ensure_dataset((x, y))


def test_docs_bring_your_own_data_example_runs(tmp_path, monkeypatch):
    """The runnable example of docs/data.md ("Bring your own data") trains end to end."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    section = doc[doc.index("## Bring your own data") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/data.md", "exec"), scope)
    assert scope["data"].num_groups == 2 and scope["data"].x_train.dtype == torch.float32
    assert 0 < scope["record"]["privacy"]["epsilon_spent"] <= 1.0 + 1e-6
    assert (tmp_path / "runs" / "my-data" / "record.json").is_file()


# ----------------------------------------------------------------------------- params a passed object makes moot
def _train_with(tmp_path, name: str, *, dataset, model=None, **cfg):
    from privopt.config import RunConfig
    from privopt.training import train

    algo = {"algorithm": "sgd", "algorithm_params": {"epochs": 1, "batch_size": 8}}
    config = RunConfig.from_dict({**algo, "model": "logreg", **cfg})
    return train(config, out_dir=tmp_path / name, progress=False, dataset=dataset, model=model)


def test_dataset_params_a_passed_dataset_was_not_loaded_with_are_refused(tmp_path):
    from privopt.data import load_dataset
    from privopt.errors import ConfigError

    x, y = _xy()
    mine = Dataset.from_tensors(x, y, x_test=x[:5], y_test=y[:5], num_classes=2)
    with pytest.raises(ConfigError, match=r"dataset_params \['max_train'\] would be ignored: a dataset was passed in"):
        _train_with(tmp_path, "a", dataset=mine, dataset_params={"max_train": 10})
    loaded = load_dataset("digits", max_train=50)
    with pytest.raises(ConfigError, match=r"dataset_params \['max_train'\] would be ignored"):
        _train_with(tmp_path, "b", dataset=loaded, dataset_params={"max_train": 20})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before any output
    # The reproductions load the dataset themselves and state how in the config: consistent, accepted.
    rec = _train_with(tmp_path, "c", dataset=loaded, dataset_params={"max_train": 50, "scaling": "public"})
    assert rec["status"] == "finished" and rec["config"]["dataset_params"]["max_train"] == 50


def test_model_params_are_refused_with_a_passed_model(tmp_path):
    from torch import nn

    from privopt.errors import ConfigError

    x, y = _xy()
    mine = Dataset.from_tensors(x, y, x_test=x[:5], y_test=y[:5], num_classes=2)
    with pytest.raises(ConfigError, match=r"model_params \['bias'\] would be ignored: a model was passed in"):
        _train_with(tmp_path, "a", dataset=mine, model=nn.Linear(3, 2), model_params={"bias": False})
    assert not (tmp_path / "a").exists()
    rec = _train_with(tmp_path, "b", dataset=mine, model_params={"bias": False})  # builds cfg.model with them
    assert rec["status"] == "finished"
