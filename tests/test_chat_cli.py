"""`pyspec chat` (issue 51) through a pipe and through a pseudo-terminal: three
turns, /clear, /save, Ctrl-C mid-answer; a later turn processes only its new
tokens (the caches are kept across turns)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import sys
import time

import pytest

from cli_helpers import pyspec_cmd


def _cmd():
    exe = shutil.which("pyspec")
    return [exe] if exe else [sys.executable, "-m", "pyspec.cli"]


def test_a_piped_conversation_keeps_its_caches(gemma_path, tmp_path, load_model):
    saved = tmp_path / "chat.json"
    r = pyspec_cmd("chat", "-m", gemma_path, "--stats", "-n", "6", "--temperature", "0", "--system", "Be brief.",
                   input=f"Name a colour.\nName another one.\n/save {saved}\n/clear\nName a fruit.\n")
    assert r.returncode == 0, r.stderr
    answers = [a for a in r.stdout.split("\n\n") if a.strip()]
    assert len(answers) == 3, r.stdout
    prompts = [tuple(map(int, m.groups())) for m in re.finditer(r"prompt: (\d+) new tokens of (\d+) \((\d+) cached\)",
                                                                r.stderr)]
    assert len(prompts) == 3, r.stderr
    convo = json.loads(saved.read_text())
    assert [m["role"] for m in convo] == ["system", "user", "assistant", "user", "assistant"]
    assert convo[2]["content"].strip() == answers[0].strip()
    # The second turn processes only what the first turn's prompt and answer do not hold.
    model = load_model(gemma_path, n_ctx=512)
    first = model.prompt_tokens(convo[:2]) + model.tokenize(convo[2]["content"], add_special=False)
    second = model.prompt_tokens(convo[:4])
    shared = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
    new, total, cached = prompts[1]
    assert total == len(second) and cached >= shared - 1 and cached > prompts[0][1], (prompts, shared)


def test_ctrl_c_stops_the_answer_not_the_session(gemma_path):
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: pyspec chat on the pseudo-terminal
        os.execvp(_cmd()[0], _cmd() + ["chat", "-m", gemma_path, "-n", "4000", "--temperature", "0"])
    out = b""

    def read_until(pattern: bytes, timeout: float) -> bool:
        nonlocal out
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, out):
                return True
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    return bool(re.search(pattern, out))
        return False

    try:
        assert read_until(rb">>> ", 120), out
        os.write(fd, b"Count from one to one hundred in words.\n")
        start = len(out)
        assert read_until(rb"(?s).{%d}" % (start + 80), 120), out  # the answer is on its way
        os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT
        assert read_until(rb"\(stopped\)", 60), out
        assert read_until(rb">>> ", 60), "the session did not go on after Ctrl-C"
        os.write(fd, b"/exit\n")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, out[-400:])
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


@pytest.mark.parametrize("line", ["/nothing", "/save"])
def test_unknown_commands_are_explained(gemma_path, line):
    r = pyspec_cmd("chat", "-m", gemma_path, "-n", "2", input=f"{line}\n")
    assert r.returncode == 0 and ("unknown command" in r.stderr or "usage: /save" in r.stderr), r.stderr
