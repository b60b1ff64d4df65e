"""`pyspec chat` (issue 51) through a pipe and through a pseudo-terminal:
three turns, /clear, /save, Ctrl-C mid-answer (the answer stops, the session
goes on); a later turn processes only its new tokens (both caches are kept
across turns); exit status 0 after /exit and at the end of input."""

from __future__ import annotations

import json
import os
import re
import select
import sys
import tempfile
import time

import pytest

from cli_helpers import pyspec_cmd
from pyspec.cli.chat import next_turn_head

STATS = re.compile(rb"prompt: (\d+) new tokens of (\d+) \((\d+) cached\)")


def _prompt_stats(text: str):
    return [tuple(map(int, m.groups())) for m in STATS.finditer(text.encode())]


def test_a_piped_conversation_keeps_its_caches(gemma_path, tmp_path, load_model):
    saved = tmp_path / "chat.json"
    # A draft model too (the same file, its own context): both caches are kept across turns.
    r = pyspec_cmd("chat", "-m", gemma_path, "-d", gemma_path, "--stats", "-n", "6", "--temperature", "0",
                   "--system", "Be brief.",
                   input=f"Name a colour.\nName another one.\n/save {saved}\n/clear\nName a fruit.\n")
    assert r.returncode == 0, r.stderr  # the input's end ends the session
    answers = [a for a in r.stdout.split("\n\n") if a.strip()]
    assert len(answers) == 3, r.stdout
    prompts = _prompt_stats(r.stderr)
    assert len(prompts) == 3, r.stderr
    assert prompts[0][2] == 0, prompts  # a fresh process: nothing cached yet
    convo = json.loads(saved.read_text())
    assert [m["role"] for m in convo] == ["system", "user", "assistant", "user", "assistant"]
    assert convo[2]["content"].strip() == answers[0].strip()
    # The second turn processes only what the first turn's prompt and answer do
    # not hold: the conversation is not prefilled again.
    model = load_model(gemma_path, n_ctx=512)
    first = model.prompt_tokens(convo[:2]) + model.tokenize(convo[2]["content"], add_special=False)
    second = model.prompt_tokens(convo[:4])
    shared = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
    new, total, cached = prompts[1]
    assert total == len(second) and new == total - cached, prompts
    assert cached > prompts[0][1] and new <= len(second) - shared + 1, (prompts, shared, len(second))
    # After /clear the system message's tokens still come from the cache.
    assert 0 < prompts[2][2] < prompts[2][1], prompts


def test_commands_and_exit(gemma_path, tmp_path):
    r = pyspec_cmd("chat", "-m", gemma_path, "-n", "2",
                   input=f"/nothing\n/save\n/save {tmp_path}\n/help\n/exit\nNever answered.\n")
    assert r.returncode == 0, r.stderr
    assert "unknown command /nothing" in r.stderr and "usage: /save" in r.stderr, r.stderr
    assert f"cannot save to {tmp_path}" in r.stderr, r.stderr  # a folder: the session goes on
    assert r.stdout == "", r.stdout  # nothing after /exit was answered


class Terminal:
    """`pyspec chat` on a pseudo-terminal, as a person at a terminal runs it."""

    def __init__(self, *args: str) -> None:
        import pty

        cmd = [sys.executable, "-m", "pyspec.cli", "chat", *args]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: outside the checkout, whose source would shadow the installed package
            os.chdir(tempfile.gettempdir())
            os.execv(cmd[0], cmd)
        self.out = b""

    def expect(self, pattern: bytes, after: int, timeout: float = 60) -> int:
        """Wait until ``pattern`` appears at or after offset ``after``; the offset just past it."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.compile(pattern).search(self.out, after)
            if m:
                return m.end()
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} after offset {after} in {self.out[after:][-600:]!r}")
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:  # the child has gone: nothing more will come
                    deadline = 0

    def send(self, data: bytes) -> int:
        """Write ``data`` as typed; the offset of the output from here on."""
        at = len(self.out)
        os.write(self.fd, data)
        return at

    def wait(self, timeout: float = 60) -> int:
        """The exit status (reading what the child still writes meanwhile)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:
                    time.sleep(0.1)
        raise AssertionError(f"still running: {self.out[-600:]!r}")

    def close(self) -> None:
        if self.pid:  # not reaped yet
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def test_ctrl_c_stops_the_answer_not_the_session(gemma_path, tmp_path, load_model):
    """In a terminal: a turn, then Ctrl-C while the second answer streams
    (it stops, a new prompt comes), a third turn answered on the caches with
    the stopped answer kept, /clear, /exit: exit status 0. (The SIGSEGV once
    seen here came from a Ctrl-C landing inside the generation thread's
    start(), before the answer: test_threads_interrupts.py's
    test_ctrl_c_while_the_worker_starts_cancels_the_generation makes it happen.)"""
    # Plain decoding: 64 tokens take long enough, on any machine, for Ctrl-C to land mid-answer.
    term = Terminal("-m", gemma_path, "--no-draft", "--stats", "-n", "64", "--temperature", "0")
    try:
        term.expect(rb">>> ", 0, timeout=120)
        term.expect(STATS.pattern + rb"(?s:.*?)>>> ", term.send(b"Name a colour.\n"))
        first = _prompt_stats(term.out.decode(errors="replace"))[0]
        echo = term.send(b"Count from one to one hundred in words.\n")
        answer = term.expect(rb"words\.\r\n", echo)
        term.expect(rb"\S", answer)  # the answer is streaming
        stop = term.send(b"\x03")  # Ctrl-C: the terminal sends SIGINT
        stopped = term.expect(rb"\(stopped\)", stop)
        term.expect(rb">>> ", stopped)  # a new prompt, after the interrupt
        assert not STATS.search(term.out, echo, stopped), "the interrupted answer finished"
        term.expect(STATS.pattern + rb"(?s:.*?)>>> ", term.send(b"Name a fruit.\n"))  # answered
        third = _prompt_stats(term.out[stopped:].decode(errors="replace"))[0]
        saved = tmp_path / "chat.json"
        term.expect(rb"\(saved 6 messages", term.send(f"/save {saved}\n".encode()))
        # Its prompt holds the whole conversation, the stopped answer included, and
        # only its own message was new: the rest came from the cache, the next
        # turn's head (the template's end of the answer and start of a user
        # message) put there while the prompt waited (chat.warm).
        convo = json.loads(saved.read_text())
        assert [m["role"] for m in convo] == ["user", "assistant"] * 3, convo
        # The stopped answer is kept as it was shown, and the first turn's whole prompt came from the cache.
        assert convo[3]["content"] and convo[3]["content"] in term.out.decode(errors="replace").replace("\r\n", "\n")
        assert third[2] > first[1], (first, third)
        model = load_model(gemma_path, n_ctx=512)
        head = next_turn_head(model, convo[:4])
        assert third == (len(model.prompt_tokens(convo[:5])) - len(head), len(model.prompt_tokens(convo[:5])),
                         len(head)), (third, len(head))
        term.expect(rb"\(conversation cleared\)(?s:.*?)>>> ", term.send(b"/clear\n"))
        term.send(b"/exit\n")
        code = term.wait()
        assert code == 0, (code, term.out[-600:])
    finally:
        term.close()


@pytest.mark.parametrize("end", [b"\x04", b"/exit\n"], ids=["ctrl-d", "exit"])
def test_a_terminal_session_ends_with_status_0(gemma_path, end):
    term = Terminal("-m", gemma_path, "-n", "2")
    try:
        term.expect(rb">>> ", 0, timeout=120)
        term.send(end)
        assert term.wait() == 0, term.out[-600:]
    finally:
        term.close()
