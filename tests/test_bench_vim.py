"""`pyspec bench vim` (issue 61): the logging proxy between plugin and server,
the plugin's shown text, and (slow tier) the real llama.vim in Vim against a
real `pyspec serve`."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pyspec.bench.serve.vim import shown_lines
from pyspec.bench.serve.vim_instruct import user_text
from pyspec.bench.serve.vim_proxy import Proxy, kind_of


class _Slow(BaseHTTPRequestHandler):
    """An upstream that answers after ``delay`` seconds and notes whether the
    proxy closed the connection before that (as a server would see a client leave)."""

    delay, closed_early = 0.0, []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.connection.settimeout(self.delay or None)
        try:
            gone = self.delay and self.connection.recv(1) == b""
        except socket.timeout:
            gone = False
        self.closed_early.append(bool(gone))
        if gone:
            return
        out = json.dumps({"content": json.loads(body)["prompt"].upper(), "timings": {"prompt_n": 3}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Slow.closed_early = []
    yield server
    server.shutdown()


def _curl(url: str, body: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(["curl", "--silent", "--no-buffer", "--request", "POST", "--url", url, "--header",
                             "Content-Type: application/json", "--data", json.dumps(body)],
                            stdout=subprocess.PIPE, **kw)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the plugin's client, curl, is not installed")
def test_the_proxy_passes_answers_on_and_notes_a_client_that_gives_up(upstream):
    proxy = Proxy(upstream.server_address[1])
    try:
        _Slow.delay = 0.0
        long_text = "x" * 5000  # curl sends "Expect: 100-continue" before a long body
        got = _curl(proxy.url("/infill"), {"input_prefix": "a", "input_suffix": "", "prompt": long_text}).communicate(
            timeout=30)[0]
        assert json.loads(got)["content"] == long_text.upper()
        ex = proxy.log[-1]
        assert ex.kind == "fim" and ex.status == 200 and not ex.cancelled and ex.answer["timings"]["prompt_n"] == 3

        _Slow.delay = 5.0  # killed before the answer: the proxy closes the server's connection too
        curl = _curl(proxy.url("/infill"), {"input_extra": [{"text": "b"}], "prompt": "", "n_predict": 1})
        time.sleep(1.0)
        curl.kill()
        curl.wait()
        deadline = time.monotonic() + 10
        while not (proxy.log[-1].cancelled and _Slow.closed_early[-1:] == [True]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.log[-1].kind == "warm-up" and proxy.log[-1].cancelled and proxy.log[-1].status == 0
        assert _Slow.closed_early[-1] is True, "the server's connection stayed open after the client left"
    finally:
        proxy.close()


def test_an_instruction_warm_up_holds_all_but_the_instruction():
    lines = [f"line {k}" for k in range(1, 200)]
    warm, real = (user_text(lines, 100, "ring", i) for i in ("", "Add type hints."))
    assert real.startswith(warm) and real[len(warm):] == "Add type hints."
    assert "100: line 100" in warm and "60: line 60" in warm and "59: line 59" not in warm


def test_what_the_plugin_shows():
    assert shown_lines("ar:\n    x = 1\n\n", 2) == ["ar:", "    x = 1"]
    assert shown_lines("\n    x = 1\n", 1) == ["", "    x = 1"]  # an empty first line has no property of its own
    assert shown_lines("dropped\n", 0) == [""]  # the plugin's rules emptied it: no text property
    assert kind_of("/infill", {"input_prefix": "", "input_suffix": "", "prompt": "", "input_extra": []}) == "warm-up"
    assert kind_of("/infill", {"input_prefix": "a", "n_predict": 0}) == "warm-up"
    assert kind_of("/infill", {"input_prefix": "a", "prompt": "b"}) == "fim"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("vim") is None or shutil.which("curl") is None,
                    reason="the real plugin needs Vim 9 (+job +channel +timers +textprop) and curl")
def test_llama_vim_in_vim_against_pyspec_serve(draft_path, tmp_path):
    """The short version of the benchmark: two lines typed in Vim with the
    plugin at its defaults; every pause shows the plugin's answer, accepting a
    hint inserts what was shown, the plugin's given-up requests are counted,
    and an instruction edit after its warm-up processes only the instruction."""
    out = tmp_path / "vim.json"
    run = subprocess.run([sys.executable, "-m", "pyspec.cli", "bench", "vim", "-m", draft_path, "--no-draft",
                          "--sites", "2", "--steps", "2", "--n-ctx", "4096", "--timeout", "30", "--instruct", "2",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    (f,) = result["summary"]["figures"]
    assert f["pauses"] == 4 and f["no_hint"] == 0, result["table"]
    # Tab at every line's last pause that showed a hint, and it inserted what was
    # shown. (At a completed line the model often writes the file's next lines
    # again, which the plugin hides: such a pause has nothing to accept.)
    shown_last = sum(bool(any(p["hint"])) for p in result["pauses"][1::2])
    assert f["accepts"] == shown_last and f["accepted"] == f["accepts"], result["table"]
    assert f["fim_requests"] >= 4 and 0 <= f["given_up"] <= f["fim_requests"], result["table"]
    assert all(p["wait_s"] > 0 for p in result["pauses"])
    # The instruction edits: the warm-up cached the prompt, so only the
    # instruction and the template's tail were processed after Enter.
    assert len(result["edits"]) == 2 and all(e["ttft_s"] > 0 for e in result["edits"]), result["edits"]
    assert all(e["prompt_n"] is not None and e["prompt_n"] <= 24 for e in result["edits"]), result["edits"]
