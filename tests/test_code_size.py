"""The project's size rules over src/ (developer guide: small modules): no file over 500 lines, no
function over 60 lines (from its ``def`` line to its last line, docstring included), and no reference
to the specification notes that are not part of the repository (docstrings point to docs/ instead)."""

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50, f"found only {len(files)} source files under {SRC}"
    return files


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def long_functions(text: str, *, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of every function longer than ``limit`` lines."""
    return [f for f in _functions(ast.parse(text)) if f[2] > limit]


def test_the_function_length_rule_counts_every_line():
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    assert long_functions(f"def f():\n{body}\n") == []  # 60 lines
    assert long_functions(f"def f():\n{body}\n    return x0\n") == [("f", 1, 61)]
    nested = f"class A:\n    def g(self):\n        '''doc'''\n{body.replace('    ', '        ')}\n        return 1\n"
    assert long_functions(nested) == [("g", 2, 62)]  # methods too, docstring included


def test_no_source_file_over_500_lines():
    too_long = {}
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            too_long[str(path.relative_to(SRC))] = n
    assert too_long == {}, f"files over {MAX_FILE_LINES} lines: {too_long}"


def test_no_function_over_60_lines():
    too_long = []
    for path in _sources():
        for name, line, n in long_functions(path.read_text(encoding="utf-8")):
            too_long.append(f"{path.relative_to(SRC)}:{line} {name} ({n} lines)")
    assert too_long == [], "functions over 60 lines: " + "; ".join(too_long)


def test_no_reference_to_the_specification_notes():
    """SPEC.md is not in the repository: a reader of the code, tests or docs cannot follow such references."""
    pattern = re.compile(r"SPEC(\.md| ?§)|\bE-A\.\d")
    root = SRC.parent
    texts = [
        *_sources(),
        *sorted((root / "tests").rglob("*.py")),
        *sorted((root / "docs").rglob("*.md")),
        root / "README.md",
    ]
    hits = []
    for path in texts:
        if path == Path(__file__).resolve():  # the pattern itself
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert hits == [], "\n".join(hits)
