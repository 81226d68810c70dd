"""The privacy layer uses only dp_accounting's public API and no private names across its modules."""

import ast
import pathlib

import pytest

import privopt.privacy

PACKAGE = pathlib.Path(privopt.privacy.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))
OWN = {p.stem for p in MODULES}


def private_uses(path: pathlib.Path) -> list[str]:
    """Private names reached through another module: ``mod._x`` attributes and ``from m import _x``."""
    tree = ast.parse(path.read_text())
    aliases = {}  # local name -> module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if a.name.startswith("_"):
                    found.append(f"from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.append(f"{aliases[base.id]}...{node.attr}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_private_names_of_other_modules(path):
    assert private_uses(path) == []


def test_the_checker_catches_private_uses(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import dp_accounting as dpa\nfrom privopt.privacy import accountant as _acc\n"
        "from privopt.privacy.accountant import _resolve\nx = dpa.pld._pmf\ny = _acc._epsilon\n"
    )
    assert len(private_uses(bad)) == 3


def test_every_module_is_small_and_torch_free():
    for path in MODULES:
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        assert "import torch" not in text, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 60, f"{path.name}:{node.name}"
