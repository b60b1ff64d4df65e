"""RPC workers: a model's layers on other machines through ggml's RPC backend.

A worker (`pyspec rpc-server`, or llama.cpp's own ``rpc-server`` of the same
protocol) serves this machine's CPU or GPU over TCP; a model loaded with
``rpc=["host:port", ...]`` (``--rpc``) keeps its layers there, and the draft,
the sampling and the accept test stay local (docs/distributed.md).

The protocol has no authentication: anyone who reaches the port can run
graphs on the worker and read what it holds. So a worker listens on loopback
unless ``allow_remote`` is given; reach it from other machines through an SSH
tunnel, or on a network you trust.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import warnings
from pathlib import Path
from typing import Optional

from . import _core
from .errors import RpcError

#: The port llama.cpp's rpc-server listens on by default, and so does pyspec's.
DEFAULT_PORT = 50052
#: Exit status of a process whose RPC worker was lost mid-generation
#: (cpp/model/devices.h: ggml-rpc cannot recover in-process).
LOST_WORKER_EXIT = _core.rpc_lost_exit_status()

REMOTE_WARNING = ("pyspec: this RPC worker listens on {host}, beyond this machine. The RPC protocol has no "
                  "authentication or encryption: anyone who can reach port {port} can run work on this machine "
                  "and read the model it holds. Use it only on a network you trust, or keep the worker on "
                  "127.0.0.1 and reach it through an SSH tunnel (docs/distributed.md).")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def endpoint(host: str, port: int) -> str:
    """ggml's "host:port" (IPv6 addresses in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def default_cache_dir() -> Path:
    """Where a worker keeps tensors it was sent (``--cache``), as llama.cpp's
    rpc-server: ``$LLAMA_CACHE/rpc``, else ``~/.cache/llama.cpp/rpc``."""
    base = os.environ.get("LLAMA_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "llama.cpp") / "rpc"


def check_listen(host: str, port: int, *, allow_remote: bool) -> None:
    """Refuse what a worker must not do, before it starts: a non-loopback
    address without ``allow_remote`` (RpcError), a port it cannot bind
    (RpcError naming it). With ``allow_remote`` a remote address warns once."""
    if not 1 <= port <= 65535:
        raise RpcError(f"port must be in 1..65535, got {port}")
    if not is_loopback(host):
        if not allow_remote:
            raise RpcError(f"refusing to listen on {host}: the RPC protocol has no authentication, so a worker "
                           f"listens on loopback (127.0.0.1) unless --allow-remote is given. Prefer an SSH tunnel "
                           f"(docs/distributed.md); use --allow-remote only on a network you trust.")
        warnings.warn(REMOTE_WARNING.format(host=host, port=port), RuntimeWarning, stacklevel=2)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml's server does
            s.bind((host.strip("[]"), port))
    except OSError as e:
        raise RpcError(f"cannot listen on {endpoint(host, port)}: {e.strerror or e}") from None


def serve_worker(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, n_threads: int = 1,
                 cache_dir: Optional[os.PathLike] = None, allow_remote: bool = False) -> None:
    """Serve ggml's RPC protocol on ``host:port`` from this machine until
    interrupted (Ctrl-C returns). Raises RpcError for what :func:`check_listen`
    refuses, on a build without RPC, and if the worker stops listening."""
    if not _core.rpc_available():
        raise RpcError('this llama.cpp build has no RPC backend: reinstall llama-cpp-python with '
                       'CMAKE_ARGS="-DGGML_RPC=ON" (docs/distributed.md)')
    check_listen(host, port, allow_remote=allow_remote)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    failed: list = []

    def run() -> None:
        try:
            _core.rpc_serve(endpoint(host, port), str(cache_dir or ""), n_threads)
        except Exception as e:  # noqa: BLE001 - reported by the waiting thread
            failed.append(e)
        failed.append(None)

    # ggml's server blocks in accept() forever: on a thread of its own, so that
    # this one still sees Ctrl-C (a daemon: the process may end under it).
    worker = threading.Thread(target=run, name="pyspec-rpc-worker", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    if failed and failed[0] is not None:
        raise RpcError(str(failed[0])) from failed[0]
    raise RpcError(f"the RPC worker on {endpoint(host, port)} stopped: ggml could not keep listening (above)")
