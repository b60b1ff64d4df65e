"""Every code example of README.md and docs/*.md runs, so that none can rot
unseen: Python blocks with this environment's interpreter (a page's blocks in
order, in one process), shell blocks through bash, in a folder holding the
files the examples name, against the default models and, where an example
talks to a server, one `pyspec serve` (the Quick start's, default pair) started
for the session. A block that cannot run here carries a marker saying why
(tests/doc_blocks.py: its grammar and the rule of each language); its
`pyspec` command lines must still parse and its Python compile and name only
what pyspec has.

What running changes in an example, and nothing else:

- the server's address: the docs' ``127.0.0.1:8000`` (and the editors'
  ``8012``) is the session server's free port;
- ``/tmp/`` is a folder of this run's; ``my.gguf`` (the reader's own model)
  is the small test model, and the other files the examples name (FILES) are
  there;
- ``pyspec generate`` answers at most MAX_TOKENS tokens unless the example
  names its own ``-n`` (click keeps an option's last value, so the cap goes
  first); ``curl`` fails on an HTTP error (``--fail-with-body``), which ``curl -s``
  alone would print and exit 0 on.

Each distinct command line runs once in a session (README.md's commands
repeat docs/cli.md's). `pytest -s` prints each example's time: the whole file
took 128 s on 2 quiet cores with the models cached, the budget CI gives it
being a few minutes; a generating example asks for a few dozen tokens."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import doc_blocks
from doc_blocks import PYTHON, SHELL, TEXT

#: Answer length of a shell example's `pyspec generate` that names none.
MAX_TOKENS = 24
#: The server addresses the docs use; the session's server answers them all.
SERVER_ADDRESSES = ("127.0.0.1:8000", "localhost:8000", "127.0.0.1:8012")
#: Per page: its Python process, or one shell block.
TIMEOUT_S = 600

#: The files the examples name, as a reader would have them.
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
SOURCE = "x = 1\nprint(x + x)\n"
FILES = {
    "person.json": json.dumps(PERSON),
    "fruits.gbnf": 'root ::= fruit ", " fruit ", " fruit\nfruit ::= "apple" | "banana" | "cherry" | "pear"\n',
    "f.py": SOURCE,
    "file.py": SOURCE,
}
#: my.gguf, the reader's own model in the examples: the small test model.
MY_MODEL = "my.gguf"

ALL = doc_blocks.all_blocks()
RUN_PAGES = sorted({b.page for b in ALL if b.runs and not b.problems},
                   key=lambda p: (p != "README.md", p))


def _skipped_lines(block):
    """(line, text) of each command of a shell block that does not run."""
    return [(n, text) for n, text in doc_blocks.logical_lines(block)
            if block.marker is not None and (block.skipped is None or n in block.skipped)]


# --- without running anything ----------------------------------------------------------------

def test_every_block_runs_or_says_why():
    problems = []
    for b in ALL:
        problems += b.problems
        if not b.page:
            continue
        if not b.lang:
            problems.append(f"{b.where}: a fence without a language (```text for a diagram or output; "
                            "```bash or ```python for code)")
        elif b.lang in TEXT:
            if b.marker is not None:
                problems.append(f"{b.where}: a text block runs nowhere: it needs no marker")
            problems += [f"{b.where}: a command in a text block (make it ```bash): {line.strip()}"
                         for line in b.lines() if doc_blocks.is_command_line(line)]
        elif b.lang not in PYTHON | SHELL and b.marker is None:
            problems.append(f"{b.where}: a ```{b.lang} block cannot run here: mark it "
                            "(<!-- not run in CI: REASON -->)")
        if b.skipped is not None and b.lang in SHELL:
            commands = doc_blocks.logical_lines(b)
            covered = {n + k for n, text in commands for k in range(text.count("\n") + 1)}
            if b.skipped - covered:
                problems.append(f"{b.where}: the marker names lines {sorted(b.skipped - covered)}, "
                                "which hold no command")
            if {n for n, _ in commands} <= b.skipped:
                problems.append(f"{b.where}: the marker names every line: mark the whole block instead")
    assert not problems, "\n".join(problems)


def _pyspec_commands():
    """(where, words after `pyspec`) of every `pyspec` command in a shell block."""
    for b in ALL:
        if b.lang in SHELL:
            for n, text in doc_blocks.logical_lines(b):
                for words in doc_blocks.commands(text):
                    if words and words[0] == "pyspec":
                        yield f"{b.page}:{b.line + n}", words[1:]


def test_every_pyspec_command_parses():
    """Every `pyspec` command line in a shell block, run or not, names commands
    and options that exist, with values they take (click parses it; nothing runs)."""
    bad = []
    for where, args in _pyspec_commands():
        error = doc_blocks.parse_pyspec(args)
        if error:
            bad.append(f"{where}: pyspec {' '.join(args)[:80]}: {error}")
    assert not bad, "\n".join(bad)


def test_python_that_does_not_run_compiles_and_names_what_pyspec_has():
    problems = []
    for b in ALL:
        if b.lang in PYTHON:
            problems += doc_blocks.python_problems(b)
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Negative controls: a renamed option, an unknown command, a wrong value,
    a missing pyspec name and keyword, an unmarked block of another language,
    a marker without a reason and a marker before no block are all reported."""
    assert "No such option" in doc_blocks.parse_pyspec(["generate", "x", "--max-tokenz", "4"])
    assert "No such command" in doc_blocks.parse_pyspec(["bench", "paired-up"])
    assert doc_blocks.parse_pyspec(["generate", "x", "--policy", "psychic"])
    assert doc_blocks.parse_pyspec(["serve", "--llama-server-port", "1"])
    assert doc_blocks.parse_pyspec(["bench", "serve", "--llama-server", "/nowhere/llama-server"]) is None
    assert doc_blocks.parse_pyspec(["generate", "--help"]) is None

    page = tmp_path / "page.md"
    page.write_text("<!-- not run in CI: -->\n```bash\npyspec info\n```\n\n```nginx\nserver {}\n```\n\n"
                    "<!-- not run in CI, lines 9: a reason long enough -->\n```bash\npyspec info\n```\n\n"
                    "<!-- not run in CI: orphaned, no block follows -->\nprose\n", encoding="utf-8")
    old_root = doc_blocks.ROOT
    doc_blocks.ROOT = tmp_path
    try:
        found = list(doc_blocks.blocks(page))
    finally:
        doc_blocks.ROOT = old_root
    problems = [p for b in found for p in b.problems]
    assert any("gives no reason" in p for p in problems), problems
    assert any("not lines of the block" in p for p in problems), problems
    assert any("no code block follows" in p for p in problems), problems
    nginx = next(b for b in found if b.lang == "nginx")
    assert nginx.marker is None and not nginx.runs

    block = doc_blocks.Block("x.md", 1, "python", "from pyspec import Modle\nimport pyspec\n"
                             "pyspec.SpeculativeDecoder(None, draft_maximum=3)\npyspec.Nothing\n")
    problems = doc_blocks.python_problems(block)
    assert any("no Modle" in p for p in problems), problems
    assert any("draft_maximum" in p for p in problems), problems
    assert any("no attribute Nothing" in p for p in problems), problems
    assert doc_blocks.python_problems(doc_blocks.Block("x.md", 1, "python", "def f(:\n"))


# --- running them ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def docs_dir(tmp_path_factory, gemma_path):
    """The folder the examples run in, with the files they name."""
    d = tmp_path_factory.mktemp("docs-examples")
    for name, text in FILES.items():
        (d / name).write_text(text, encoding="utf-8")
    (d / MY_MODEL).symlink_to(gemma_path)
    (d / "tmp").mkdir()
    return d


def quick_start_serve_args():
    """The arguments of docs/server.md's first `pyspec serve` command (its Quick start's), but --port."""
    for b in ALL:
        if b.page == "docs/server.md" and b.lang in SHELL:
            for _, text in doc_blocks.logical_lines(b):
                for words in doc_blocks.commands(text):
                    if words[:2] == ["pyspec", "serve"]:
                        args, out = words[2:], []
                        while args:
                            a = args.pop(0)
                            if a == "--port":
                                args.pop(0)
                            elif not a.startswith("--port="):
                                out.append(a)
                        return out
    raise AssertionError("docs/server.md starts no server")


@pytest.fixture(scope="session")
def docs_server():
    """`pyspec serve` as docs/server.md's Quick start starts it (the default pair), on a free port."""
    from server_helpers import ServerProcess

    s = ServerProcess(*quick_start_serve_args())
    yield s
    assert s.stop() == 0, s.output()[-3000:]


@pytest.fixture(scope="session")
def ran():
    """The command lines (normalized) that ran in this session."""
    return {"commands": set()}


def _env():
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _rewrite(code: str, server, docs_dir: Path, shell: bool) -> str:
    if server is not None:
        for address in SERVER_ADDRESSES:
            code = code.replace(address, f"127.0.0.1:{server.port}")
    code = code.replace("/tmp/", f"{docs_dir}/tmp/")
    if shell:
        code = re.sub(r"\bpyspec generate\b", f"pyspec generate --max-tokens {MAX_TOKENS}", code)
    return code


def _shell_script(block, server, docs_dir, ran) -> str:
    lines = ["set -eo pipefail",
             'curl() { command curl --fail-with-body "$@"; }   # an HTTP error fails the example']
    skipped = {n for n, _ in _skipped_lines(block)}
    for n, text in doc_blocks.logical_lines(block):
        key = doc_blocks.normalized(text)
        if n in skipped:
            lines.append(f"# line {n}: not run ({block.reason})")
        elif key in ran["commands"]:
            lines.append(f"# line {n}: ran above, on another page")
        else:
            lines.append(f"echo {json.dumps(f'[{block.page}:{block.line + n}]')} >&2; SECONDS=0")
            lines.append(_rewrite(text, server, docs_dir, shell=True))
            lines.append(f"echo {json.dumps(f'[{block.page}:{block.line + n}: ')}$SECONDS s] >&2")
    return "\n".join(lines) + "\n"


def _timings(out: subprocess.CompletedProcess) -> None:
    """Each example's time, for `pytest -s` (CI's budget for this file is a few minutes)."""
    for line in re.findall(r"^\[\S+: [\d.]+ s\]$", out.stderr, re.M):
        print(line)


def _failure(what: str, out: subprocess.CompletedProcess, script: str) -> str:
    return (f"{what} failed (exit {out.returncode}):\n--- ran:\n{script}\n--- stdout:\n{out.stdout[-3000:]}\n"
            f"--- stderr:\n{out.stderr[-4000:]}")


@pytest.mark.pair
@pytest.mark.parametrize("page", RUN_PAGES)
def test_examples_run(page, request, docs_dir, ran):
    """The page's examples run as written (but for the changes the module's docstring lists)."""
    blocks = [b for b in ALL if b.page == page and b.runs and not b.problems]
    needs_server = any(a in b.body for b in blocks for a in SERVER_ADDRESSES)
    server = request.getfixturevalue("docs_server") if needs_server else None
    failures = []

    python = [b for b in blocks if b.lang in PYTHON]
    if python:
        spec = [{"page": b.page, "line": b.line, "body": _rewrite(b.body, server, docs_dir, shell=False)}
                for b in python]
        spec_file = docs_dir / f"{page.replace('/', '_')}.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        out = subprocess.run([sys.executable, "-c", doc_blocks.RUNNER, str(spec_file)], cwd=docs_dir,
                             env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
        _timings(out)
        if out.returncode != 0:
            failures.append(_failure(f"{page}'s Python blocks", out, "\n\n".join(s["body"] for s in spec)))

    for b in blocks:
        if b.lang not in SHELL:
            continue
        script = _shell_script(b, server, docs_dir, ran)
        out = subprocess.run(["bash", "-c", script], cwd=docs_dir, env=_env(), capture_output=True, text=True,
                             timeout=TIMEOUT_S)
        _timings(out)
        if out.returncode != 0:
            failures.append(_failure(f"{b.where}", out, script))
        else:
            skipped = {n for n, _ in _skipped_lines(b)}
            ran["commands"] |= {doc_blocks.normalized(t) for n, t in doc_blocks.logical_lines(b) if n not in skipped}
    assert not failures, "\n\n".join(failures)
