"""Every ```python block of README.md and docs/**/*.md runs as written, in a scratch directory.

Conventions the tests enforce: examples are scripts (no ``>>>`` doctest lines, no ```pycon/```py
fences); a print whose line ends with ``  # <comment>`` states its output: the printed line is the
comment itself or the part of it before ``": "`` / ``", "`` (the rest explains). A block that reads
``../shared/data`` runs next to a link to the real data (``needs_shared_data``, skipped when absent).
docs/accounting.md's blocks are run by tests/test_privacy_docs.py (stricter: every print states
its output), not twice here.
"""

import contextlib
import io
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN_ELSEWHERE = {"docs/accounting.md": "test_privacy_docs"}  # page -> the test module that runs its blocks
FENCE = re.compile(r"^([ \t]*)```[ \t]*(\S*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", flags=re.S | re.M)
PYTHON_TAGS = {"python", "python3", "py", "pycon", "ipython", "doctest", "pytb"}
SHARED = "../shared/data"


def doc_pages() -> list[str]:
    return ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))]


def fenced(text: str) -> list[tuple[str, str]]:
    """(language tag, dedented code) of every fenced block, indented ones (in lists) included."""
    return [(tag.lower(), textwrap.dedent(code)) for _, tag, code in FENCE.findall(text)]


def python_blocks(page: str) -> list[str]:
    return [code for tag, code in fenced((REPO / page).read_text()) if tag == "python"]


BLOCKS = [
    (page, i, code) for page in doc_pages() if page not in RUN_ELSEWHERE for i, code in enumerate(python_blocks(page))
]


def _uses_shared_data(code: str) -> bool:
    return any(SHARED in line.split("#", 1)[0] for line in code.splitlines())


def _trains(code: str) -> bool:
    return bool(re.search(r"\btrain\(|\.step\(|reproduce", code))


def _params():
    for page, i, code in BLOCKS:
        marks = [pytest.mark.slow] if _trains(code) else []
        if _uses_shared_data(code):
            marks.append(pytest.mark.needs_shared_data)
        yield pytest.param(page, i, code, marks=marks, id=f"{page}-{i}")


def test_every_page_has_examples():
    counts = {page: sum(1 for p, _, _ in BLOCKS if p == page) for page in doc_pages()}
    assert counts["README.md"] >= 3 and counts["docs/api.md"] >= 2, counts
    assert sum(counts.values()) >= 12, counts


def test_every_python_block_is_collected_and_script_style():
    """A python block the collector would miss (an unknown fence tag, a doctest) fails here."""
    import test_privacy_docs

    for page in doc_pages():
        text = (REPO / page).read_text()
        tags = [tag for tag, _ in fenced(text)]
        assert text.count("```") == 2 * len(tags), f"{page}: an unpaired or inline ``` fence"
        odd = sorted({t for t in tags if t in PYTHON_TAGS and t != "python"})
        assert odd == [], f"{page}: use ```python script blocks, not {odd}"
        blocks = python_blocks(page)
        doctest = [line for b in blocks for line in b.splitlines() if line.lstrip().startswith(">>>")]
        assert doctest == [], f"{page}: doctest lines in a python block (write a script, outputs in comments)"
        opened = len(re.findall(r"^[ \t]*```[ \t]*python\b", text, flags=re.M | re.I))
        runs_here = [code for p, _, code in BLOCKS if p == page]
        if page in RUN_ELSEWHERE:  # run there, and only there
            assert runs_here == [] and [b.strip() for b in test_privacy_docs.BLOCKS] == [b.strip() for b in blocks]
            assert len(test_privacy_docs.BLOCKS) == opened, page
        else:
            assert len(runs_here) == opened, f"{page}: {opened} python blocks, {len(runs_here)} collected"


def stated_outputs(code: str) -> list[str]:
    lines = [line for line in code.splitlines() if line.lstrip().startswith("print(") and "  # " in line]
    return [line.split("  # ", 1)[1].strip() for line in lines]


def _states(comment: str, line: str) -> bool:
    return comment == line or comment.startswith((line + ": ", line + ", "))


def check_stated_outputs(code: str, printed: str) -> None:
    """Each stated output matches a printed line, in order (a print may print several lines)."""
    lines = iter([line.rstrip() for line in printed.splitlines()])
    for comment in stated_outputs(code):
        assert any(_states(comment, line) for line in lines), f"no printed line matches the comment {comment!r}"


def _scratch_dir(code: str, tmp_path: Path, request) -> Path:
    """Where a block runs: ``tmp_path``, or beside a link ``../shared/data`` to the real data."""
    if not _uses_shared_data(code):
        return tmp_path
    data = request.getfixturevalue("shared_data")  # skips the test when the data is absent
    (tmp_path / "repo").mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data.resolve(), target_is_directory=True)
    return tmp_path / "repo"


def run_block(code: str, name: str, workdir: Path) -> str:
    out, cwd = io.StringIO(), os.getcwd()
    os.chdir(workdir)  # examples that write (runs/...) write here
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)
        _forget_example_registrations()
    return out.getvalue()


@pytest.mark.parametrize("page,index,code", list(_params()))
def test_example_runs(page, index, code, tmp_path, request):
    printed = run_block(code, f"{page} (python block {index})", _scratch_dir(code, tmp_path, request))
    assert printed.strip(), "every example prints its result"
    check_stated_outputs(code, printed)


@pytest.mark.needs_shared_data
def test_a_block_reading_shared_data_runs_beside_the_real_data(tmp_path, request):
    code = 'import os\nprint(os.path.isdir("../shared/data"), os.path.basename(os.getcwd()))  # True repo'
    workdir = _scratch_dir(code, tmp_path, request)
    check_stated_outputs(code, run_block(code, "probe", workdir))
    assert workdir.parent == tmp_path  # a scratch directory, not the repository


def test_stated_outputs_are_checked():
    code = 'print(270)  # 270: 64*4 + 4 + 4*2 + 2\nprint("a\\nb")\nprint(3.77)  # 3.77, tight'
    check_stated_outputs(code, "270\na\nb\n3.77\n")
    with pytest.raises(AssertionError, match="3.78"):
        check_stated_outputs(code.replace("# 3.77", "# 3.78"), "270\na\nb\n3.77\n")
    assert _uses_shared_data('load("../shared/data")') and not _uses_shared_data('# load("../shared/data")')


def _forget_example_registrations():
    """Drop what an example registered (a model, a metric, a layer rule...): the registries are
    process-wide, and a later test in the same worker (e.g. the doctest listing the built-in
    models) must not see it."""
    from privopt.grads.ghost import rules
    from privopt.registry import Registry

    modules = [m for name, m in list(sys.modules.items()) if name.startswith("privopt") and m is not None]
    for reg in {id(v): v for m in modules for v in vars(m).values() if isinstance(v, Registry)}.values():
        for name, obj in list(reg._entries.items()):
            if getattr(obj, "__module__", None) == "__readme__":
                del reg._entries[name]
    for layer_type in [t for t in rules._RULES if t.__module__ == "__readme__"]:
        rules.unregister_layer_rule(layer_type)


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
