"""Every Python example of README.md and docs/api.md runs as written (in a scratch directory)."""

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/api.md")
BLOCKS = [
    (page, i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", (REPO / page).read_text(), flags=re.S))
]


def test_every_page_has_examples():
    counts = {page: sum(1 for p, _, _ in BLOCKS if p == page) for page in PAGES}
    assert counts["README.md"] >= 3 and counts["docs/api.md"] >= 2, counts


@pytest.mark.slow
@pytest.mark.parametrize("page,index,code", BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_example_runs(page, index, code, tmp_path):
    out, cwd = io.StringIO(), os.getcwd()
    os.chdir(tmp_path)  # examples that write (runs/...) write here
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{page} (python block {index})", "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)
        _forget_example_registrations()
    assert out.getvalue().strip(), "every example prints its result"


def _forget_example_registrations():
    """Drop what an example registered (a model, a metric...): the registries are process-wide, and a
    later test in the same worker (e.g. the doctest listing the built-in models) must not see it."""
    from privopt.registry import Registry

    modules = [m for name, m in list(sys.modules.items()) if name.startswith("privopt") and m is not None]
    for reg in {id(v): v for m in modules for v in vars(m).values() if isinstance(v, Registry)}.values():
        for name, obj in list(reg._entries.items()):
            if getattr(obj, "__module__", None) == "__readme__":
                del reg._entries[name]


def test_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    pages = {str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")}
    assert len(pages) >= 10
    assert pages - linked == set(), f"docs pages the README does not link: {sorted(pages - linked)}"
    assert all((REPO / link).exists() for link in linked), "a README link to docs/ points nowhere"


def test_readme_names_every_registered_algorithm():
    from privopt.algorithms import available_algorithms

    readme = (REPO / "README.md").read_text()
    built_in = [name for name, cls in available_algorithms().items() if cls.__module__.startswith("privopt.")]
    missing = [name for name in built_in if f"`{name}`" not in readme]
    assert missing == [], f"algorithms `privopt list` shows but the README does not name: {missing}"


@pytest.mark.parametrize("seeds", ["1", "0", "x"])
def test_own_loop_example_refuses_too_few_seeds_with_a_usage_line(seeds):
    import subprocess

    script = REPO / "examples" / "own_loop_vs_train.py"
    proc = subprocess.run([sys.executable, str(script), seeds], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("usage: python examples/own_loop_vs_train.py [SEEDS], SEEDS an integer >= 2")
