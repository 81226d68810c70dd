"""A run whose preprocessing read the private training split says so in its record.

``scaling: data`` standardises every split with the training split's exact mean and standard
deviation, and ``Dataset.from_tensors`` without ``num_classes`` takes the model's output width from
the private labels. Both are opt-ins that void part of the guarantee (docs/data.md), like an
insecure seed: the released model and its test metrics then depend on those exact statistics, so
the record must not state ε as if it covered the whole run.
"""

import warnings

import pytest
import torch

from _run_helpers import cfg, read_record
from privopt.data import Dataset
from privopt.data.preprocess import PrivatePreprocessingWarning
from privopt.training import train


def _not_accounted(run) -> dict:
    return read_record(run)["privacy"].get("not_accounted", {})


def test_training_statistics_scaling_is_named_in_the_record(tmp_path):
    with pytest.warns(PrivatePreprocessingWarning):
        train(
            cfg(algorithm_params={"epochs": 1}, dataset_params={"scaling": "data"}),
            out_dir=tmp_path / "data",
            progress=False,
        )
    note = _not_accounted(tmp_path / "data")["preprocessing"]
    assert "training split" in note and "NOT accounted" in note
    train(cfg(algorithm_params={"epochs": 1}), out_dir=tmp_path / "public", progress=False)
    assert "preprocessing" not in _not_accounted(tmp_path / "public")


def test_classes_inferred_from_private_labels_are_named_in_the_record(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(200, 4, generator=g), torch.randint(0, 3, (200,), generator=g)
    x_test, y_test = torch.rand(50, 4, generator=g), torch.randint(0, 3, (50,), generator=g)
    c = cfg(algorithm_params={"epochs": 1, "batch_size": 50})
    with pytest.warns(PrivatePreprocessingWarning):
        inferred = Dataset.from_tensors(x, y, x_test=x_test, y_test=y_test)
    train(c, out_dir=tmp_path / "inferred", progress=False, dataset=inferred)
    assert "num_classes=3" in _not_accounted(tmp_path / "inferred")["preprocessing"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivatePreprocessingWarning)
        given = Dataset.from_tensors(x, y, x_test=x_test, y_test=y_test, num_classes=3)
    train(c, out_dir=tmp_path / "given", progress=False, dataset=given)
    assert "preprocessing" not in _not_accounted(tmp_path / "given")


def test_a_count_based_selection_of_the_training_split_is_named_in_the_record(tmp_path):
    """``max_train`` keeps the N lowest-ranked records: one added source record can push another out
    (docs/data.md, 'Selection and the protected unit'), so the record must say whose guarantee ε is."""
    train(
        cfg(algorithm_params={"epochs": 1}, dataset_params={"max_train": 500}), out_dir=tmp_path / "cap", progress=False
    )
    note = _not_accounted(tmp_path / "cap")["preprocessing"]
    assert "count-based selection" in note and "max_train" in note and "replace-one" in note
    train(
        cfg(algorithm_params={"epochs": 1}, dataset_params={"train_fraction": 0.5}),
        out_dir=tmp_path / "per-record",
        progress=False,
    )
    assert "preprocessing" not in _not_accounted(tmp_path / "per-record")
