"""Saved prompt prefixes: a long prefix (a system prompt, a tool list, a
document) processed once and kept on disk with every model's cache of it, the
draft model's included, so that a new process or a restarted server starts
from it without a prefill (``Model.save_prefix`` / ``load_prefix``,
``SpeculativeDecoder`` alike, ``pyspec serve --cache-dir DIR``).

A file holds a header (this format, the build, and each model's identity: its
file, size, shape and how its cache is laid out) and then, per model, the
tokens its cache holds and llama.cpp's state of that sequence. A file made by
other models or another build is refused with the difference named, never
loaded into a cache it does not fit. Files are written as every pyspec cache
is (docs/promises.md): beside their name, fsynced, renamed over it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple, Union

from . import _core
from ._durable import replacing
from ._platform import package_version
from .errors import PyspecError

MAGIC = b"PYSPEC-PREFIX\n"
FORMAT = 1
SUFFIX = ".prefix"

#: One model's part of a saved prefix: (the C++ model, the tokens its cache holds, their state).
Part = Tuple["_core.Model", List[int], bytes]


class PrefixFileError(PyspecError, ValueError):
    """A saved prefix that these models cannot use: made by other models or
    another build, or damaged. The message says which."""


def _build() -> Dict[str, str]:
    from . import __version__

    return {"pyspec": __version__, "llama-cpp-python": package_version("llama-cpp-python")}


def identity(model: "_core.Model") -> Dict[str, Any]:
    """What a model's cache state depends on: the weights (file name and size),
    their shape, and the cache layout (flash attention transposes V or not)."""
    return {
        "file": os.path.basename(model.path),
        "size": os.stat(model.path).st_size,
        "description": model.description,
        "n_vocab": model.n_vocab,
        "flash_attn": model.flash_attn,
    }


def write(path: Union[str, os.PathLike], parts: Sequence[Part]) -> Path:
    """Write ``parts`` (the target's first) to ``path``, atomically."""
    path = Path(path)
    header = {"format": FORMAT, "build": _build(),
              "models": [dict(identity(m), tokens=len(t), state_bytes=len(s)) for m, t, s in parts]}
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, prefix=f".{path.name}-") as f:
        f.write(MAGIC)
        f.write(json.dumps(header).encode() + b"\n")
        for _, tokens, state in parts:
            f.write(struct.pack(f"<{len(tokens)}i", *tokens))
            f.write(state)
    return path


def read(path: Union[str, os.PathLike], models: Sequence["_core.Model"]) -> List[Part]:
    """The parts of a saved prefix, checked against ``models`` (the target first,
    then the draft model if any). A draft part the file has but ``models`` lacks
    is skipped; a missing one leaves that model to prefill. Raises
    :class:`PrefixFileError` naming what does not match, and FileNotFoundError."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise PrefixFileError(f"{path} is not a saved pyspec prefix")
        try:
            header = json.loads(f.readline())
            entries = header["models"]
        except (ValueError, KeyError, TypeError):
            raise PrefixFileError(f"{path}: its header is damaged") from None
        if header.get("format") != FORMAT:
            raise PrefixFileError(f"{path} has format {header.get('format')!r}; this pyspec reads {FORMAT}")
        if header.get("build") != _build():
            raise PrefixFileError(f"{path} was saved by {header.get('build')}, not by this build ({_build()}): "
                                  f"save it again")
        if not isinstance(entries, list) or not entries:
            raise PrefixFileError(f"{path}: its header names no model")
        parts: List[Part] = []
        for i, entry in enumerate(entries):
            try:
                n_tokens, n_state = int(entry["tokens"]), int(entry["state_bytes"])
                saved = {k: entry[k] for k in ("file", "size", "description", "n_vocab", "flash_attn")}
            except (KeyError, TypeError, ValueError):
                raise PrefixFileError(f"{path}: its header is damaged") from None
            raw = f.read(4 * n_tokens)
            state = f.read(n_state)
            if len(raw) != 4 * n_tokens or len(state) != n_state:
                raise PrefixFileError(f"{path} is cut short (an interrupted copy?)")
            if i >= len(models):
                continue
            want = identity(models[i])
            if saved != want:
                what = "target" if i == 0 else "draft model"
                diff = ", ".join(f"{k} {saved[k]!r} (loaded: {want[k]!r})" for k in want if saved[k] != want[k])
                raise PrefixFileError(f"{path} was saved for another {what}: {diff}")
            parts.append((models[i], list(struct.unpack(f"<{n_tokens}i", raw)), state))
        if f.read(1):
            raise PrefixFileError(f"{path} has trailing bytes (damaged)")
    return parts


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def file_name(tokens: Sequence[int]) -> str:
    """A prefix's file name in a folder of them: the hash of its tokens."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()[:32] + SUFFIX


# ------------------------------------------------------------ one process's contexts

def ensure_cached(model: "_core.Model", tokens: Sequence[int], seq: int = 0) -> int:
    """Make sequence ``seq`` of ``model`` hold exactly ``tokens``, decoding what
    its cache lacks; returns how many tokens were decoded."""
    tokens = list(tokens)
    cached = model.cached(seq)
    keep = 0
    for a, b in zip(cached, tokens):
        if a != b:
            break
        keep += 1
    model.truncate(keep, seq)
    if keep < len(tokens):
        model.decode(tokens[keep:], keep, 0, seq)
    return len(tokens) - keep


def tokens_of(target, prefix, *, chat: bool = False) -> List[int]:
    """A prefix's tokens (``Generator.save_prefix``): token ids as they are, a
    string as raw text unless ``chat``, or chat messages (a string: one user
    message) rendered without opening the assistant's turn."""
    if isinstance(prefix, str) and not chat:
        return target.tokenize(prefix, add_special=True, parse_special=True)
    if isinstance(prefix, str) or (prefix and not all(isinstance(t, int) for t in prefix)):
        messages = [{"role": "user", "content": prefix}] if isinstance(prefix, str) else prefix
        text = target.apply_chat_template(messages, add_assistant=False)
        return target.tokenize(text, add_special=True, parse_special=True)
    return list(prefix)


def save(models: Sequence["_core.Model"], tokens: Sequence[int], path: Union[str, os.PathLike]) -> Path:
    """Process ``tokens`` on every model (sequence 0) and save their caches."""
    if not tokens:
        raise ValueError("the prefix is empty")
    for m in models:
        if len(tokens) >= m.n_ctx:
            raise PrefixFileError(f"the prefix has {len(tokens)} tokens; the context holds {m.n_ctx}")
        ensure_cached(m, tokens)
    return write(path, [(m, m.cached(0), m.save_state(0)) for m in models])


def load(models: Sequence["_core.Model"], path: Union[str, os.PathLike]) -> int:
    """Put a saved prefix into sequence 0 of every model; returns its length in
    tokens (the target's). The next generation whose prompt starts with it
    processes only the rest."""
    parts = read(path, models)
    for model, tokens, state in parts:
        if not model.load_state(0, state, tokens):
            raise PrefixFileError(f"{path}: the {'target' if model is models[0] else 'draft model'}'s context "
                                  f"(n_ctx={model.n_ctx}) has no room for its {len(tokens)} tokens, or the state "
                                  f"does not fit it")
    return len(parts[0][1])
