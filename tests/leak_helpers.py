"""Shared by the leak audits that train on neighbouring CSV files in the current directory
(``tests/test_leak_audit_erm.py``, ``tests/test_leak_audit_groups.py``)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from privopt.cli import main

HEADER = "age,job,sex,income\n"
# The dataset part of their run.yaml (a str.format template: braces doubled).
CSV_DATASET_YAML = """\
dataset: csv
dataset_params:
  path: train.csv
  test_path: test.csv
  missing: drop
  label: {{column: income, classes: ["<=50K", ">50K"]}}
  group: {{column: sex, groups: [A, B, C]}}
  features:
    age: {{range: [17, 90]}}
    job: {{categories: [Priv, Gov], unknown: other, missing: category}}
"""


def train_world(capsys, rows: list[str], out: str) -> tuple[str, str]:
    """``privopt train`` on ``rows`` into ``run`` (the same path in both worlds: it is printed), then
    renamed ``out``; returns what it printed (stdout, stderr)."""
    Path("train.csv").write_text(HEADER + "".join(rows), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main(["train", "--config", "run.yaml", "--out", "run"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    os.rename("run", out)
    return printed.out, printed.err


def published(run: Path) -> dict:
    """Everything a run publishes, but its wall time: the file list, the record, the metrics and curves."""
    record = json.loads((run / "record.json").read_text())
    record.pop("wall_time_s")
    files = {f: (run / f).read_bytes() for f in ("metrics.csv", "curves.png")}
    return {"files": sorted(os.listdir(run)), "record": record, **files}
