"""Rules of the source layout that a reviewer would otherwise check by hand.

A module of pyspec/ longer than LIMIT lines says at its top (in its docstring)
why it is one file: "Over 400 lines on purpose: ...". A module that grows past
the limit without one fails here, and is split or explains itself.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

import pyspec

LIMIT = 400
REASON = "Over 400 lines on purpose:"
PACKAGE = Path(pyspec.__file__).parent


def unexplained(name: str, text: str) -> List[str]:
    """The problem with one module's text, if any (empty: none)."""
    n = text.count("\n") + (not text.endswith("\n"))
    if n <= LIMIT:
        return []
    doc = ast.get_docstring(ast.parse(text)) or ""
    return [] if REASON in doc else [f"{name}: {n} lines and no '{REASON} …' in its docstring"]


def test_long_modules_say_why():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        problems += unexplained(str(path.relative_to(PACKAGE)), path.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_long_module_without_a_reason():
    """Negative control: the same check on a long module without the line, and
    on one whose reason is a comment rather than its docstring."""
    body = "x = 1\n" * (LIMIT + 1)
    assert unexplained("long.py", '"""A module."""\n' + body)
    assert unexplained("comment.py", f'"""A module."""\n# {REASON} none\n' + body)
    assert not unexplained("ok.py", f'"""A module.\n\n{REASON} a reason.\n"""\n' + body)
    assert not unexplained("short.py", '"""A module."""\n' + "x = 1\n" * (LIMIT - 2))
