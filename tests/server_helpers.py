"""A real `pyspec serve` process for the server tests (pyspec.bench.serve.process),
with the test's conveniences: httpx requests with the API key, /health polling
and the process's RSS."""

from __future__ import annotations

import shutil
import sys
import time
from typing import List, Optional

import httpx

from pyspec.bench.serve.process import ServerProcess as _Process, free_port


class ServerProcess(_Process):
    """`pyspec serve ARGS` on a free port, started as users start it."""

    def __init__(self, *args: str, api_key: Optional[str] = None) -> None:
        self.api_key = api_key
        port = free_port()
        exe = shutil.which("pyspec")
        cmd: List[str] = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
        cmd += ["serve", "--port", str(port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        super().__init__(cmd, port)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def post(self, path: str, body=None, **kw) -> httpx.Response:
        kw.setdefault("timeout", 120)
        headers = {**self.headers, **kw.pop("headers", {})}
        return httpx.post(self.url(path), json=body, headers=headers, **kw)

    def health(self) -> dict:
        return httpx.get(self.url("/health"), timeout=10).json()

    def wait_idle(self, timeout: float = 60) -> dict:
        """/health once no slot is busy and nothing waits (cancellations take a round)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if (h["slots_busy"] == 0 and h["queue_depth"] == 0) or time.monotonic() > deadline:
                return h
            time.sleep(0.2)

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")
