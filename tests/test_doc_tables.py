"""Tables of the documentation that state names and defaults agree with the code.

Each test reads a table as written and checks every cell it can tie to code: a renamed option or a
changed default then fails here instead of leaving the page wrong.
"""

import dataclasses
import re
from pathlib import Path

import pytest

from privopt.algorithms import available_algorithms
from privopt.algorithms.config import ROLES
from privopt.algorithms.dro_presets import PAPER_DEFAULTS
from privopt.data.registry import available_datasets, dataset_options

REPO = Path(__file__).resolve().parents[1]


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _value(text: str):
    """A table cell's value: a number, a quoted string, or ``none`` / ``None``."""
    text = text.strip().strip("`")
    if text.lower() == "none":
        return None
    if text.startswith('"'):
        return text.strip('"')
    return float(text)


def test_roles_named_in_algorithms_readme_are_the_roles_of_the_code():
    text = (REPO / "docs/algorithms/README.md").read_text()
    sentence = re.search(r"Fields carry a \*role\*(.*?)that experiment protocols", text, flags=re.S).group(1)
    named = set(re.findall(r"`([a-z_0-9]+)`", sentence))
    assert named == set(ROLES)


def test_dataset_table_names_and_option_defaults():
    rows = _table_rows((REPO / "docs/data.md").read_text(), "| name | source")
    registered = set(available_datasets())
    seen = set()
    for row in rows:
        names = re.findall(r"`([a-z0-9-]+)`", row[0])
        assert names and set(names) <= registered, row[0]
        seen.update(names)
        for name in names:
            options = dataset_options(name)
            for key, default in re.findall(r"`([a-z_]+)(?:=([^`]+))?`", row[-1]):
                assert key in options, (name, key)
                if default:
                    value = default.strip('"')
                    expected = options[key]
                    assert str(expected) == value or (
                        isinstance(expected, (int, float)) and float(value) == expected
                    ), (name, key, default, expected)
    assert seen == registered


DRO_TABLE = "| algorithm | field | former default | default |"


def _dro_default_cells():
    """``(algorithm, field, former, default)`` for every field cell of dro.md's defaults table."""
    algos, cells = [], []
    for row in _table_rows((REPO / "docs/algorithms/dro.md").read_text(), DRO_TABLE):
        algos = [a.strip() for a in row[0].split(",")] if row[0] else algos
        fields = re.findall(r"`([A-Za-z_0-9]+)`", row[1])
        former, default = row[2].split(", "), row[3].split(", ")
        for i, field in enumerate(fields):
            pick = 0 if len(former) == 1 else i
            for algo in algos:
                if field in {f.name for f in dataclasses.fields(available_algorithms()[algo].Config)}:
                    cells.append((algo, field, _value(former[pick]), _value(default[pick])))
    return cells


@pytest.mark.parametrize("algo,field,former,default", _dro_default_cells())
def test_dro_defaults_table(algo, field, former, default):
    config = available_algorithms()[algo].Config
    assert {f.name: f.default for f in dataclasses.fields(config)}[field] == default
    assert PAPER_DEFAULTS[algo][field] == former


def test_dro_defaults_table_covers_every_changed_field():
    cells = {(algo, field) for algo, field, _, _ in _dro_default_cells()}
    assert cells == {(algo, field) for algo, fields in PAPER_DEFAULTS.items() for field in fields}
