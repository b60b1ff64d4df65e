"""`pyspec quantize`: requantise a GGUF file with libllama's own
llama_model_quantize (cpp/tools/quantize.h).

Atomic: the output appears under its name only once complete (written beside
it under a temporary name, then renamed). llama_model_quantize cannot be
stopped midway, so it runs in a child process (_child) that reports progress
on its stdout: Ctrl-C kills the child and removes the
partial file at once, and nothing is left half-written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional, Union

from .. import _core, errors

TYPES = tuple(_core.quantize_types())
_CHILD = "import sys; sys.path.pop(0); from pyspec.tools.quantize import _child; sys.exit(_child(*sys.argv[1:6]))"


def quantize(source: Union[str, os.PathLike], output: Union[str, os.PathLike], type: str, *,
             allow_requantize: bool = False, n_threads: int = 0, overwrite: bool = False,
             progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Write ``source`` (a path or default model name) quantised to ``type``
    (one of TYPES) at ``output``. ``progress(done, total)`` is called as tensors
    are written. Raises ModelNotFoundError, FileExistsError (unless
    ``overwrite``), ValueError (unknown type, output = input), QuantizeError
    (llama.cpp's reason, e.g. an already quantised source without
    ``allow_requantize``); after KeyboardInterrupt no output is left."""
    from ..model import resolve_path

    if type not in TYPES:
        raise ValueError(f"unknown quantisation type {type!r}: one of {', '.join(TYPES)}")
    source = resolve_path(source)
    out = Path(output).expanduser().absolute()
    if out.exists() and out.resolve() == Path(source).resolve():
        raise ValueError("the output would overwrite the input")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists (overwrite it with --force)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    child = None
    try:
        # Not `python -m`: that puts the working directory first on sys.path, and a
        # source checkout there (a pyspec/ without the compiled core) would shadow
        # the installed package. Here the child drops that entry.
        cmd = [sys.executable, "-c", _CHILD, source, tmp, type, str(n_threads), str(int(allow_requantize))]
        # Its own session: the terminal's Ctrl-C reaches this process, which stops the
        # child. Its stdin is a pipe from us: should we die unannounced, the child sees
        # it close, removes the partial file and exits.
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        stderr: list = []
        drain = threading.Thread(target=lambda: stderr.append(child.stderr.read()), daemon=True)
        drain.start()
        failure = None
        for line in child.stdout:
            try:
                msg = json.loads(line)
            except ValueError:  # not ours (a library's print): ignore
                continue
            if "done" in msg and progress:
                progress(msg["done"], msg["total"])
            failure = msg if "error" in msg else failure
        rc = child.wait()
        drain.join()
        if failure is not None:
            raise _error(failure, allow_requantize, source)
        if rc != 0:
            raise errors.QuantizeError(f"cannot quantize {source}: the quantisation process failed (exit {rc}): "
                                       f"{''.join(stderr).strip()}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private; the output is an ordinary file
        os.replace(tmp, out)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _error(failure: dict, allow_requantize: bool, source: str) -> Exception:
    """The exception for the child's report ``failure`` ({"error": class name,
    "message"}), its message naming ``source`` (llama.cpp's reasons do not)."""
    cls = getattr(errors, failure["error"], None) or {"ValueError": ValueError}.get(failure["error"],
                                                                                   errors.QuantizeError)
    message = failure["message"]
    if cls is errors.QuantizeError and "requantiz" in message and not allow_requantize:
        message += (" (the source is already quantised: pass --allow-requantize, accepting a second rounding "
                    "on top of the first)")
    return cls(message if source in message else f"cannot quantize {source}: {message}")


def _child(source: str, output: str, qtype: str, n_threads: str, allow: str) -> int:
    """The child: quantize on a thread, report progress and the outcome as JSON lines."""
    box: dict = {}
    done = threading.Event()

    def work() -> None:
        try:
            _core.quantize(source, output, qtype, int(n_threads), allow == "1")
        except Exception as e:  # reported to the parent
            box["err"] = e
        finally:
            done.set()

    def orphaned() -> None:  # stdin closes when the parent dies: leave nothing behind
        sys.stdin.read()
        if not done.is_set():
            if os.path.exists(output):
                os.unlink(output)
            os._exit(1)

    threading.Thread(target=work, daemon=True).start()
    threading.Thread(target=orphaned, daemon=True).start()
    last = None
    while True:
        finished = done.wait(0.2)
        now = _core.quantize_progress()
        if now != last and now[1] > 0:
            print(json.dumps({"done": now[0], "total": now[1]}), flush=True)
            last = now
        if finished:
            break
    if "err" in box:
        err = box["err"]
        print(json.dumps({"error": err.__class__.__name__, "message": str(err)}), flush=True)
        return 1
    return 0

