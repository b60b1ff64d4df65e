"""The network of the RPC benchmark and tests: worker processes on loopback,
and a TCP proxy that adds a delay each way and counts round trips.

A round trip, as the proxy counts it: the driver sends after the worker last
spoke (or first). ggml-rpc queues commands without waiting where it can
(uploads, graph launches), so this counts the waits a network's latency
actually costs, not the commands.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

from .. import _core
from .._platform import free_port  # noqa: F401  (the tests take it from here)


class WorkerProcess:
    """`pyspec rpc-server` on a free loopback port, started as users start it
    (its output kept in a temporary file); ready when it accepts connections."""

    def __init__(self, *, threads: int = 1, port: Optional[int] = None, startup_s: float = 60,
                 command: Optional[List[str]] = None) -> None:
        self.port = port or free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = command or [sys.executable, "-m", "pyspec.cli", "rpc-server"]
        self.proc = subprocess.Popen([*cmd, "--port", str(self.port), "--threads", str(threads)],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
        deadline = time.monotonic() + startup_s
        while not _core.rpc_endpoint_reachable(self.endpoint, 0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the RPC worker on port {self.port} did not start:\n{self.output()}")
            time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def kill(self) -> None:
        """As a crash or a power cut of the worker's process: SIGKILL."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def __enter__(self) -> "WorkerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class DelayProxy:
    """127.0.0.1:``port`` forwarding to ``upstream`` ("host:port"), each byte
    delivered ``delay_ms`` after it arrived, in each direction (a network of
    round-trip time 2 x delay_ms and unlimited bandwidth). Counts round trips
    (above) and bytes each way. Runs on a thread of its own until close()."""

    def __init__(self, upstream: str, delay_ms: float) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream, self.delay_s = (host, int(port)), delay_ms / 1000.0
        self.round_trips = 0
        self.bytes_up = self.bytes_down = 0
        self._last_up = False  # the last data seen went driver -> worker
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyspec-delay-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset_counts(self) -> None:
        self.round_trips = self.bytes_up = self.bytes_down = 0

    def close(self) -> None:
        """Stops the proxy: its connections close, its thread ends."""
        async def shutdown() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> "DelayProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        # Connections cut by close() end cancelled: not an error worth a traceback.
        self._loop.set_exception_handler(
            lambda loop, ctx: None if isinstance(ctx.get("exception"), asyncio.CancelledError)
            else loop.default_exception_handler(ctx))
        self._server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:  # close(): the connection ends with the proxy
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as ggml-rpc's own sockets
            except (AttributeError, OSError):  # none, or closed already (a probe's connection)
                pass
        try:
            await asyncio.gather(self._pipe(reader, up_writer, up=True), self._pipe(up_reader, writer, up=False))
        finally:  # both ends close together: a worker serves its next driver once this one is gone
            writer.close()
            up_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
        """Reads as fast as data comes; a second task writes each piece once its
        delay has passed (latency, not a bandwidth limit)."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(deliver())
        try:
            await self._read_into(reader, queue, up=up)
        except asyncio.CancelledError:
            sender.cancel()
            raise
        queue.put_nowait((0.0, None))  # the end: the writer closes after the last piece
        try:
            await sender
        except (ConnectionError, OSError):
            pass

    async def _read_into(self, reader: asyncio.StreamReader, queue: asyncio.Queue, *, up: bool) -> None:
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                if up:
                    self.bytes_up += len(data)
                    if not self._last_up:
                        self.round_trips += 1
                    self._last_up = True
                else:
                    self.bytes_down += len(data)
                    self._last_up = False
                queue.put_nowait((self._loop.time() + self.delay_s, data))
        except (ConnectionError, OSError):
            pass
