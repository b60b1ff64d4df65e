"""`pyspec serve --rpc`: a server that outlives its RPC workers.

ggml-rpc ends the process that loses a worker (cpp/model/devices.h), so a
server whose model lives on workers runs as two processes. This one, the
supervisor, owns the public port and no model: it runs the real server (the
same `pyspec serve` command line) as a child on a private loopback port,
forwards every request to it, and watches it.

When a worker is lost, the child exits (status 75, the line naming the
endpoint in a fault file). The supervisor then answers: requests in flight
get an error (503, or an error event on a stream already started), new
requests 503 with Retry-After, and /health 503 with the fault and which
workers answer. It probes the workers each second and, once all accept
connections again, starts the child again; it loads the model onto them
afresh, and /health is "ok" when it is ready.

A child that fails before it was ever ready (a bad flag, a worker unreachable
at start, a missing model) ends the supervisor with its status and its
message: that is a mistake to fix, not a fault to ride out.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Optional, Sequence

from .. import _core
from .._platform import free_port
from ..rpc import LOST_WORKER_EXIT

#: Environment of the child: the private port it listens on (it serves, never supervises).
CHILD_PORT_ENV = "PYSPEC_SERVE_CHILD_PORT"
FAULT_FILE_ENV = "PYSPEC_RPC_FAULT_FILE"
PROBE_INTERVAL_S = 1.0
# Headers that describe one hop of HTTP, not the message (RFC 9110 7.6.1).
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection",
               "content-length", "host"}


class Child:
    """The real server: started, watched, restarted when its workers are back."""

    def __init__(self, argv: Sequence[str], endpoints: Sequence[str]) -> None:
        self.argv, self.endpoints = list(argv), list(endpoints)
        self.port = free_port()
        self.fault_file = os.path.join(tempfile.mkdtemp(prefix="pyspec-serve-"), "rpc-fault")
        self.proc: Optional[subprocess.Popen] = None
        self.state = "starting"  # starting -> ready -> lost -> starting ...
        self.fault: Optional[str] = None
        self.restarts = 0
        self.ever_ready = False
        self.exit_status: Optional[int] = None  # set when the supervisor must end
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # ------------------------------------------------------------ life
    def start(self) -> None:
        env = dict(os.environ, **{CHILD_PORT_ENV: str(self.port), FAULT_FILE_ENV: self.fault_file})
        if os.path.exists(self.fault_file):
            os.unlink(self.fault_file)
        self.proc = subprocess.Popen([sys.executable, "-m", "pyspec.cli", *self.argv], env=env)
        with self.lock:
            self.state = "starting"

    def watch(self) -> None:
        """The supervisor's thread: readiness, exits, probes, restarts."""
        self.start()
        while not self.stopping.is_set():
            proc = self.proc
            status = proc.poll() if proc is not None else None
            if status is None:
                if self.state == "starting" and self._child_health()[0] == 200:
                    with self.lock:
                        self.state, self.ever_ready, self.fault = "ready", True, None
                    print(f"pyspec serve: ready (model on RPC workers {', '.join(self.endpoints)})",
                          file=sys.stderr, flush=True)
                self.stopping.wait(0.2)
                continue
            if self.stopping.is_set():
                return
            if status != LOST_WORKER_EXIT or not self.ever_ready:
                # Its own status (0 after a Ctrl-C that reached both), or a shell's 128 + signal.
                self.exit_status = status if status >= 0 else 128 - status
                os.kill(os.getpid(), signal.SIGTERM)  # ends uvicorn; the command exits with exit_status
                return
            with self.lock:
                self.state, self.fault = "lost", self._read_fault(status)
            print(f"pyspec serve: {self.fault}; waiting for the workers to come back", file=sys.stderr, flush=True)
            while not self.stopping.is_set() and not all(self.reachable().values()):
                self.stopping.wait(PROBE_INTERVAL_S)
            if self.stopping.is_set():
                return
            self.restarts += 1
            print("pyspec serve: the RPC workers answer again: reloading the model", file=sys.stderr, flush=True)
            self.start()

    def stop(self) -> None:
        self.stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the child ends its streams properly, then exits
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(os.path.dirname(self.fault_file), ignore_errors=True)  # leave no folder behind

    # ------------------------------------------------------------ facts
    def reachable(self) -> Dict[str, bool]:
        """Whether each worker answers (ggml's HELLO, not just a connection: a
        tunnel to a dead worker accepts connections)."""
        return {e: not _core.rpc_worker_problem(e, 1.0) for e in self.endpoints}

    def _read_fault(self, status: int) -> str:
        try:
            with open(self.fault_file) as f:
                text = f.read().strip()
            if text:
                return text.removeprefix("pyspec: ")
        except OSError:
            pass
        return f"the server lost an RPC worker (exit status {status})"

    def _child_health(self, timeout_s: float = 2.0) -> tuple:
        """(status, body) of the child's /health; (None, None) when it does not answer."""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
            conn.request("GET", "/health")
            resp = conn.getresponse()
            status, raw = resp.status, resp.read()
            conn.close()
            return status, json.loads(raw or b"{}")
        except (OSError, http.client.HTTPException, ValueError):
            return None, None

    def health(self) -> tuple:
        """(status code, body) of the supervisor's /health."""
        with self.lock:
            state, fault, restarts = self.state, self.fault, self.restarts
        # A ready child holds live connections to every worker (losing one ends it); a
        # starting one is busy with them. A probe would only wait in the backlog of a
        # worker busy with it (ggml serves one driver at a time): workers are probed
        # only while the child is down (None: not known while it loads).
        if state == "lost":
            reachable = self.reachable()
        else:
            reachable = {e: True if state == "ready" else None for e in self.endpoints}
        rpc = {"workers": [{"endpoint": e, "reachable": ok} for e, ok in reachable.items()], "restarts": restarts}
        if state == "ready":
            _, body = self._child_health(timeout_s=5.0)
            if body is not None:
                body["rpc"] = rpc
                return (200 if body.get("status") == "ok" else 503), body
        body = {"status": "error" if state == "lost" else "starting",
                "error": fault if state == "lost" else "loading the model onto the RPC workers", "rpc": rpc}
        return 503, body

    def unavailable(self) -> str:
        with self.lock:
            state, fault = self.state, self.fault
        if state == "lost":
            return f"{fault}; the server will answer again once its RPC workers are back"
        return "the server is loading its model onto the RPC workers; retry shortly"


def create_supervisor_app(child: Child):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from .api_error import APIError

    def error(message: str) -> Response:
        return JSONResponse(APIError(503, message, type="server_error", code="rpc_worker_unavailable").body(),
                            status_code=503, headers={"Retry-After": "2"})

    async def health(request: Request) -> Response:
        status, body = await run_in_threadpool(child.health)
        return JSONResponse(body, status_code=status)

    async def forward(request: Request) -> Response:
        if child.state != "ready":
            return error(child.unavailable())
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")

        def open_response():
            conn = http.client.HTTPConnection("127.0.0.1", child.port)  # no timeout: generations take their time
            conn.request(request.method, target, body=body, headers=headers)
            return conn, conn.getresponse()

        try:
            conn, resp = await run_in_threadpool(open_response)
        except (OSError, http.client.HTTPException):
            await run_in_threadpool(_wait_for_exit, child)
            return error(child.unavailable())
        out_headers = {k: v for k, v in resp.getheaders() if k.lower() not in HOP_HEADERS}
        streaming = "text/event-stream" in resp.getheader("content-type", "")

        def relay() -> Iterator[bytes]:
            try:
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        return
                    yield chunk
            except (OSError, http.client.HTTPException):
                _wait_for_exit(child)
                if streaming:  # the stream started: end it with an error event, as the server's own errors
                    yield ("data: " + json.dumps(APIError(503, child.unavailable(), type="server_error",
                                                          code="rpc_worker_unavailable").body()) + "\n\n").encode()
            finally:
                conn.close()

        return StreamingResponse(relay(), status_code=resp.status, headers=out_headers)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
    return Starlette(routes=[Route("/health", health, methods=["GET"]),
                             Route("/{path:path}", forward, methods=methods)])


def _wait_for_exit(child: Child, timeout_s: float = 5.0) -> None:
    """A broken connection to the child: give it a moment to exit and the
    watcher to record why, so that the error says which worker was lost."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.state == "ready":
        time.sleep(0.05)


def supervise(argv: List[str], endpoints: Sequence[str], host: str, port: int) -> int:
    """Serve ``argv`` (a `pyspec serve` command line) through a child process on
    ``host:port``; returns the exit status."""
    import uvicorn

    child = Child(argv, endpoints)
    watcher = threading.Thread(target=child.watch, name="pyspec-serve-supervisor", daemon=True)
    watcher.start()
    config = uvicorn.Config(create_supervisor_app(child), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=10, lifespan="off")
    server = uvicorn.Server(config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            getattr(self, "_captured_signals", []).clear()  # a clean stop is exit 0, not death by signal

    server = Server(config)
    print(f"pyspec serve: supervising the server on http://{host}:{port}/v1 (model on RPC workers "
          f"{', '.join(endpoints)}; it restarts when a lost worker is back)", file=sys.stderr, flush=True)
    try:
        server.run()
    finally:
        child.stop()
    if child.exit_status is not None:
        return child.exit_status
    return 0 if server.started else 1
