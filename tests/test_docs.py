"""The documentation stays true and findable: the README is short and links
every page under docs/; every relative link (and its #anchor) resolves, and the
files the pages name exist; the drafter and policy tables of docs/drafters.md describe exactly what the core
builds; the README's server commands are docs/server.md's Quick start (which
tests/test_docs_examples.py runs, with every other example)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 170
CELL_MAX_CHARS = 300

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages():
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links and headings there are not markdown)."""
    return "".join(text.split("```")[0::2])


def _anchors(path: Path) -> set:
    """GitHub's heading anchors of a markdown file: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def _section(text: str, heading: str) -> str:
    """The body under `heading` (a `## ` line) up to the next `## ` heading."""
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def _code_blocks(section: str):
    """(language, body) of each fenced code block of `section`, in order."""
    blocks = []
    for part in section.split("```")[1::2]:
        lang, _, body = part.partition("\n")
        blocks.append((lang.strip(), body))
    return blocks


def test_the_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail into docs/"


def test_the_readme_links_every_page_of_docs():
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    linked = {(README.parent / target.split("#")[0]).resolve()
              for target in LINK.findall(_prose(README.read_text(encoding="utf-8")))}
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_relative_links_resolve():
    broken = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# Repository paths the pages name in backticks (globs allowed) must exist.
REPO_PATH = re.compile(r"`((?:cpp|pyspec|tests|models|docs|\.ci)/[^`\s]*)`")
NOT_IN_THE_TREE = {"pyspec/models/catalog.json"}  # where the wheel ships models/catalog.json


def test_named_files_exist():
    missing = []
    for page in _pages():
        for path in REPO_PATH.findall(page.read_text(encoding="utf-8")):
            if path not in NOT_IN_THE_TREE and not any(ROOT.glob(path.rstrip("/"))):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "pages name files that do not exist:\n" + "\n".join(missing)


def test_the_layout_map_names_every_cpp_file():
    """Each file of cpp/ is named (by path, glob or name) in a row of its folder in
    docs/architecture.md's Source layout; rename a file, and the map must follow."""
    rows = [line for line in (DOCS / "architecture.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `cpp/")]
    named = set()
    for row in rows:
        folder = ROOT / re.match(r"\| `(cpp/\w+/)", row).group(1)
        for token in re.findall(r"`([\w.*/]+)`", row):
            base = ROOT if token.startswith("cpp/") else folder
            named |= set(base.glob(token)) | set(base.glob(token + ".*"))
    unnamed = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "cpp").rglob("*") if f.is_file() and f not in named)
    assert not unnamed, f"docs/architecture.md's Source layout does not name {unnamed}"


def test_no_table_cell_is_a_page():
    long = []
    for page in _pages():
        for line in _prose(page.read_text(encoding="utf-8")).splitlines():
            if line.startswith("|"):
                long += [f"{page.relative_to(ROOT)}: {cell.strip()[:60]}…"
                         for cell in line.strip("|").split(" | ") if len(cell.strip()) > CELL_MAX_CHARS]
    assert not long, "table cells over %d characters (make them prose or lists):\n%s" % (CELL_MAX_CHARS, "\n".join(long))


def _docs_table(heading: str):
    """Rows (first column's code name, last column) of the table under `heading` in docs/drafters.md."""
    text = (DOCS / "drafters.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    rows = []
    for line in section.splitlines()[1:]:
        m = re.match(r"\| `(\w+)` \|.*\| ([^|]*)\|$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
        elif rows and not line.startswith("|"):
            break
    return rows


def test_the_docs_describe_exactly_the_core_catalog():
    from pyspec.speculative import DRAFTERS, POLICIES

    policies = _docs_table("| policy | rule |")
    assert [n for n, _ in policies] == list(POLICIES)
    assert [int(cap) for _, cap in policies] == [p["default_draft_max"] for p in POLICIES.values()]
    assert [n for n, _ in _docs_table("| drafter | what |")] == list(DRAFTERS)


def _server_blocks():
    """docs/server.md's Quick start: its bash and python code blocks, in order."""
    return _code_blocks(_section((DOCS / "server.md").read_text(encoding="utf-8"), "## Quick start"))


def test_the_readme_server_commands_are_the_quick_starts():
    readme = _code_blocks(_section(README.read_text(encoding="utf-8"), "## Server"))
    assert readme, "README.md's Server section has no code blocks"
    quick = [body for _, body in _server_blocks()]
    for _, body in readme:
        assert body in quick, f"README.md's server block is not in docs/server.md's Quick start:\n{body}"
