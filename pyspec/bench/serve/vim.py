"""The real plugin against servers (`pyspec bench vim`): llama.vim in Vim, in a
pseudo-terminal, typing at a person's pace, with a logging proxy
(vim_proxy.py) between the plugin and each server.

Why: a replay (editor.py) sends one request per step and waits for it. The
plugin sends a request per pause of 0.6 s while the user types, kills the
older one's curl, and warms its ring of chunks from other files every second
while the user pauses; what a user sees is the time from the last keystroke
to a suggestion on screen, through all of that (issue 61).

Session (deterministic for a seed): Vim opens a copy of a file of the
standard library, after a second one (so the ring holds chunks of both), and
waits a few seconds in normal mode. Then at each site (editor_sites.py's fresh
lines: any statement's first line, from another seeded pick of files) it
changes the line (``cc``: its indentation stays), types its text in ``steps``
parts, a key every ``pace`` seconds (±30 %, seeded), and after each part waits
until the plugin shows its answer for the cursor (its info line appears)
or ``timeout`` passes. After the last part a shown suggestion is accepted
(Tab) and the line is checked to be the typed text plus what was shown. Then
``:e!`` puts the file back. Sites alternate between backends in
``stats.run_order``.

Vim reports its state over a channel (mode, cursor, the line, the hint's
text properties) whenever it changes, timed on arrival here. Figures per
backend: keystroke-to-hint p50 and p90 (nearest rank) with 95 % bootstrap
intervals over sites; hints that never came; empty hints (an answer with
nothing to show); accepts that inserted what was shown; requests the plugin
sent (suggestions, warm-ups) and the share it gave up on (closed before the
answer); the /infill wall time of those answered.
"""

from __future__ import annotations

import json
import os
import pty
import random
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from .editor_sites import Site

#: llama.vim's defaults (this version's), the endpoint aside.
PLUGIN_DEFAULTS = {"n_prefix": 256, "n_suffix": 64, "n_predict": 128, "t_max_prompt_ms": 500,
                   "t_max_predict_ms": 3000, "show_info": 2, "auto_fim": True, "max_line_suffix": 8,
                   "ring_n_chunks": 64, "ring_chunk_size": 64, "ring_scope": 1024, "ring_update_ms": 1000}

_VIMRC = r"""
set nocompatible
let &runtimepath = '{rtp},' . &runtimepath
set autoindent expandtab shiftwidth=4 tabstop=8 noswapfile nobackup noundofile nowritebackup
set shortmess+=I ttimeoutlen=10 cmdheight=4 laststatus=0 viminfo= hidden
let g:llama_config = json_decode('{config}')
call llama#init()
let g:bench_ch = ch_open('127.0.0.1:{port}', {{'mode': 'nl', 'waittime': 5000}})
let g:bench_last = ''
function! BenchState(timer) abort
  let l:props = prop_list(line('.'), {{'types': ['llama_hl_hint', 'llama_hl_info']}})
  let l:hint = len(filter(copy(l:props), {{_, p -> p.type ==# 'llama_hl_hint'}}))
  let l:info = len(filter(copy(l:props), {{_, p -> p.type ==# 'llama_hl_info'}})) > 0
  let l:state = json_encode([mode(), line('.'), col('.'), getline('.'), l:hint, l:info])
  if l:state !=# g:bench_last && ch_status(g:bench_ch) ==# 'open'
    let g:bench_last = l:state
    call ch_sendraw(g:bench_ch, l:state . "\n")
  endif
endfunction
call timer_start(5, 'BenchState', {{'repeat': -1}})
"""


@dataclass
class State:
    """What Vim reported, at ``t`` (time.monotonic() on arrival)."""

    t: float
    mode: str
    line: int
    col: int
    text: str
    n_hint: int              # the suggestion's text properties (its non-empty first line, the lines below)
    shown: bool              # the plugin's info line is up: an answer for this cursor arrived


def _state(t: float, raw: list) -> State:
    mode, line, col, text, n_hint, info = raw
    return State(t, mode, line, col, text, int(n_hint), bool(info))


def shown_lines(content: str, n_hint: int) -> List[str]:
    """What the plugin showed of an answer's ``content``: its lines without the
    trailing empty ones, or [""] where it showed nothing (no text property: an
    empty answer, or one its rules dropped as repeating the text below).
    (This Vim's prop_list() does not return a virtual text's own text.)"""
    lines = content.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    return lines if n_hint and lines else [""]


class Vim:
    """Vim with llama.vim pointed at ``endpoint``, editing ``path``, in a pty."""

    def __init__(self, runtime: Path, path: Path, endpoint: str, *, config: Optional[dict] = None) -> None:
        self.states: List[State] = []
        self._changed = threading.Condition()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.dir = Path(tempfile.mkdtemp(prefix="pyspec-vim-"))
        conf = dict(PLUGIN_DEFAULTS, **(config or {}), endpoint=endpoint)
        vimrc = self.dir / "vimrc"
        vimrc.write_text(_VIMRC.format(rtp=str(runtime).replace("'", "''"), port=listener.getsockname()[1],
                                       config=json.dumps(conf).replace("'", "''")))
        vim = shutil.which("vim")
        if vim is None:
            raise RuntimeError("no vim on PATH (Debian: apt install vim; it needs +job +channel +timers +textprop)")
        env = dict(os.environ, TERM="xterm-256color", HOME=str(self.dir), LINES="40", COLUMNS="200")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: Vim on the pty (never back into this program's code)
            try:
                os.execve(vim, [vim, "-N", "-u", str(vimrc), "-i", "NONE", str(path)], env)
            finally:
                os._exit(127)
        threading.Thread(target=self._drain, daemon=True).start()
        listener.settimeout(30)
        try:
            conn, _ = listener.accept()
        except OSError:
            self.close()
            raise RuntimeError("Vim did not open its channel in 30 s (does it have +channel +job +timers?)") from None
        finally:
            listener.close()
        threading.Thread(target=self._listen, args=(conn,), daemon=True).start()

    def _drain(self) -> None:  # Vim blocks if its screen output is not read
        try:
            while os.read(self.fd, 65536):
                pass
        except OSError:
            pass

    def _listen(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    s = _state(time.monotonic(), json.loads(line))
                except (ValueError, TypeError):
                    continue  # not a state line (a Vim message on the channel)
                with self._changed:
                    self.states.append(s)
                    self._changed.notify_all()

    def keys(self, text: str) -> float:
        """Type ``text`` at once; returns when (time.monotonic())."""
        os.write(self.fd, text.encode("utf-8"))
        return time.monotonic()

    def wait(self, ok: Callable[[State], bool], after: float, timeout: float) -> Optional[State]:
        """The first state since ``after`` that ``ok`` accepts (None: none in ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for s in self.states:
                    if s.t >= after and ok(s):
                        return s
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(min(left, 0.05))

    @property
    def now(self) -> Optional[State]:
        with self._changed:
            return self.states[-1] if self.states else None

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Pause:
    """One pause while a line is typed: what the user waited for."""

    site: int
    backend: str
    typed: str                     # the line so far
    t_key: float                   # the last keystroke
    wait_s: Optional[float]        # keystroke to hint (None: no answer shown within the timeout)
    hint: List[str] = field(default_factory=list)
    accepted: Optional[bool] = None  # the last pause: Tab inserted exactly what was shown


def _answer(log: Sequence[Any], typed: str, before: float) -> str:
    """The content of the last suggestion answered for ``typed`` by ``before``."""
    for ex in reversed(log):
        if ex.kind == "fim" and ex.status == 200 and ex.t_out <= before and ex.body.get("prompt") == typed:
            return str(ex.answer.get("content", ""))
    return ""


def type_site(vim: Vim, log: Sequence[Any], site: Site, index: int, backend: str, *, steps: int, pace: float,
              timeout: float, rng: random.Random) -> List[Pause]:
    """Change ``site``'s line and type it again (module docstring); put the file back."""
    vim.keys("\x1b")
    t = vim.keys(f":{site.line_no}\r")
    vim.wait(lambda s: s.mode == "n" and s.line == site.line_no, t, 10)
    t = vim.keys("cc")
    vim.wait(lambda s: s.mode == "i" and s.line == site.line_no, t, 10)
    body = site.line[site.indent:]
    ends = sorted({max(1, round(len(body) * j / steps)) for j in range(1, steps + 1)})
    out, at = [], 0
    for end in ends:
        for ch in body[at:end]:
            t_key = vim.keys(ch)
            time.sleep(pace * rng.uniform(0.7, 1.3))
        at = end
        col = len(site.line[:site.indent + end].encode("utf-8")) + 1  # Vim's columns count bytes
        shown = vim.wait(lambda s: s.mode == "i" and s.line == site.line_no and s.col == col and s.shown,
                         t_key, timeout)
        typed = site.line[:site.indent + end]
        hint = shown_lines(_answer(log, typed, shown.t), shown.n_hint) if shown else []
        out.append(Pause(index, backend, typed, t_key, None if shown is None else shown.t - t_key, hint))
    last = out[-1]
    if last.hint and any(last.hint):
        # Tab: the first line goes after the cursor, the others below it, the cursor on the last.
        t = vim.keys("\t")
        done = vim.wait(lambda s: not s.shown and (s.text, s.line) != (last.typed, site.line_no), t, 10)
        want = (site.line_no, last.typed + last.hint[0]) if len(last.hint) == 1 else (
            site.line_no + len(last.hint) - 1, last.hint[-1])
        last.accepted = done is not None and (done.line, done.text) == want
    t = vim.keys("\x1b")
    vim.wait(lambda s: s.mode == "n", t, 10)
    t = vim.keys(":e!\r")
    vim.wait(lambda s: s.mode == "n" and s.text == site.line, t, 10)
    return out


def settle(vim: Vim, seconds: float) -> None:
    """Stay in normal mode a while: the plugin sends its ring's warm-ups."""
    vim.keys("\x1b")
    time.sleep(seconds)


def open_files(vim: Vim, other: Path, main: Path) -> None:
    """Visit ``other`` then ``main``: the plugin keeps chunks of both."""
    for p in (other, main):
        t = vim.keys(f"\x1b:e {p}\r")
        vim.wait(lambda s: s.mode == "n", t, 10)
        time.sleep(0.3)


def exchanges(log: Sequence[Any]) -> List[Dict[str, Any]]:
    """The proxy's log as records (times relative to the first request)."""
    t0 = log[0].t_in if log else 0.0
    out = []
    for ex in log:
        timings = ex.answer.get("timings", {}) if isinstance(ex.answer.get("timings"), dict) else {}
        out.append({"kind": ex.kind, "t_in": round(ex.t_in - t0, 4), "wall_s": round(ex.t_out - ex.t_in, 4)
                    if ex.t_out else None, "cancelled": ex.cancelled, "status": ex.status,
                    "content": ex.answer.get("content"), "prompt_n": timings.get("prompt_n"),
                    "prompt_ms": timings.get("prompt_ms"), "cache_n": timings.get("cache_n"),
                    "predicted_n": timings.get("predicted_n"), "predicted_ms": timings.get("predicted_ms")})
    return out
