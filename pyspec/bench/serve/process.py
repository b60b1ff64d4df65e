"""A server in a process of its own, as its users start it: for the serving
benchmarks (pyspec's server beside llama-cpp-python's and llama.cpp's) and the
server tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import tempfile
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..._platform import free_port  # noqa: F401  (the benches and the tests take it from here)

#: Where a :class:`Backend`'s command takes its port.
PORT = "{port}"
LLAMA_SERVER = "llama-server"


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
    (perf_counter) of sending, of the first text and of the end, the
    llama.cpp-style ``timings`` of the last chunk that carried them (or None)
    and the ``usage`` of the last chunk that carried one (or None: sent with
    ``stream_options: {"include_usage": true}``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    first = None
    timings = None
    usage = None
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
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices", []):
                text = c.get("text") or (c.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    pieces.append(text)
    finally:
        conn.close()
    return {"text": "".join(pieces), "t_send": t0, "t_first": first, "t_end": time.perf_counter(),
            "timings": timings, "usage": usage}


def chat_request(port: int, messages: Sequence[dict], *, max_tokens: int, user: Optional[str], raw: bool,
                 usage: bool = False) -> Dict[str, Any]:
    """One streamed, greedy request: ``messages`` to /v1/chat/completions (the
    server renders its chat template), or with ``raw`` their plain transcript
    to /v1/completions (models without a template); ``usage`` asks for the
    server's token counts (``stream_options.include_usage``); ``user`` None
    sends no ``user`` field."""
    from ..conversations import RAW_STOP, transcript

    body: Dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
    if user is not None:
        body["user"] = user
    if usage:
        body["stream_options"] = {"include_usage": True}
    if raw:
        return stream_completion(port, {**body, "prompt": transcript(messages), "stop": list(RAW_STOP)})
    return stream_completion(port, {**body, "messages": list(messages)}, path="/v1/chat/completions")


@dataclass(frozen=True)
class Backend:
    """A server to start: ``command`` with ``{port}`` where its port goes."""

    name: str
    command: List[str]

    def start(self) -> ServerProcess:
        port = free_port()
        return ServerProcess([a.replace(PORT, str(port)) for a in self.command], port)


def pyspec_device_args(device: Optional[dict]) -> List[str]:
    """A command's ``device`` (its --n-gpu-layers, --flash-attn and --strict:
    pyspec/cli/options.py's device_options) as `pyspec serve` arguments; none
    for None."""
    if device is None:
        return []
    return (["--n-gpu-layers", str(device["n_gpu_layers"]), "--flash-attn", device["flash_attn"]]
            + (["--strict"] if device.get("strict") else [])
            + (["--rpc", ",".join(device["rpc"])] if device.get("rpc") else [])
            + (["--tensor-split", _shares(device["tensor_split"])] if device.get("tensor_split") else [])
            + (["--rpc-local-output"] if device.get("local_output") else [])
            + (["--draft-rpc", ",".join(device["draft_rpc"])] if device.get("draft_rpc") else []))


def llama_server_device_args(device: Optional[dict]) -> List[str]:
    """The same ``device`` as llama-server arguments: ``-ngl`` (pyspec's -1, all
    layers, as 999: llama-server reads -1 as its own default) and ``-fa
    on|off|auto`` (the llama.cpp that llama-cpp-python vendors; auto is its
    default, as pyspec's); none for None."""
    if device is None:
        return []
    return (["-ngl", _llama_layers(device), "-fa", device["flash_attn"]]
            + (["--rpc", ",".join(device["rpc"])] if device.get("rpc") else [])
            + (["-ts", _shares(device["tensor_split"])] if device.get("tensor_split") else [])
            # the same tensors as pyspec's local_output (cpp/model/model.cpp), by llama.cpp's -ot
            + (["-ot", r"^(output|output_norm|token_embd)\.weight$=CPU"] if device.get("local_output") else []))


def _llama_cpu_args() -> List[str]:
    """Where AMX faults here (pyspec/cpu.py), llama-server (a native build would
    use it) runs without repacked weights: it can leave out all extra buffer
    types, not one, so it is a little slower than it could be; said once."""
    from ... import cpu

    if not cpu.excluded_buffer_types():
        return []
    warnings.warn(f"pyspec: llama-server runs with --no-repack: {cpu.verdict().buffer_type} is unusable on this "
                  f"CPU ({cpu.verdict().reason}), and llama-server can only leave out every repacked layout")
    return ["--no-repack"]


def _llama_draft_layers(device: dict) -> str:
    """-ngld: as the target's, except that with --rpc the draft stays here (as
    pyspec's) unless --draft-rpc; llama-server then offloads it to every device
    it knows, the workers included."""
    if device.get("rpc") and not device.get("draft_rpc"):
        return "0"
    return _llama_layers(device)


def _shares(shares) -> str:
    return ",".join(f"{x:g}" for x in shares)


def _llama_layers(device: dict) -> str:
    """``device``'s --n-gpu-layers for llama-server's -ngl/-ngld (-1: 999, all)."""
    n = device["n_gpu_layers"]
    if n == 0 and device.get("rpc"):
        n = -1  # as pyspec.Model: workers named to hold the layers hold all of them
    return str(999 if n < 0 else n)


def pyspec_serve_command(model_path: str, *, parallel: int, n_ctx: int, threads: int,
                         device: Optional[dict] = None) -> List[str]:
    """``pyspec serve`` as users start it, on ``{port}`` (add --draft, --no-draft...);
    ``device``: as :func:`pyspec_device_args`."""
    return [sys.executable, "-m", "pyspec.cli", "serve", "--model", model_path, "--port", PORT,
            "--parallel", str(parallel), "--n-ctx", str(n_ctx), "--threads", str(threads),
            *pyspec_device_args(device)]


def llama_server_backends(llama_server: str, model_path: str, *, parallel: int, n_ctx: int, threads: int,
                          specs: Sequence[str], args: Sequence[str] = (), draft: str = "",
                          device: Optional[dict] = None) -> List[Backend]:
    """llama.cpp's ``llama-server`` (given by path: not a dependency) on the same
    model, threads (generation and batch: -t sets both), ``parallel`` slots
    and ``-c n_ctx`` (which it splits among its slots unless ``args`` hold
    ``--kv-unified``), and the offload and flash attention of ``device`` (as
    :func:`llama_server_device_args`): one backend per ``--spec-type`` in
    ``specs`` ('none': plain, named ``llama-server``; else ``llama-server
    SPEC``; the ``draft-*`` types draft with ``-md draft``, its layers
    offloaded as the target's: ``-ngld``), ``args`` last."""
    base = [llama_server, "-m", model_path, "-t", str(threads), "-np", str(parallel), "-c", str(n_ctx),
            *llama_server_device_args(device), *_llama_cpu_args(), "--no-webui", "--host", "127.0.0.1",
            "--port", PORT]
    out = []
    for spec in specs:
        extra = [] if spec == "none" else ["--spec-type", spec]
        if spec.startswith("draft"):
            if not draft:
                raise ValueError(f"llama-server --spec-type {spec} needs a draft model (--draft)")
            extra += ["-md", draft] + (["-ngld", _llama_draft_layers(device)] if device is not None else [])
        out.append(Backend(LLAMA_SERVER if spec == "none" else f"{LLAMA_SERVER} {spec}", base + extra + list(args)))
    return out


def token_counter(model_path: str) -> Callable[[str], int]:
    """Tokens of a text by the model's own tokenizer (llama-cpp-python's, the
    vocabulary only): one rule for every server a benchmark compares."""
    import llama_cpp

    vocab = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else 0

    return count
