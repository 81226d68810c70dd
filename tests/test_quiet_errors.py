"""Errors about private data name the problem, never the values that caused it.

The attacker of docs/privacy.md reads everything a run prints (and a failed run's reason is in its
public record): an error that quotes a label, a feature, a record's position in its file or how
many records are bad publishes that record. Each test plants a recognisable value in one record
and checks the message says what is wrong without it.
"""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
import torch
from torch import nn

from privopt.data import formats, load_dataset
from privopt.errors import ConfigError, DataError, ModelError
from privopt.eval.metrics import classification_metrics
from privopt.objectives.erm import LogisticERM
from privopt.privacy import report_noisy_max
from privopt.training.builder import check_model_fits

COVTYPE_ROW = ",".join(["1"] * 54 + ["3"])
ADULT_ROW = (
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, {race}, Male, "
    "2174, 0, 40, United-States, <=50K\n"
)


def _message(error, fn) -> str:
    with pytest.raises(error) as info:
        fn()
    return str(info.value)


def test_erm_labels_outside_the_set_are_named_not_quoted():
    x = np.zeros((3, 2))
    msg = _message(DataError, lambda: LogisticERM(features=x, labels=[1.0, -1.0, 7.25]))
    assert "some label is outside {-1, 0, +1}" in msg
    assert "7.25" not in msg and "got values" not in msg
    msg = _message(DataError, lambda: LogisticERM(features=x, labels=[1.0, -1.0, 0.0]))
    assert msg.endswith("both 0 and -1 occur")


def test_report_noisy_max_does_not_print_the_private_scores():
    scores = [0.123456, float("nan"), 0.654321]
    msg = _message(ConfigError, lambda: report_noisy_max(scores, scale=1.0, rng=np.random.default_rng(0)))
    assert "must be finite" in msg and "NaN or inf" in msg
    assert "0.123456" not in msg and "0.654321" not in msg


def test_metrics_labels_out_of_range_are_named_not_quoted():
    logits = torch.zeros(3, 2)
    msg = _message(DataError, lambda: classification_metrics(logits, torch.tensor([0, 1, 913]), num_classes=2))
    assert "labels must be integers in [0, 1]" in msg
    assert "913" not in msg


def _write_idx(path, dims: tuple[int, ...], payload: bytes) -> None:
    header = bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
    with gzip.open(path, "wb") as fh:
        fh.write(header + payload)


def test_idx_labels_out_of_range_are_named_not_quoted(tmp_path):
    d = tmp_path / "mnist"
    d.mkdir()
    _write_idx(d / "t10k-images-idx3-ubyte.gz", (3, 28, 28), bytes(3 * 28 * 28))
    _write_idx(d / "t10k-labels-idx1-ubyte.gz", (3,), bytes([1, 213, 2]))
    msg = _message(DataError, lambda: load_dataset("mnist", data_dir=tmp_path))
    assert "t10k-labels-idx1-ubyte.gz: some label is outside 0..9" in msg
    assert "213" not in msg and "found" not in msg


def test_cifar_label_byte_names_neither_the_record_nor_its_label(tmp_path):
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(bytes([3]) + bytes(3072) + bytes([201]) + bytes(3072))
    msg = _message(DataError, lambda: formats.read_cifar_bin(path))
    assert msg.endswith("data_batch_1.bin: some record has a label byte outside 0..9")
    assert "201" not in msg and "record 1" not in msg


@pytest.mark.parametrize(
    "bad_row, problem",
    [
        (",".join(["1"] * 53 + ["3"]), "some line does not have 55 fields"),
        (",".join(["1"] * 6 + ["SECRET"] + ["1"] * 47 + ["3"]), "field 7 of some line is not a number"),
        (",".join(["1"] * 6 + ["inf"] + ["1"] * 47 + ["3"]), "some line has a non-finite value"),
        (",".join(["1"] * 54 + ["9"]), "field 55 (Cover_Type) of some line is not an integer 1..7"),
    ],
)
def test_covtype_errors_name_the_field_not_the_line(tmp_path, bad_row, problem):
    d = tmp_path / "covtype"
    d.mkdir()
    (d / "covtype.data").write_text(f"{COVTYPE_ROW}\n{COVTYPE_ROW}\n{bad_row}\n")
    msg = _message(DataError, lambda: load_dataset("covertype", data_dir=tmp_path))
    said = msg.split("covtype.data: ", 1)[1]
    assert problem in said
    assert "line 3" not in said and "SECRET" not in said and "54 fields" not in said


@pytest.mark.parametrize(
    "race, problem",
    [
        ("Martian", "race of some record"),  # not in the vocabulary (or not groupable)
        ("White, extra", "some line does not have 15 fields"),
    ],
)
def test_adult_errors_name_the_column_not_the_records(tmp_path, race, problem):
    d = tmp_path / "adult"
    d.mkdir()
    good = ADULT_ROW.format(race="White")
    (d / "adult.data").write_text(good + good + ADULT_ROW.format(race=race))
    msg = _message(DataError, lambda: load_dataset("adult", data_dir=tmp_path, group="sex"))
    said = msg.split("adult.data: ", 1)[1]
    assert problem in said
    assert "Martian" not in said and "extra" not in said
    assert "row" not in said and "line 3" not in said and "1 record" not in said and "16" not in said


def test_celeba_attribute_rows_name_the_attribute_not_the_row(tmp_path):
    path = tmp_path / "list_attr_celeba.txt"
    path.write_text("3\nSmiling Male\na.jpg 1 -1\nb.jpg -1 1\nc.jpg 1 7\n")
    msg = _message(DataError, lambda: formats.read_celeba_attributes(path))
    assert msg.endswith("list_attr_celeba.txt: field 3 (attribute 'Male') of some row is neither 1 nor -1")
    assert "line 5" not in msg and "c.jpg" not in msg and " 7" not in msg
    path.write_text("3\nSmiling Male\na.jpg 1 -1\nb.jpg -1 1\nc.jpg 1 -1 1\n")
    msg = _message(DataError, lambda: formats.read_celeba_attributes(path))
    assert msg.endswith("list_attr_celeba.txt: some row does not have 3 fields (image id + 2 attributes)")
    assert "4 fields" not in msg and "row 5" not in msg


def _ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def test_model_probe_withholds_an_error_that_only_the_records_cause():
    x, y = torch.zeros(4, 3), torch.tensor([17, 1, 0, 1])  # torch would say "Target 17 is out of bounds"
    msg = _message(ModelError, lambda: check_model_fits(nn.Linear(3, 2), _ce, x, y, what="x"))
    assert msg.startswith("the loss cannot take the model's outputs on x")
    assert "labels out of range" in msg and "withheld" in msg
    assert "17" not in msg and "Target" not in msg


def test_model_probe_still_quotes_a_structural_error():
    x, y = torch.zeros(4, 5), torch.tensor([0, 1, 0, 1])
    msg = _message(ModelError, lambda: check_model_fits(nn.Linear(3, 2), _ce, x, y, what="x"))
    assert msg.startswith("the model cannot take x (one example: shape (5,), torch.float32): mat1 and mat2")


class _Secretive(nn.Module):
    """A model whose error quotes its input, as user code may."""

    def forward(self, x):
        if bool((x > 1).any()):
            raise ValueError(f"feature too large: {float(x.max())}")
        return torch.zeros(x.shape[0], 2)


def test_model_probe_withholds_a_user_models_error_text_on_the_records():
    x, y = torch.full((4, 3), 0.5), torch.tensor([0, 1, 0, 1])
    x[0, 1] = math.pi
    msg = _message(ModelError, lambda: check_model_fits(_Secretive(), _ce, x, y, what="x"))
    assert msg.startswith("the model cannot take x") and "withheld" in msg
    assert "3.14" not in msg and "feature too large" not in msg


# A Poisson batch's size is the secret sampling's: shape errors met at a step name the problem only.
def test_batch_shape_errors_do_not_print_the_batch_size():
    from privopt.grads.coefficients import resolve_scale, resolve_weights
    from privopt.training.metrics import build_loss

    losses, norms = torch.ones(37), torch.ones(37)
    msg = _message(ConfigError, lambda: resolve_weights(torch.ones(36), losses))
    assert "one per example of the batch" in msg and "37" not in msg and "36" not in msg
    msg = _message(ConfigError, lambda: resolve_scale(lambda ell, nrm: torch.ones(36), losses, norms))
    assert "one value per example of the batch" in msg and "37" not in msg and "36" not in msg
    msg = _message(ValueError, lambda: build_loss("logistic")(torch.zeros(37, 3), torch.zeros(37, dtype=torch.long)))
    assert "one logit per example, got (3,) per example" in msg and "37" not in msg


def test_ghost_engine_loss_shape_error_does_not_print_the_batch_size():
    from privopt.grads import get_engine

    def mean_loss(out, y):
        return _ce(out, y).mean()  # not per example

    x, y = torch.zeros(37, 3), torch.zeros(37, dtype=torch.long)
    msg = _message(ConfigError, lambda: get_engine("ghost").clipped_sum(nn.Linear(3, 2), mean_loss, x, y, clip=1.0))
    assert "one per example of the batch" in msg and "0-D tensor" in msg and "37" not in msg
