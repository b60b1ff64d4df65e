"""Ctrl-C around a generation: the C++ core runs on a worker thread so that
the main thread stays free to receive SIGINT; a Ctrl-C cancels the
generation (llama.cpp's abort callback stops even a long prompt within a
graph node), waits for it to leave the core, and re-raises. Used by every
entry that generates on the caller's thread (generation.py, pyspec chat,
pyspec agree); :func:`streamed` runs one on a worker thread and yields its text.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

if TYPE_CHECKING:
    from . import _core


def run_interruptible(call: Callable[[], Any], cancel: "_core.CancelToken") -> Any:
    """Run ``call`` (a C++ generation): called from the main thread, on a
    worker thread so that the main thread stays free to receive Ctrl-C; on
    KeyboardInterrupt, cancel the generation (llama.cpp's abort callback stops
    even a long prompt within a graph node), wait for it to unwind, and
    re-raise. From any other thread (SIGINT reaches only the main one), here."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    box: dict = {}
    finished = threading.Event()

    def work() -> None:
        try:
            box["out"] = call()
        except BaseException as e:  # handed to the calling thread
            box["err"] = e
        finally:
            finished.set()

    worker = threading.Thread(target=work, name="pyspec-generate", daemon=True)
    started = False
    try:
        with ctrl_c_held():
            worker.start()
            started = True
        while not finished.wait(0.1):  # polled: Windows does not interrupt an untimed wait
            pass
    except KeyboardInterrupt:
        if started:
            cancel.set()
            wait_through(finished)
        raise
    if "err" in box:
        raise box["err"]
    return box["out"]


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C back for the block and raise it as the block ends: around
    ``Thread.start()``, whose wait for the new thread is interruptible. A
    KeyboardInterrupt from inside start() left its caller not knowing that
    the worker had begun, so the generation went on uncancelled (still
    streaming, holding the models) and the process, exiting under it,
    faulted in ggml's freed state (issue 51: SIGSEGV after Ctrl-C, /exit).
    SIGINT's handler runs on the main thread only; elsewhere this does nothing."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield
        return
    held: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if held:
            handler(signal.SIGINT, held[0])


def wait_through(finished: threading.Event) -> None:
    """Wait until a cancelled worker is out of the C++ core, even through more
    Ctrl-C. Not Thread.join(): on CPython <= 3.12 a KeyboardInterrupt inside
    join() can mark a running thread as stopped (the bpo-45274 fix), so a second
    join() returns at once; the interpreter may then exit while the worker is in
    C++, and finalization kills it with a forced unwind that aborts the process."""
    while True:
        try:
            while not finished.wait(0.1):
                pass
            return
        except KeyboardInterrupt:
            continue


def streamed(work: Callable[[Callable[[str], bool], "_core.CancelToken"], Any]) -> Generator[str, None, Any]:
    """Yield the text pieces of ``work(on_text, cancel)`` (a generation) as it
    runs on a worker thread; return its result. Closing the iterator early
    cancels the generation and waits for it to leave the core."""
    from . import _core

    pieces: "queue.Queue" = queue.Queue()
    box: dict = {}
    cancel = _core.CancelToken()
    done = object()
    finished = threading.Event()

    def on_text(text: str) -> bool:
        pieces.put(text)
        return not cancel.is_set

    def run() -> None:
        try:
            box["out"] = work(on_text, cancel)
            pieces.put(done)
        except BaseException as e:  # handed to the consuming thread
            pieces.put(e)
        finally:
            finished.set()

    worker = threading.Thread(target=run, name="pyspec-stream", daemon=True)
    started = False
    try:
        with ctrl_c_held():  # a Ctrl-C inside start(): the worker is cancelled below, not left running
            worker.start()
            started = True
        while True:
            item = pieces.get()
            if item is done:
                return box["out"]
            if isinstance(item, BaseException):
                raise item
            if item:
                yield item
    finally:
        if started:
            cancel.set()
            wait_through(finished)
