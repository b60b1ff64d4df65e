"""Memory: earlier prompts and answers that the ``suffix`` drafter copies from.

Local work repeats itself: the file sent two turns ago comes back with one
change, the same instruction meets a similar input. A :class:`Memory` keeps
the token ids of earlier texts (documents) under a byte cap, evicting the least
recently used, and indexes them with a suffix automaton in the C++ core
(``cpp/drafters/suffix_store.h``); a suffix drafter looks the current text up
there every round. Drafting from memory never changes the output's law (a copy
is a deterministic draft, verified like any other): it only changes speed.

Who remembers what: a :class:`~pyspec.Model` keeps one (``Model.memory``) that
its generations and those of decoders over it add to; the server keeps one per
user (``serve.py``); ``pyspec generate --memory FILE`` loads and saves one.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import warnings
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np

from . import _core
from ._durable import replacing
from ._native import native_property

#: Default byte cap of one memory.
DEFAULT_CAP_MB = 64.0
# Text whose tokenization identifies a vocabulary (a file is only reused by models that agree).
_PROBE = "Memory: the quick brown fox jumps over 13 lazy dogs; def f(x): return x ** 2  # ✓ naïve"


class Memory:
    """A bounded store of earlier texts (token ids) for suffix drafting.

    ``cap_mb`` bounds the bytes of its index and texts: over it, the least
    recently used documents (added, or copied from by a draft) are dropped.
    Thread-safe: drafters read it while others add to it."""

    def __init__(self, cap_mb: float = DEFAULT_CAP_MB) -> None:
        if not cap_mb > 0:
            raise ValueError(f"a memory's cap must be > 0 MB, got {cap_mb}")
        self.native = _core.SuffixStore(int(cap_mb * 2**20))

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one document (a prompt and its answer, a file, ...)."""
        self.native.add(list(tokens))

    def clear(self) -> None:
        self.native.clear()

    def documents(self) -> List[List[int]]:
        """The documents, least recently used first."""
        return self.native.documents()

    cap_bytes = native_property[int]("cap_bytes", "The byte cap: ``cap_mb`` in bytes (at least 64 KiB).")
    bytes = native_property[int]("bytes", "Bytes held now (at most ``cap_bytes`` after every add).")
    n_tokens = native_property[int]("n_tokens", "Tokens held, over all documents.")
    n_documents = native_property[int]("n_documents", "Documents held.")

    def __repr__(self) -> str:
        return (f"Memory({self.n_documents} documents, {self.n_tokens} tokens, "
                f"{self.bytes / 2**20:.1f} of {self.cap_bytes / 2**20:.0f} MiB)")

    # ------------------------------------------------------------ files
    def save(self, path: Union[str, os.PathLike], vocab: str) -> None:
        """Write the documents to ``path``, tagged with ``vocab``
        (:func:`vocab_fingerprint`). Atomically: a crash at any moment leaves
        the old file or the new one under ``path``, never part of one (the new
        one is written beside it as ``<name>.<pid>.<random>.tmp``, fsynced and
        renamed; the next save or load discards such a leftover, with a warning)."""
        docs = self.documents()
        lengths = np.array([len(d) for d in docs], dtype=np.int64)
        tokens = np.array([t for d in docs for t in d], dtype=np.int32)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        discard_leftovers(path)
        with replacing(path, prefix=f"{path.name}.{os.getpid()}.", suffix=".tmp") as f:
            np.savez(f, vocab=np.array(vocab), lengths=lengths, tokens=tokens)

    def load(self, path: Union[str, os.PathLike], vocab: str) -> int:
        """Add the documents saved in ``path``; returns how many. A file of
        another vocabulary, or one that is not a whole memory file (truncated,
        damaged: each array's CRC-32 is checked), raises ValueError naming it
        and adds nothing; the file is left as it is."""
        discard_leftovers(Path(path))
        try:
            f = np.load(path, allow_pickle=False)
            if not isinstance(f, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with f:
                saved, lengths, tokens = str(f["vocab"]), f["lengths"], f["tokens"]
        except Exception as e:  # noqa: BLE001 - a damaged archive fails in many ways inside zipfile and numpy
            raise ValueError(f"{path} is not a whole pyspec memory file ({type(e).__name__}: {e}); "
                             "it was left as it is") from None
        if saved != vocab:
            raise ValueError(f"{path} was saved with another model's vocabulary: its token ids mean other text here")
        ints = lengths.dtype.kind in "iu" and tokens.dtype.kind in "iu"
        if (not ints or lengths.ndim != 1 or tokens.ndim != 1 or (len(lengths) and lengths.min() < 0)
                or lengths.sum() != len(tokens) or (len(tokens) and not 0 <= tokens.min() <= tokens.max() < 2**31)):
            raise ValueError(f"{path} is damaged (its lengths do not match its tokens)")
        at = 0
        for n in lengths.tolist():
            self.add(tokens[at:at + n].tolist())
            at += n
        return len(lengths)


#: A leftover of a live process's save is kept this long (its save may be under way).
STALE_TEMP_S = 600.0


def discard_leftovers(path: Path) -> List[Path]:
    """Remove the temporary files that saves of ``path`` left when their
    process was killed (a live process's recent one is kept: its save may be
    under way), warning about each; returns them. Only names that
    :meth:`Memory.save` makes are touched."""
    mine = re.compile(re.escape(path.name) + r"\.(?:(\d+)\.)?[a-z0-9_]{8}\.tmp")
    gone = []
    try:
        candidates = [p for p in path.parent.iterdir() if mine.fullmatch(p.name)]
    except OSError:
        return gone
    for tmp in candidates:
        pid = mine.fullmatch(tmp.name).group(1)
        try:
            if _alive(pid) and time.time() - tmp.stat().st_mtime < STALE_TEMP_S:
                continue
            tmp.unlink()
        except OSError:
            continue
        gone.append(tmp)
        warnings.warn(f"pyspec: discarded {tmp} (part of a save of {path.name} that did not finish: its process "
                      f"stopped); {path.name} itself is untouched", RuntimeWarning, stacklevel=3)
    return gone


def _alive(pid: Optional[str]) -> bool:
    """Whether process ``pid`` (from a temporary file's name) may still be writing it."""
    if pid is None:
        return True  # named by an older version, without its pid: judged by its age alone
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


def vocab_fingerprint(model) -> str:
    """What identifies ``model``'s vocabulary for a saved memory: its size and
    how it tokenizes a probe text."""
    ids = model.tokenize(_PROBE, add_special=False)
    return f"{model.n_vocab}:{hashlib.sha256(np.array(ids, dtype=np.int32).tobytes()).hexdigest()[:16]}"


def choose(memory: Union[bool, Memory, None], default: Optional[Memory]) -> Optional[Memory]:
    """The Memory a ``memory=`` argument names: True (``default``), False/None (none), or a Memory."""
    if memory is True:
        return default
    if memory is False or memory is None:
        return None
    if isinstance(memory, Memory):
        return memory
    raise TypeError(f"memory must be True, False or a pyspec.Memory, got {type(memory).__name__}")
