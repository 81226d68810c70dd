"""The docs' cross-references resolve: every relative Markdown link in README.md and docs/ names a
file that exists (and, with ``#anchor``, one of its headings), and every section a docstring,
message or doc names (``docs/data.md, "Selection and the protected unit"``) is a heading, a bold
term or a table row of that file. The phase logs under docs/results (``*-history.md``, ``*-phase7.md``) describe
the project as it was, so their references are not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FROZEN = re.compile(r"-(history|phase7)\.md$")
MARKDOWN = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CHECKED_MD = [p for p in MARKDOWN if not FROZEN.search(p.name)]
LINK = re.compile(r"\]\(([A-Za-z0-9_./\-]+(?:#[\w\-]+)?)\)")  # ASCII: not maths like clamp_[0,B](ℓ_i)
# docs/x.md (or README.md), maybe in backticks or after "see", then a quoted title: '...' or "..."
SECTION_REF = re.compile(r"""\b((?:docs/[\w/\-]+|README)\.md)`*\)?,?\s+\(?["“']([A-Za-z][^"”'\n]{2,80})["”']""")


def _titles(doc: Path) -> set[str]:
    """Headings, bold terms (``**Adult**``) and table rows of a Markdown file, lower case, without backticks."""
    text = doc.read_text(encoding="utf-8")
    heads = [re.sub(r"^#+\s*", "", line) for line in text.splitlines() if line.startswith("#")]
    bold = re.findall(r"\*\*([^*\n]+)\*\*", text)
    rows = re.findall(r"^\|([^|\n]+)\|", text, flags=re.MULTILINE)  # a table's first column names its rows
    return {t.replace("`", "").strip().rstrip(":.").lower() for t in heads + bold + rows}


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    lines = doc.read_text(encoding="utf-8").splitlines()
    return {_slug(re.sub(r"^#+\s*", "", line)) for line in lines if re.match(r"#+\s", line)}


def _links() -> list[tuple[str, str]]:
    out = []
    for doc in CHECKED_MD:
        for m in LINK.finditer(doc.read_text(encoding="utf-8")):
            out.append((str(doc.relative_to(REPO)), m.group(1)))
    return out


@pytest.mark.parametrize(("doc", "target"), _links())
def test_a_relative_markdown_link_names_an_existing_file_and_heading(doc, target):
    path, _, anchor = target.partition("#")
    file = (REPO / doc).parent / path if path else REPO / doc
    assert file.exists(), f"{doc}: link {target!r}: no such file"
    if anchor and file.suffix == ".md":
        assert anchor in _anchors(file), f"{doc}: link {target!r}: no heading with that anchor"


def _section_refs() -> list[tuple[str, str, str]]:
    files = [*CHECKED_MD, *sorted((REPO / "src").rglob("*.py"))]
    out = []
    for f in files:
        for m in SECTION_REF.finditer(f.read_text(encoding="utf-8")):
            out.append((str(f.relative_to(REPO)), m.group(1), m.group(2)))
    return out


def test_the_section_reference_pattern_finds_the_references():
    refs = _section_refs()
    assert len(refs) > 50  # not vacuous: the code and docs point at sections this way
    assert any(r[1:] == ("docs/data.md", "Selection and the protected unit") for r in refs)


@pytest.mark.parametrize(("where", "doc", "title"), _section_refs())
def test_a_named_section_is_a_heading_or_bold_term_of_its_file(where, doc, title):
    path = REPO / doc
    assert path.exists(), f"{where}: names {doc}, which does not exist"
    titles = _titles(path)
    wanted = title.strip().rstrip(":.").lower()
    assert any(wanted == t or wanted in t for t in titles), f"{where}: {doc} has no section {title!r}"


def test_every_doc_file_named_in_the_code_and_docs_exists():
    named = set()
    for f in [*CHECKED_MD, *sorted((REPO / "src").rglob("*.py"))]:
        named |= {(str(f.relative_to(REPO)), d) for d in re.findall(r"\bdocs/[\w/\-]+\.md\b", f.read_text("utf-8"))}
    assert len(named) > 100  # not vacuous
    missing = sorted(f"{where}: {doc}" for where, doc in named if not (REPO / doc).exists())
    assert not missing, missing
