"""docs/accounting.md: every Python block runs, and its printed comments match what it prints."""

import contextlib
import io
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "accounting.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 5


def expected_outputs(code: str) -> list[str]:
    """Each print line ends with ``# <output>`` (anything after ':' or ',' is explanation)."""
    lines = [line for line in code.splitlines() if line.lstrip().startswith("print(")]
    assert all("  # " in line for line in lines), "every print in the docs states its output"
    return [re.split(r"[:,]", line.split("  # ", 1)[1])[0].strip() for line in lines]


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_example_runs_and_prints_what_it_says(code):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})
    assert out.getvalue().splitlines() == expected_outputs(code)
