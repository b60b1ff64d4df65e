"""`pyspec rpc-server`: this machine as an RPC worker for a model driven elsewhere."""

from __future__ import annotations

import warnings

import click

from .._platform import physical_cores
from .options import command_errors


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback needs --allow-remote (the protocol has no "
                   "authentication); prefer an SSH tunnel to a loopback worker.")
@click.option("--port", default=50052, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="CPU threads for the work it is sent [default: physical cores].")
@click.option("--cache", "cache", default=None, is_flag=False, flag_value="", metavar="[DIR]",
              help="Keep tensors the driver sends on disk, so the next load of the same model skips the "
                   "transfer (DIR, or $LLAMA_CACHE/rpc, ~/.cache/llama.cpp/rpc as llama.cpp's rpc-server).")
@click.option("--allow-remote", is_flag=True,
              help="Listen on a non-loopback address. Only on a network you trust: anyone who reaches the "
                   "port can use this machine and read the model it holds.")
def rpc_server(host, port, threads, cache, allow_remote) -> None:
    """Serve this machine's CPU (or GPU) to a pyspec, or llama.cpp, on another
    machine, over ggml's RPC protocol.

    Start one on each machine that should hold layers, then name them on the
    machine that drives generation:

    \b
        machine B$ pyspec rpc-server --port 50052
        machine A$ ssh -N -L 50052:127.0.0.1:50052 B &     # a tunnel: the worker stays on loopback
        machine A$ pyspec generate "..." --rpc 127.0.0.1:50052

    The target's layers go to the workers; the draft (a small model, lookups or
    memory), the sampling and the accept test stay on A, so speculation pays
    the network's round trip once per round of several tokens, not once per
    token. llama.cpp's own rpc-server (same protocol version, see `pyspec
    info`) works as a worker too. See docs/distributed.md.
    """
    from .. import rpc

    cache_dir = None if cache is None else (cache or rpc.default_cache_dir())
    with command_errors(interrupted="rpc-server stopped"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rpc.check_listen(host, port, allow_remote=allow_remote)
        for w in caught:
            click.echo(f"warning: {w.message}", err=True)
        click.echo(f"pyspec rpc-server: listening on {rpc.endpoint(host, port)}; drive it with "
                   f"--rpc {rpc.endpoint(host, port)} (Ctrl-C stops)", err=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said once, above
            rpc.serve_worker(host, port, n_threads=threads or physical_cores(), cache_dir=cache_dir,
                             allow_remote=allow_remote)


def register(main: click.Group) -> None:
    main.add_command(rpc_server)
