"""A server in a process of its own, as its users start it: for the serving
benchmarks (pyspec's server beside llama-cpp-python's and llama.cpp's) and the
server tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``cmd`` started on 127.0.0.1:``port`` (its output kept in a temporary
    file); waits until ``GET health`` answers 200. ``stop()`` sends SIGTERM and
    returns the exit status."""

    def __init__(self, cmd: List[str], port: int, *, health: str = "/health", startup_s: float = 300) -> None:
        self.port = port
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
        deadline = time.monotonic() + startup_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd[:3])} exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if request(port, "GET", health, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{' '.join(cmd[:3])} did not come up in {startup_s} s:\n{self.output()}")
            time.sleep(0.3)

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        try:
            os.unlink(self.log.name)
        except OSError:
            pass
        return self.proc.returncode


def request(port: int, method: str, path: str, body: Any = None, *, headers: Optional[Dict[str, str]] = None,
            timeout: float = 600) -> Tuple[int, Any]:
    """(status, decoded JSON or text) of one request to 127.0.0.1:port."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        raw = r.read().decode("utf-8", errors="replace")
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw
    finally:
        conn.close()


def stream_completion(port: int, body: Dict[str, Any], *, headers: Optional[Dict[str, str]] = None,
                      timeout: float = 600, path: str = "/v1/completions") -> Dict[str, Any]:
    """POST ``path`` (/v1/completions, or /v1/chat/completions: text from each
    chunk's ``delta``) with ``stream: true``; returns the text, the times
    (perf_counter) of sending, of the first text and of the end, and the
    llama.cpp-style ``timings`` of the last chunk that carried them (or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    first = None
    timings = None
    pieces = []
    try:
        conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:500]!r}")
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            timings = chunk.get("timings") or timings
            for c in chunk.get("choices", []):
                text = c.get("text") or (c.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    pieces.append(text)
    finally:
        conn.close()
    return {"text": "".join(pieces), "t_send": t0, "t_first": first, "t_end": time.perf_counter(),
            "timings": timings}


def token_counter(model_path: str) -> Callable[[str], int]:
    """Tokens of a text by the model's own tokenizer (llama-cpp-python's, the
    vocabulary only): one rule for every server a benchmark compares."""
    import llama_cpp

    vocab = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else 0

    return count
