"""The logging proxy between a plugin and a server (`pyspec bench vim`): one
HTTP/1.1 request per connection (curl's), passed on byte for byte, with what
each request was, when it came and went, and whether the client gave up on it
first. A client that closes its connection (llama.vim kills curl when it sends
the next request) closes the server's too, as it would without the proxy."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


@dataclass
class Exchange:
    """One request through the proxy (times: time.monotonic())."""

    path: str
    kind: str                      # "fim", "warm-up" (no text around a cursor, or n_predict 0) or "other"
    body: Dict[str, Any]
    t_in: float
    t_out: float = 0.0
    status: int = 0
    cancelled: bool = False        # the client closed its connection before the answer
    answer: Dict[str, Any] = field(default_factory=dict)


def kind_of(path: str, body: Any) -> str:
    if not path.startswith("/infill") or not isinstance(body, dict):
        return "other"
    if body.get("n_predict") == 0 or not (body.get("input_prefix") or body.get("input_suffix") or body.get("prompt")):
        return "warm-up"
    return "fim"


def _dechunk(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while at < len(data):
        end = data.find(b"\r\n", at)
        if end < 0:
            break
        size = int(data[at:end].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += data[end + 2:end + 2 + size]
        at = end + 2 + size + 2
    return bytes(out)


def parse_response(raw: bytes) -> Tuple[int, Dict[str, Any]]:
    """(status, JSON body or {}) of a whole HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return 0, {}
    if any(h.lower().replace(" ", "") == "transfer-encoding:chunked" for h in lines[1:]):
        body = _dechunk(body)
    try:
        obj = json.loads(body)
    except ValueError:
        obj = {}
    return status, obj if isinstance(obj, dict) else {"answers": obj}


class Proxy:
    """127.0.0.1:``port`` to 127.0.0.1:``upstream``, on a thread of its own."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.log: List[Exchange] = []
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="pyspec-bench-proxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        self.port: int = self._server.sockets[0].getsockname()[1]

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer: Optional[asyncio.StreamWriter] = None
        ex: Optional[Exchange] = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = [h for h in lines[1:] if h]
            length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0)
            if any(h.lower().replace(" ", "") == "expect:100-continue" for h in headers):
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it before a long body
                await writer.drain()
            body = await reader.readexactly(length)
            try:
                obj = json.loads(body) if body else {}
            except ValueError:
                obj = {}
            path = lines[0].split()[1] if len(lines[0].split()) > 1 else "/"
            ex = Exchange(path, kind_of(path, obj), obj if isinstance(obj, dict) else {}, time.monotonic())
            self.log.append(ex)
            keep = [h for h in headers if not h.lower().startswith(("connection:", "expect:"))]
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
            up_writer.write(("\r\n".join([lines[0], *keep, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
                            + body)
            await up_writer.drain()
            answer = asyncio.ensure_future(up_reader.read())   # to the end: Connection: close
            gone = asyncio.ensure_future(reader.read(1))       # b"": the client closed its side
            done, _ = await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            if answer in done:
                gone.cancel()
                raw = answer.result()
                ex.t_out = time.monotonic()
                ex.status, ex.answer = parse_response(raw)
                writer.write(raw)
                await writer.drain()
            else:
                answer.cancel()
                ex.t_out, ex.cancelled = time.monotonic(), True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            if ex is not None and not ex.t_out:  # the server could not be reached or broke off: done too
                ex.t_out = time.monotonic()
            for w in (up_writer, writer):
                if w is not None:
                    w.close()
