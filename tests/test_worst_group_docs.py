"""docs/algorithms/worst_group.md lists each worst-group algorithm's hyper-parameters and defaults (the
only place a user finds them without reading the source): the table must name real parameters with
their real defaults, and leave none of an algorithm's own out."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from privopt.algorithms import available_algorithms
from privopt.algorithms.worst_group_common import WorstGroupConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "algorithms" / "worst_group.md"
ENTRY = re.compile(r"`([a-z_]+)` \[([^\]]*)\]")


def _documented_default(text: str):
    value = text.split(":")[0].strip().strip("`").strip('"')
    return {"None": None, "true": True, "false": False}.get(value, value)


def _same(doc_value, default) -> bool:
    if isinstance(default, bool) or default is None or isinstance(default, str):
        return doc_value == default
    return float(doc_value) == float(default)


def _rows() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `([a-z0-9-]+)`[^|]*\| (.*) \|$", line)
        if m and m.group(1) in available_algorithms():
            rows[m.group(1)] = m.group(2)
    return rows


def test_the_documented_hyperparameters_and_defaults_are_the_algorithms_own():
    rows = _rows()
    assert set(rows) == {"noisy-sgd-ags", "noisy-sgd-mgr", "dp-oco-exp3", "minimax-phased-erm", "group-dro"}
    shared = {f.name for f in dataclasses.fields(WorstGroupConfig)}
    for name, row in rows.items():
        fields = {f.name: f.default for f in dataclasses.fields(available_algorithms()[name].Config)}
        documented = dict(ENTRY.findall(row))
        for key, text in documented.items():
            assert key in fields, f"{name}: {key} is not a hyper-parameter"
            assert _same(_documented_default(text), fields[key]), f"{name}.{key}: documented [{text}]"
        named = set(re.findall(r"`([a-z_]+)`", row)) | (shared if name != "group-dro" else set())
        if name == "noisy-sgd-mgr":  # "as AGS without choice"
            named |= set(dict(ENTRY.findall(rows["noisy-sgd-ags"]))) - {"choice"}
        assert set(fields) - named == set(), f"{name}: undocumented {sorted(set(fields) - named)}"


def test_the_shared_hyperparameters_are_documented_with_their_defaults():
    text = DOC.read_text(encoding="utf-8")
    para = text[text.index("**Hyper-parameters**") : text.index("| algorithm | its own")]
    para = " ".join(para.split())
    for f in dataclasses.fields(WorstGroupConfig):
        assert f"`{f.name}`" in para, f.name
    assert "[5.0]" in para and "[20]" in para and "[16384]" in para
