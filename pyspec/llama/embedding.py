""":class:`pyspec.Llama`'s embeddings, ``embed`` and ``create_embedding``
(``Llama(..., embedding=True)``), computed by pyspec's core: an
:class:`~pyspec.embedding.Embedder` on the Llama's own model (a second
llama.cpp context on the loaded weights, made on first use; the file is not
loaded again), with llama-cpp-python's semantics:

* texts tokenized as llama-cpp-python's ``embed`` does (``Llama.tokenize``:
  BOS as the model asks, control-token text not parsed);
* the context as llama-cpp-python's embedding one: ``n_ctx``, the physical
  batch ``min(n_batch, n_ubatch)``, the Llama's threads and flash attention
  (off by default), ``pooling_type`` (-1, the default: the model's own, which
  for a generative model is none, a vector per token; 0 none, 1 mean, 2 cls,
  3 last; 4, rank, is refused: a reranker's score is not an embedding);
* ``truncate`` (default) cuts an input to that batch, otherwise a longer one
  raises ValueError; ``normalize`` makes each vector (each token's, without
  pooling) unit length; ``return_count`` adds the number of tokens embedded.
  A string gives one embedding, a list a list of them, as there.

Two things differ: an input fits in one micro-batch, so it is at most
``min(n_ctx, n_batch, n_ubatch)`` tokens, where llama-cpp-python takes up to
``n_batch`` and pools a longer one over its last micro-batch only; and
without pooling, each input of a list gets its own tokens' vectors, where
llama-cpp-python 0.3.36 reads a later input's at an offset counted in tokens
instead of floats (tests/test_llama_compat.py shows it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Union

import numpy as np

from ..embedding import POOLING_NAMES, Embedder
from . import options

if TYPE_CHECKING:
    from .llama import Llama

#: llama-cpp-python's ``pooling_type`` values (llama.cpp's ``llama_pooling_type``) and the embedder's names.
POOLING_TYPES: Dict[int, str] = {-1: "model", **POOLING_NAMES}


def check_pooling(pooling_type: Any) -> str:
    """The embedder's pooling name for llama-cpp-python's ``pooling_type``."""
    if pooling_type == 4:
        options.refuse("pooling_type", pooling_type, "rank pooling (4) is a reranker's score, not an embedding; "
                       "give -1 (the model's), 0 (none), 1 (mean), 2 (cls) or 3 (last)")
    if isinstance(pooling_type, bool) or pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooling_type must be one of {sorted(POOLING_TYPES)} (llama_pooling_type), "
                         f"got {pooling_type!r}")
    return POOLING_TYPES[pooling_type]


def embedder(llm: "Llama") -> Embedder:
    """The :class:`~pyspec.embedding.Embedder` of ``llm`` (made once)."""
    if not llm.embedding:
        raise RuntimeError("Llama model must be created with embedding=True to call this method")
    model = llm.model  # closed: RuntimeError
    if llm._embedder is None:
        llm._embedder = Embedder(model, normalize=False, **llm._embed_args)
    return llm._embedder


def embed(llm: "Llama", input: Union[str, List[str]], normalize: bool, truncate: bool, return_count: bool) -> Any:
    """llama-cpp-python's ``Llama.embed`` (the module docstring says what it does)."""
    emb = embedder(llm)
    texts = [input] if isinstance(input, str) else list(input)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"input {i} must be a string, got {type(text).__name__}")
    limit = emb.max_tokens
    tokens = [llm.tokenize(text.encode("utf-8")) for text in texts]
    if truncate:
        tokens = [t[:limit] for t in tokens]
    for t in tokens:
        if len(t) > limit:
            raise ValueError(f"Requested tokens ({len(t)}) exceed batch size of {limit}")
    total = sum(len(t) for t in tokens)
    rows = emb.embed_tokens(tokens, normalize=normalize) if tokens else np.zeros((0, emb.n_embd), np.float32)
    if emb.pooling == "none":  # a vector per token, input by input
        ends = np.cumsum([len(t) for t in tokens])[:-1]
        data: List[Any] = [part.tolist() for part in np.split(rows, ends)] if tokens else []
    else:
        data = rows.tolist()
    output = data[0] if isinstance(input, str) else data
    return (output, total) if return_count else output


def create_embedding(llm: "Llama", input: Union[str, List[str]], model: Union[str, None]) -> dict:
    """llama-cpp-python's ``Llama.create_embedding``: its response dict."""
    inputs = input if isinstance(input, list) else [input]
    embeds, total = embed(llm, inputs, normalize=False, truncate=True, return_count=True)
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
        "model": model if model is not None else llm.model_path,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }
