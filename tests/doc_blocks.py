"""The fenced code blocks of README.md and docs/*.md, for tests/test_docs_examples.py:
finding them and their markers, the checks of a block that does not run (its
`pyspec` command lines parse, its Python compiles and names what pyspec has),
and the runner of a page's Python blocks (RUNNER).

A block runs unless the last non-blank line above its fence is a marker, an
HTML comment that says why (Markdown renders it as nothing):

    <!-- not run in CI: REASON -->                 the whole block
    <!-- not run in CI, lines 3-4, 7: REASON -->   those lines of a shell block
                                                   (counted from the block's first line)

By language:

- ``python``: a page's Python blocks run in order in one process, sharing their
  names, as a reader who pastes them in order would; so a page's first block
  imports and loads what the later ones use.
- ``bash``, ``sh``, ``shell``: each block is one ``bash`` script (stopping at its
  first failing command); ``console``: its ``$ `` lines are the commands.
- ``text``: a diagram or a program's output, not code; it may not hold a
  ``pyspec`` command line.
- Any other language (``json``, ``nginx``, ...) cannot run here, and an unlabelled
  fence says nothing: both must be marked (or labelled ``text``).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
TEXT = {"text"}

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
COMMENT = re.compile(r"^\s*<!--(?P<body>.*?)-->\s*$")
MARKER = re.compile(r"^\s*not run in CI(?:,\s*lines?\s+(?P<lines>[\d\s,-]+))?\s*:(?P<reason>.*)$", re.S)
# A command line in a `text` block: `pyspec COMMAND ...` (or `$ pyspec ...`); see is_command_line.
COMMAND_LINE = re.compile(r"^\s*(?:\$ )?(?:[A-Z_]+=\S* )*pyspec (?P<command>[a-z-]+)")


def pages() -> List[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Block:
    page: str                       # relative to the repository, e.g. docs/cli.md
    line: int                       # the opening fence's line (1-based)
    lang: str
    body: str                       # the code, its fence's indentation removed
    marker: Optional[str] = None    # the marker comment's text, if any
    reason: str = ""
    skipped: Optional[FrozenSet[int]] = None  # lines not run (1-based, in the block); None: all
    problems: List[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether (some of) this block runs."""
        return self.lang in PYTHON | SHELL and (self.marker is None or self.skipped is not None)

    def lines(self) -> List[str]:
        return self.body.splitlines()


def _line_set(spec: str, n: int) -> Tuple[FrozenSet[int], List[str]]:
    out, problems = set(), []
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            problems.append(f"cannot read the line range {part!r}")
            continue
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if not 1 <= a <= b <= n:
            problems.append(f"lines {part} are not lines of the block (it has {n})")
        out |= set(range(a, b + 1))
    return frozenset(out), problems


def blocks(path: Path) -> Iterator[Block]:
    """The fenced blocks of one page, each with its marker (or the problems of it),
    plus a problem block for each marker that precedes no block."""
    rel = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    last_text: Optional[Tuple[int, str]] = None  # (line number, text) of the last non-blank line
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                yield from _orphan(rel, last_text)
                last_text = (i + 1, lines[i])
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        j = i + 1
        while j < len(lines) and not re.match(rf"^ *{fence[0]}{{{len(fence)},}}\s*$", lines[j]):
            j += 1
        body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j])
        block = Block(rel, i + 1, info.split()[0].lower() if info else "", body + "\n" if body else "")
        marker = _marker_of(last_text)
        if marker is not None:
            block.marker = marker
            mm = MARKER.match(marker)
            if not mm:
                block.problems.append(f"{block.where}: cannot read the marker {marker.strip()!r} "
                                      "(write <!-- not run in CI: REASON --> or <!-- not run in CI, lines 2-3: REASON -->)")
            else:
                block.reason = " ".join(mm.group("reason").split())
                if len(block.reason) < 10:
                    block.problems.append(f"{block.where}: the marker gives no reason ({marker.strip()!r})")
                if mm.group("lines"):
                    if block.lang not in SHELL:
                        block.problems.append(f"{block.where}: only a shell block's lines can be left out one by one")
                    block.skipped, problems = _line_set(mm.group("lines"), len(block.lines()))
                    block.problems += [f"{block.where}: {p}" for p in problems]
        yield block
        last_text = None
        i = j + 1
    yield from _orphan(rel, last_text)


def _orphan(rel: str, last_text: Optional[Tuple[int, str]]) -> Iterator[Block]:
    """A problem block for a marker that text or the page's end follows: it marks no block."""
    if _marker_of(last_text) is not None:
        yield Block(rel, last_text[0], "", "", problems=[
            f"{rel}:{last_text[0]}: a 'not run in CI' marker that no code block follows"])


def _marker_of(last_text: Optional[Tuple[int, str]]) -> Optional[str]:
    """The body of a 'not run' comment on that line, else None (other comments are not markers)."""
    if last_text is None:
        return None
    m = COMMENT.match(last_text[1])
    if m and re.match(r"\s*not run", m.group("body"), re.I):
        return m.group("body")
    return None


def is_command_line(line: str) -> bool:
    """Whether a line of a text block is a `pyspec` command (not a message, `pyspec: ...`,
    nor a table row of a benchmark's output, `pyspec plain ...`)."""
    from pyspec.cli import main
    from pyspec.cli.bench_group import RENAMED

    m = COMMAND_LINE.match(line)
    return bool(m) and (m.group("command") in main.commands or m.group("command") in RENAMED)


def all_blocks() -> List[Block]:
    return [b for page in pages() for b in blocks(page)]


# --- shell ----------------------------------------------------------------------------------

def logical_lines(block: Block) -> List[Tuple[int, str]]:
    """(first physical line, text) of each command of a shell block: lines joined
    where a backslash ends one or a quote is still open; comment-only and blank
    lines dropped; a console block's `$ ` lines only."""
    out: List[Tuple[int, str]] = []
    pending, start = "", 0
    for n, line in enumerate(block.lines(), 1):
        if block.lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not pending:
            start = n
        pending += line + "\n"
        if _open_quote(pending) or pending.endswith("\\\n"):
            continue
        text = pending.rstrip("\n")
        pending = ""
        if text.strip() and not text.lstrip().startswith("#"):
            out.append((start, text))
    if pending.strip():
        out.append((start, pending.rstrip("\n")))
    return out


def _open_quote(text: str) -> bool:
    """Whether a quote is still open at the end of `text` (comments skipped)."""
    quote, escaped, comment, prev = None, False, False, "\n"
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            comment = True
        prev = ch
    return quote is not None


def commands(text: str) -> List[List[str]]:
    """The simple commands of a shell line (split at && || ; | &), each as its
    words without leading VAR=value assignments; comments dropped."""
    lex = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out, cur = [], []
    for tok in lex:
        if tok and set(tok) <= set("&|;()<>"):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(tok)
    if cur:
        out.append(cur)
    return [[w for k, w in enumerate(c) if not (re.match(r"^[A-Za-z_]\w*=", w) and all(
        re.match(r"^[A-Za-z_]\w*=", x) for x in c[:k + 1]))] for c in out]


def normalized(text: str) -> str:
    """A command line without its comment and extra blanks: two spellings of one command compare equal."""
    return " ".join(" ".join(shlex.quote(w) for w in c) for c in commands(text))


@contextlib.contextmanager
def _paths_need_not_exist(group):
    """click.Path(exists=True) options accept any path for a while: an example's
    files (a llama-server build, the reader's model) are not this machine's."""
    import click

    changed = []

    def walk(cmd):
        for p in cmd.params:
            if isinstance(p.type, click.Path) and p.type.exists:
                p.type.exists = False
                changed.append(p.type)
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(group)
    try:
        yield
    finally:
        for t in changed:
            t.exists = True


def parse_pyspec(args: List[str]) -> Optional[str]:
    """None if `pyspec ARGS` parses (each command and option exists, each value
    converts), else click's message. Nothing is invoked."""
    import click
    from pyspec.cli import main

    with _paths_need_not_exist(main), contextlib.redirect_stdout(io.StringIO()):  # --help's text
        cmd, name, ctx, rest = main, "pyspec", None, list(args)
        try:
            while True:
                ctx = cmd.make_context(name, rest, parent=ctx)
                if not isinstance(cmd, click.Group):
                    return None
                protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
                rest = [*protected, *ctx.args]
                if not rest:
                    return None
                name, cmd, rest = cmd.resolve_command(ctx, rest)
        except click.exceptions.Exit:
            return None  # --help, --version
        except click.ClickException as e:
            return e.format_message()


# --- python ---------------------------------------------------------------------------------

def python_problems(block: Block) -> List[str]:
    """A Python block that does not run: it compiles, and every name it takes from
    pyspec exists (imports, `pyspec.X.Y`, and the keywords of calls to them)."""
    try:
        tree = ast.parse(block.body, filename=block.page)
    except SyntaxError as e:
        return [f"{block.page}:{block.line + (e.lineno or 0)}: {e.msg}"]
    known: Dict[str, object] = {}  # names bound to pyspec objects
    problems: List[str] = []

    def say(node, what):
        problems.append(f"{block.page}:{block.line + node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pyspec":
                    try:
                        mod = importlib.import_module(a.name)
                    except ImportError as e:
                        say(node, f"import {a.name}: {e}")
                        continue
                    known[a.asname or "pyspec"] = mod if a.asname else importlib.import_module("pyspec")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyspec":
            try:
                mod = importlib.import_module(node.module)
            except ImportError as e:
                say(node, f"from {node.module} import ...: {e}")
                continue
            for a in node.names:
                if hasattr(mod, a.name):
                    known[a.asname or a.name] = getattr(mod, a.name)
                else:
                    try:
                        known[a.asname or a.name] = importlib.import_module(f"{node.module}.{a.name}")
                    except ImportError:
                        say(node, f"{node.module} has no {a.name}")

    def resolve(expr):
        """The pyspec object an expression names (pyspec.Model, Sampling.GREEDY), or None."""
        if isinstance(expr, ast.Name):
            return known.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = resolve(expr.value)
            if base is None or not (inspect.ismodule(base) or inspect.isclass(base)):
                return None
            if not hasattr(base, expr.attr):
                say(expr, f"{ast.unparse(expr.value)} has no attribute {expr.attr}")
                return None
            return getattr(base, expr.attr)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "ctx", None), ast.Store):
            resolve(node)
        if isinstance(node, ast.Call):
            fn = resolve(node.func)
            if fn is None or not callable(fn):
                continue
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                continue
            for kw in node.keywords:
                if kw.arg is not None and kw.arg not in params:
                    say(node, f"{ast.unparse(node.func)}() takes no keyword {kw.arg!r}")
    return sorted(set(problems))


#: Runs a page's Python blocks (a JSON list of {page, line, body}, the file named
#: by argv[1]) in order in one namespace, as `python -c RUNNER FILE`: a traceback
#: names the page and its line (each block is compiled at its place in the page).
RUNNER = """
import json, sys, time
namespace = {"__name__": "__main__"}
for b in json.load(open(sys.argv[1], encoding="utf-8")):
    print(f"\\n[{b['page']}:{b['line']}]", file=sys.stderr, flush=True)
    start = time.monotonic()
    exec(compile("\\n" * b["line"] + b["body"], b["page"], "exec"), namespace)
    sys.stdout.flush()
    print(f"\\n[{b['page']}:{b['line']}: {time.monotonic() - start:.1f} s]", file=sys.stderr, flush=True)
"""
