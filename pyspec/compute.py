"""Where this process's llama.cpp graphs run: on one compute thread.

pyspec's core computes every graph of both models, the embedder's too, on one
thread (cpp/model/compute_thread.h says why: a second OpenMP team alive
throttles every barrier, and decoding ran at 0.5-0.7x). Another library that
calls llama.cpp in the same process starts a team of its own on its caller's
thread; :func:`llama_cpp_on_compute_thread` routes llama-cpp-python's decodes
to the same thread, for benchmarks and tests that run it beside pyspec.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import _core

#: llama-cpp-python's ctypes entries that compute a graph (its Llama calls them
#: through the module attribute, so replacing the attribute reroutes them).
_GRAPH_CALLS = ("llama_decode", "llama_encode")


@contextlib.contextmanager
def llama_cpp_on_compute_thread() -> Iterator[None]:
    """While open, llama-cpp-python's ``llama_decode``/``llama_encode`` run on
    pyspec's compute thread (the callers wait, as they would for the call)."""
    import llama_cpp.llama_cpp as lib

    saved = {name: getattr(lib, name) for name in _GRAPH_CALLS}

    def routed(call):
        def on_compute_thread(*args):
            return _core.on_compute_thread(lambda: call(*args))

        return on_compute_thread

    for name, call in saved.items():
        setattr(lib, name, routed(call))
    try:
        yield
    finally:
        for name, call in saved.items():
            setattr(lib, name, call)
