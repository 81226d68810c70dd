"""Red-team of the ``csv`` dataset: an attacker who knows every record but one reads everything a run
writes. Neighbouring CSV files (one record added, or one record's values changed: an extreme
number, a value outside its declared range, an unknown category, a missing cell under
``missing: drop``, an empty cell in a ``missing: category`` column) must give runs whose published
files and output differ only through the released model and public facts (n, by docs/privacy.md
"What is public"); one record must not move another between the splits nor change how another is
read; errors quote nothing without --debug.
"""

import gzip
import json
import os
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from privopt.cli import main
from privopt.data import formats, load_dataset
from privopt.errors import DEBUG_ENV, DataError

HEADER = "age,job,sex,income\n"
LABEL = {"column": "income", "classes": ["<=50K", ">50K"]}
FEATURES = {
    "age": {"range": [17, 90]},
    "job": {"categories": ["Privé", "Gov"], "unknown": "other", "missing": "category"},
}
YAML = """\
algorithm: dp-sgd
algorithm_params: {{epochs: 1, batch_size: 20, lr: 0.5, clip: 1.0e-30}}
model: logreg
privacy: {{epsilon: 1.0, delta: 1.0e-5}}
insecure_seed: 7
dataset: csv
dataset_params:
  path: train.csv
  test_path: {test}
  missing: drop
  label: {{column: income, classes: ["<=50K", ">50K"]}}
  group: {{column: sex, groups: [Female, Male]}}
  features:
    age: {{range: [17, 90]}}
    job: {{categories: [Privé, Gov], unknown: other, missing: category}}
"""
ROWS = [f"{20 + i % 60},{('Privé', 'Gov', 'Self')[i % 3]},{('Female', 'Male')[i % 2]},{'>50K' if i % 3 else '<=50K'}\n"
        for i in range(80)]  # fmt: skip
NEIGHBOURS = {  # one record changed (same n) or one record that is dropped added (same n)
    "extreme": ROWS[:-1] + ["1e300,Gov,Male,>50K\n"],
    "out_of_range": ROWS[:-1] + ["-5,Gov,Male,>50K\n"],
    "unknown_category": ROWS[:-1] + ["30,Astronaut,Male,>50K\n"],
    "missing_category": ROWS[:-1] + ["30,,Male,>50K\n"],  # its <missing> slot, not dropped
    "missing_dropped": ROWS + [",Gov,Male,>50K\n"],
    "nan_dropped": ROWS + ["nan,Gov,Male,>50K\n"],
}


def _train_cli(capsys, rows: list[str], out: str) -> tuple[str, str]:
    """``privopt train`` (what it prints is what an attacker reads), same paths in both worlds."""
    Path("train.csv").write_text(HEADER + "".join(rows), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every warning reaches privopt's handler, as in a fresh process
        code = main(["train", "--config", "run.yaml", "--out", out])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return printed.out, printed.err


def test_neighbouring_csv_files_publish_the_same_bytes_when_the_released_model_is_the_same(
    tmp_path, monkeypatch, capsys
):
    """With clip 1e-30 both worlds release a model within 1e-28 of the initial one (same predictions),
    so every other published byte and every printed character must be equal: an extreme value once
    printed numpy's overflow warning."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test.csv").write_text(HEADER + "".join(ROWS[:30]), encoding="utf-8")
    (tmp_path / "run.yaml").write_text(YAML.format(test="test.csv"), encoding="utf-8")
    base = _train_cli(capsys, ROWS, "run")
    os.rename(tmp_path / "run", tmp_path / "base")
    for name, rows in NEIGHBOURS.items():
        assert _train_cli(capsys, rows, "run") == base, name  # stdout and stderr
        a, b = tmp_path / "base", tmp_path / "run"
        ma, mb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
        # the premise: both released models are noise at the scale of the clip (logreg starts at 0)
        assert all(ma[k].abs().max() < 1e-28 and mb[k].abs().max() < 1e-28 for k in ma)
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        ra, rb = (json.loads((d / "record.json").read_text()) for d in (a, b))
        ra.pop("wall_time_s"), rb.pop("wall_time_s")
        assert ra == rb, name
        for file in ("metrics.csv", "curves.png"):
            assert (a / file).read_bytes() == (b / file).read_bytes(), (name, file)
        os.rename(b, tmp_path / name)


def _load(path: Path, **params):
    return load_dataset("csv", path=str(path), label=LABEL, features=FEATURES, missing="drop", **params)


def _rows(x: torch.Tensor, y: torch.Tensor) -> Counter:
    return Counter(tuple(r) + (int(c),) for r, c in zip(x.tolist(), y.tolist()))


@pytest.mark.parametrize("added", ["30,Gov,Male,>50K\n", *(rows[-1] for rows in NEIGHBOURS.values())])
def test_one_added_record_moves_no_other_record_between_the_splits(tmp_path, monkeypatch, added):
    """The test (and validation) split is carved by each record's own keyed hash: the neighbour's
    splits are the base's plus at most the added record, and the public metadata is the same."""
    worlds = []
    for name, body in (("base", "".join(ROWS)), ("more", "".join(ROWS) + added)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.csv").write_text(HEADER + body, encoding="utf-8")
        monkeypatch.chdir(tmp_path / name)  # the same path in both worlds' configs
        worlds.append(_load(Path("train.csv"), test_fraction=0.3, val_fraction=0.2))
    a, b = worlds
    assert a.public_meta == b.public_meta
    assert a.private_stats != b.private_stats  # the control: the worlds do differ
    grown = 0
    for split in ("train", "val", "test"):
        ra = _rows(getattr(a, f"x_{split}"), getattr(a, f"y_{split}"))
        rb = _rows(getattr(b, f"x_{split}"), getattr(b, f"y_{split}"))
        assert not ra - rb, split  # no base record left this split
        grown += sum((rb - ra).values())
    assert grown == (0 if added.startswith((",", "nan")) else 1)


def test_a_byte_that_is_not_utf8_is_refused_not_a_reason_to_reread_every_record(tmp_path, monkeypatch):
    """One record with a latin-1 byte used to turn the whole file into latin-1: every other record's
    'Privé' then read 'PrivÃ©' and moved to '<other>' (and to other splits: the hash reads it)."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    base = tmp_path / "base.csv"
    base.write_text(HEADER + "".join(ROWS), encoding="utf-8")
    assert _load(base, test_path=str(base)).x_train[:, 1].sum() > 0  # 'Privé' read as declared
    bad = tmp_path / "bad.csv"
    bad.write_bytes(base.read_bytes() + b"30,Gov\xe9,Male,>50K\n")  # else a valid record
    with pytest.raises(DataError) as err:
        _load(bad, test_path=str(base))
    said = str(err.value)
    assert said.startswith(f"{bad}: some line is not utf-8 text; dataset_params.encoding names the file's encoding")
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(DataError, match=f"line {len(ROWS) + 2} is not utf-8"):
        _load(bad, test_path=str(base))
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + base.read_bytes())  # a byte-order mark is not part of the first name
    assert _load(bom, test_path=str(base)).n_train == _load(base, test_path=str(base)).n_train


def test_a_corrupt_gzip_file_is_refused_without_quoting_its_bytes_or_checksum(tmp_path, monkeypatch):
    """gzip's own messages quote the first two bytes ("Not a gzipped file (b'30')") or the CRC-32 of
    the whole content, a fingerprint to test a guess of the missing record against."""
    content = (HEADER + "".join(ROWS)).encode()
    crc = gzip.compress(content)
    crc = crc[:-8] + bytes(b ^ 0xFF for b in crc[-8:-4]) + crc[-4:]  # a wrong stored CRC
    plain = "".join(ROWS).encode()  # not gzip at all, and no header line: its first bytes are a record's
    for name, body in (("crc.csv.gz", crc), ("plain.csv.gz", plain)):
        path = tmp_path / name
        path.write_bytes(body)
        monkeypatch.delenv(DEBUG_ENV, raising=False)
        with pytest.raises(DataError) as err:
            formats.read_bytes(path)
        said = str(err.value)
        assert said.startswith(f"cannot read {path}: not readable, or a corrupt or truncated gzip stream")
        assert not re.search(r"0x[0-9a-f]+|b'", said), said
        monkeypatch.setenv(DEBUG_ENV, "1")
        with pytest.raises(DataError, match=r"CRC check failed|Not a gzipped file"):
            formats.read_bytes(path)


def test_an_extreme_number_prints_no_warning_and_is_clipped_to_its_declared_range(tmp_path):
    """A finite value past float32's range (1e300) made numpy warn on stderr, telling readers that
    some record holds a value above 3.4e38; it is saturated silently, then clipped like any value."""
    path = tmp_path / "extreme.csv"
    path.write_text(HEADER + "".join(ROWS[:5]) + "1e300,Gov,Male,>50K\n-1e300,Gov,Male,>50K\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = _load(path, test_path=str(path))
    assert ds.x_train[-2:, 0].tolist() == [1.0, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raw = _load(path, test_path=str(path), scaling="none").x_train[-2:, 0]
    assert raw.tolist() == [float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max)]
