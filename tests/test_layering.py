"""The package's layers import only the layers below them (README.md, "How the package is layered").

Every ``import privopt.X`` / ``from privopt.X import ...`` in the source, at module level or inside
a function (a lazy import is still a dependency), must name a top-level module of a lower layer or
the importing module's own package. The accounting layer never imports torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "privopt"

# Lowest first. Modules of one layer may not import each other across packages either, except where
# a layer is a list of independent leaves (layer 0's helpers all stand on privopt.errors alone).
LAYERS: list[set[str]] = [
    {"errors", "lazy"},
    {"validation", "registry", "rng", "quiet", "checkpoint", "config", "cliargs", "cores", "runlock"},
    {"plugins"},  # imports the user's code named by a config (privopt.config) before any name is looked up
    {"privacy"},
    {"sampling", "group_sampling", "distributed"},
    {"grads"},
    {"objectives", "models"},
    {"algorithms"},
    {"data"},
    {"eval", "plots"},
    {"training"},
    {"bench_procs"},  # its timing processes run privopt.bench, which it never imports
    {"api", "experiments", "audit", "bench_profile", "bench_opacus"},
    {"bench_breakdown"},
    {"bench"},
    {"bench_e2e"},
    {"cli_account", "cli_audit", "cli_bench", "cli_list", "cli_predict", "cli_reproduce", "cli_runs"},
    {"cli"},
    {"__main__", "__init__"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _top(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_top_level_module_has_a_layer():
    tops = {_top(p) for p in _sources()}
    assert tops - set(LEVEL) == set(), "add the new module to LAYERS"
    assert set(LEVEL) - tops == set(), "LAYERS names a module that no longer exists"


def test_imports_go_down_the_layers():
    wrong = []
    for path in _sources():
        top = _top(path)
        for module, line in _imports(path):
            parts = module.split(".")
            if parts[0] != "privopt" or len(parts) < 2 or parts[1] == top:
                continue
            if LEVEL[parts[1]] >= LEVEL[top]:
                wrong.append(f"{path.relative_to(SRC)}:{line} ({top}) imports {module}")
    assert wrong == [], "\n".join(wrong)


def test_the_accounting_layer_never_imports_torch():
    users = [
        f"{p.relative_to(SRC)}:{line}"
        for p in (SRC / "privacy").rglob("*.py")
        for module, line in _imports(p)
        if module.split(".")[0] == "torch"
    ]
    assert users == []
