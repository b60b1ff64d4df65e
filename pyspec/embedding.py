"""Embeddings computed by pyspec's core: :class:`Embedder`, a second llama.cpp
context on a loaded :class:`~pyspec.Model` (cpp/model/embedder.h), with
embeddings on and a pooling type. The model's own context is not touched: a
server embeds on executor threads while its generations run.

Texts are tokenized as llama-server tokenizes embedding input: the special
tokens the model's metadata asks for are added (BOS, and EOS where it wants
one) and control-token text is parsed (``"<bos>"`` is that token). Token lists
are taken as they are. Several inputs are packed into one decode where they
fit; each input must fit the embedder's context (:attr:`Embedder.max_tokens`),
or be cut with ``truncate=True``.

Defaults are llama-server's with ``--embeddings --pooling mean``: mean pooling
and unit vectors (its ``embd_normalize`` 2). Flash attention is off unless
asked for (the reason is in embedder.h). The wire formats (OpenAI's
``/v1/embeddings``, ollama's ``/api/embed`` and ``/api/embeddings``) are
pyspec/wire/embeddings.py's; ``pyspec.Llama(embedding=True)`` embeds through
this class too (pyspec/llama/embedding.py).
"""

from __future__ import annotations

import numbers
from typing import Any, List, Optional, Sequence, Union

import numpy as np

from . import _core, interrupts
from .model import FLASH_ATTN, Model

#: Pooling names and llama.cpp's ``llama_pooling_type``: ``model`` is the
#: model's own (its GGUF's ``pooling_type``; ``none`` for a generative model);
#: ``none`` gives a vector per token. ``rank`` (a reranker's score) is not an embedding.
POOLING = {"model": -1, "none": 0, "mean": 1, "cls": 2, "last": 3}
POOLING_NAMES = {v: k for k, v in POOLING.items() if v >= 0}
#: An embedder's settings as the core defaults them (n_ctx 512, ...).
EMBEDDER_DEFAULTS = _core.EmbedderParams()

#: One input: a text, or token ids.
Input = Union[str, Sequence[int]]
#: What :meth:`Embedder.embed` takes: one input, or a list of them.
Inputs = Union[str, Sequence[int], Sequence[Input]]


def as_inputs(inputs: Inputs) -> List[Input]:
    """``inputs`` as a list of inputs: a string or one token list is one input;
    a list holds texts and token lists. TypeError for anything else, ValueError
    for an empty list."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (bytes, bytearray)):
        raise TypeError("inputs must be text (str), not bytes: decode them first")
    if isinstance(inputs, np.ndarray):
        inputs = inputs.tolist()
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a string, a list of strings, token ids or a list of token-id lists, "
                        f"got {type(inputs).__name__}")
    if not inputs:
        raise ValueError("no inputs to embed (an empty list)")
    if all(_is_id(t) for t in inputs):
        return [list(inputs)]
    out: List[Input] = []
    for i, item in enumerate(inputs):
        if isinstance(item, np.ndarray):
            item = item.tolist()
        if isinstance(item, str) or (isinstance(item, (list, tuple)) and all(_is_id(t) for t in item)):
            out.append(item)
        else:
            raise TypeError(f"input {i} must be a string or a list of token ids, got {type(item).__name__}")
    return out


def _is_id(t: Any) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


class Embedder:
    """Embeddings of texts or token lists by a loaded model.

    ``model`` is a :class:`~pyspec.Model` (or its ``native`` core); the
    embedder makes its own llama.cpp context on the model's weights and keeps
    the model alive. ``n_ctx`` (None: 512, llama-cpp-python's default context
    and llama-server's physical batch) is the longest input, as tokens, and
    what one decode packs; ``n_batch`` (None: ``n_ctx``) makes a decode
    smaller. llama.cpp keeps a vocabulary-sized row per token of a decode
    (n_vocab x n_batch floats: 512 MiB for Gemma 3's 262k tokens at 512),
    so a large ``n_ctx`` costs memory even for short inputs.

    ``pooling``: ``"mean"`` (the default), ``"cls"``, ``"last"``, ``"none"``
    (a vector per token) or ``"model"`` (the model's own). ``normalize``
    (default True) makes each vector unit length (L2); a call may override it.
    ``n_threads``: None, the model's. ``flash_attn``: "off" (the default),
    "on" or "auto". ``pack`` (default True) embeds several inputs in one
    decode where they fit; False gives each its own, so that an input's
    vector is bit for bit the one it gets when sent alone (packing changes the
    batch's shape, and llama.cpp's kernels round by it: cosine >= 0.9998 to
    the lone one on the catalog's models). Thread-safe: calls take turns on
    the context.

    >>> emb = Embedder(model)                      # doctest: +SKIP
    >>> emb.embed(["a cat", "a dog"])              # doctest: +SKIP
    [[0.01, ...], [0.02, ...]]
    """

    def __init__(self, model: Union[Model, "_core.Model"], *, n_ctx: Optional[int] = None,
                 pooling: str = "mean", normalize: bool = True, n_batch: Optional[int] = None,
                 n_threads: Optional[int] = None, flash_attn: str = "off", pack: bool = True) -> None:
        if pooling not in POOLING:
            hint = " (a reranker's score, not an embedding)" if pooling == "rank" else ""
            raise ValueError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}{hint}")
        if flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of 'auto', 'on', 'off', got {flash_attn!r}")
        if n_threads is not None and n_threads < 1:
            raise ValueError(f"n_threads must be >= 1 (None: the model's), got {n_threads}")
        native = model.native if isinstance(model, Model) else model
        if not isinstance(native, _core.Model):
            raise TypeError(f"model must be a pyspec.Model, got {type(model).__name__}")
        self._model = model  # the core keeps the model alive too; this keeps its Python face
        self._native = native
        self.normalize = bool(normalize)
        self.pack = bool(pack)
        params = _core.EmbedderParams(n_ctx=EMBEDDER_DEFAULTS.n_ctx if n_ctx is None else n_ctx,
                                      n_batch=n_batch or 0, n_threads=n_threads or 0,
                                      flash_attn=FLASH_ATTN[flash_attn], pooling=POOLING[pooling])
        self._core: Optional[_core.Embedder] = _core.Embedder(native, params)

    # ------------------------------------------------------------ facts
    @property
    def native(self) -> "_core.Embedder":
        """The C++ embedder (``pyspec._core.Embedder``)."""
        if self._core is None:
            raise RuntimeError("this Embedder is closed")
        return self._core

    @property
    def model(self) -> Union[Model, "_core.Model"]:
        return self._model

    @property
    def n_embd(self) -> int:
        """Floats in a vector."""
        return self.native.n_embd

    @property
    def n_ctx(self) -> int:
        """Cells of the embedder's context (llama.cpp may round the request up)."""
        return self.native.n_ctx

    @property
    def max_tokens(self) -> int:
        """The longest input, in tokens: min(n_batch, n_ctx, the model's training context)."""
        return self.native.max_tokens

    @property
    def pooling(self) -> str:
        """The pooling as run (``"model"`` resolved to the model's own)."""
        return POOLING_NAMES[self.native.pooling]

    def __repr__(self) -> str:
        if self._core is None:
            return "Embedder(closed)"
        return (f"Embedder(model={self._native.path!r}, pooling={self.pooling!r}, n_embd={self.n_embd}, "
                f"max_tokens={self.max_tokens}, normalize={self.normalize})")

    # ------------------------------------------------------------ tokens
    def tokenize(self, text: str) -> List[int]:
        """Token ids of a text as llama-server tokenizes embedding input
        (special tokens added as the model asks, control-token text parsed)."""
        return list(self._native.tokenize(text, True, True))

    def truncated(self, tokens: Sequence[int]) -> List[int]:
        """``tokens`` cut to :attr:`max_tokens`, keeping a final EOS that the
        tokenizer added (a model that asks for one reads it at the end)."""
        tokens = list(tokens)
        limit = self.max_tokens
        if len(tokens) <= limit:
            return tokens
        cut = tokens[:limit]
        eos = self._native.eos
        if self._native.add_eos and tokens[-1] == eos and eos >= 0:
            cut[-1] = eos
        return cut

    def tokens(self, inputs: Inputs, *, truncate: bool = False) -> List[List[int]]:
        """Each input's token ids, as :meth:`embed` would embed them: texts
        tokenized (:meth:`tokenize`), token lists checked against the
        vocabulary; with ``truncate`` cut to :attr:`max_tokens` (:meth:`truncated`)."""
        n_vocab = self._native.n_vocab
        out = []
        for i, item in enumerate(as_inputs(inputs)):
            toks = self.tokenize(item) if isinstance(item, str) else [int(t) for t in item]
            bad = next((t for t in toks if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise ValueError(f"token id {bad} of input {i} is outside the vocabulary [0, {n_vocab})")
            out.append(self.truncated(toks) if truncate else toks)
        return out

    # ------------------------------------------------------------ embeddings
    def embed_tokens(self, tokens: Sequence[Sequence[int]], *, normalize: Optional[bool] = None) -> np.ndarray:
        """The core call: float32 rows (n, n_embd), one per token list (with
        pooling ``none``, one per token of each, in order). Raises ValueError
        for an empty list or token list or an id outside the vocabulary,
        :class:`~pyspec.ContextOverflowError` for a list longer than
        :attr:`max_tokens`, :class:`~pyspec.DecodeError` if llama.cpp fails.
        From the main thread it runs on a worker thread, so that Ctrl-C stops it."""
        core = self.native
        norm = self.normalize if normalize is None else bool(normalize)
        seqs = [list(t) for t in tokens]
        cancel = _core.CancelToken()
        if self.pack or len(seqs) < 2:
            return interrupts.run_interruptible(lambda: core.embed(seqs, norm, cancel), cancel)
        n_vocab, longest = self._native.n_vocab, self.max_tokens
        if not all(s and len(s) <= longest and 0 <= min(s) and max(s) < n_vocab for s in seqs):
            # One packed call checks every input before it embeds any: it refuses, with the core's message.
            return interrupts.run_interruptible(lambda: core.embed(seqs, norm, cancel), cancel)
        return interrupts.run_interruptible(
            lambda: np.concatenate([core.embed([s], norm, cancel) for s in seqs]), cancel)

    def embed_array(self, inputs: Inputs, *, normalize: Optional[bool] = None,
                    truncate: bool = False) -> Union[np.ndarray, List[np.ndarray]]:
        """:meth:`embed` as numpy: an array (n, n_embd), or with pooling
        ``none`` a list of (tokens, n_embd) arrays, one per input."""
        toks = self.tokens(inputs, truncate=truncate)
        rows = self.embed_tokens(toks, normalize=normalize)
        if self.native.pooling != POOLING["none"]:
            return rows
        ends = np.cumsum([len(t) for t in toks])[:-1]
        return np.split(rows, ends)

    def embed(self, inputs: Inputs, *, normalize: Optional[bool] = None, truncate: bool = False) -> List[Any]:
        """One vector (a list of floats) per input, in order: ``inputs`` is a
        string, a list of strings, token ids, or a list of token-id lists
        (a single input gives a list of one vector). With pooling ``none``,
        each input's item is a list of vectors, one per token. ``normalize``:
        None, the embedder's; ``truncate``: cut inputs longer than
        :attr:`max_tokens` instead of raising ContextOverflowError."""
        out = self.embed_array(inputs, normalize=normalize, truncate=truncate)
        return out.tolist() if isinstance(out, np.ndarray) else [a.tolist() for a in out]

    # ------------------------------------------------------------ life cycle
    def close(self) -> None:
        """Free the embedder's context now (later calls raise RuntimeError)."""
        self._core = None

    def __enter__(self) -> "Embedder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
