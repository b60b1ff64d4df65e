"""What :class:`pyspec.Llama` takes from outside pyspec's generation loop:
embeddings and the GGUF's metadata.

pyspec's core computes no embeddings. ``Llama(..., embedding=True)`` makes
``embed`` and ``create_embedding`` llama-cpp-python's own: a
``llama_cpp.Llama(embedding=True)`` on the same file (llama-cpp-python is
pyspec's dependency, and both use the one libllama: pyspec/_loader.py),
loaded on first use with the same context settings, its answers returned as
they are. Loading it installs llama-cpp-python's log callback for the process.

The metadata is read from the file's header (scalar and string keys, as
llama.cpp prints them; arrays such as the vocabulary are left out).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, BinaryIO, Dict

if TYPE_CHECKING:
    from .llama import Llama


def embedder(llm: "Llama") -> Any:
    """The ``llama_cpp.Llama`` that embeds for ``llm`` (loaded once)."""
    if not llm.embedding:
        raise RuntimeError("Llama model must be created with embedding=True to call this method")
    llm.model  # closed: RuntimeError
    if llm._embedder is None:
        import llama_cpp

        llm._embedder = llama_cpp.Llama(model_path=str(llm._path), embedding=True, verbose=llm.verbose,
                                        **llm._embed_args)
    return llm._embedder


# GGUF value types (ggml's gguf.h) -> struct format; 8 is a string, 9 an array.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: str) -> Dict[str, str]:
    """The header's key-values as text (numbers as llama.cpp prints them,
    booleans as "true"/"false"); arrays are skipped."""
    out: Dict[str, str] = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = _read(f, "I")
        count = "I" if version == 1 else "Q"
        _read(f, count)  # tensors
        for _ in range(_read(f, count)):
            key = _string(f, count)
            vtype = _read(f, "I")
            if vtype == _ARRAY:
                etype, n = _read(f, "I"), _read(f, count)
                for _ in range(n):
                    if etype == _STRING:
                        f.seek(_read(f, count), 1)
                    else:
                        _value(f, etype, count)
                continue
            value = _value(f, vtype, count)
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, float):
                out[key] = f"{value:f}"
            else:
                out[key] = str(value)
    return out


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise ValueError("the GGUF header ends early")
    return struct.unpack("<" + fmt, raw)[0]


def _string(f: BinaryIO, count: str) -> str:
    return f.read(_read(f, count)).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int, count: str) -> Any:
    if vtype == _STRING:
        return _string(f, count)
    if vtype == _ARRAY:
        etype, n = _read(f, "I"), _read(f, count)
        return [_value(f, etype, count) for _ in range(n)]
    return _read(f, _SCALAR[vtype])
