"""The embedding routes' wire formats: OpenAI's ``/v1/embeddings`` and
ollama's ``/api/embed`` and legacy ``/api/embeddings``. Each has a parser
(body -> a frozen request, refusing what it cannot honour with a 400
:class:`~pyspec.server.api_error.APIError` that names the field) and a runner
that embeds with a :class:`~pyspec.embedding.Embedder` and builds the answer.

Parsers are cheap: call them on the event loop, so a bad body is refused
before any work. Runners are synchronous and hold no lock but the embedder's
(which releases the GIL while it decodes): call them in an executor, e.g.
``await loop.run_in_executor(None, openai_embeddings, embedder, request, name)``.
A runner raises APIError: 400 for an input the embedder cannot take (empty,
an id outside the vocabulary, longer than its context and not truncated),
500 (``server_error``) when llama.cpp fails.

What each route answers:

* ``/v1/embeddings``: ``input`` a string, array of strings, token array or
  array of token arrays (at most :data:`MAX_INPUTS`); ``encoding_format``
  ``"float"`` (default) or ``"base64"`` (little-endian float32, as OpenAI's
  client decodes it); ``dimensions`` only equal to the model's size; ``model``
  and ``user`` accepted. Unit vectors, as OpenAI's and llama-server's. An
  input longer than the context is refused (OpenAI does the same).
* ``/api/embed`` (ollama): ``input`` a string or array of strings (none, or
  ``""``: no embeddings); ``truncate`` (default true) cuts long inputs to the
  context, false refuses them; ``dimensions`` keeps the first N values and
  normalises again (ollama's rule); ``options`` and ``keep_alive`` are
  accepted and change nothing. Unit vectors, timings in nanoseconds.
* ``/api/embeddings`` (ollama, legacy): ``prompt`` a string (``""``: an empty
  embedding); the vector as the model pools it, not normalised (as ollama's).

ollama's clients read an error as ``{"error": "message"}``: :func:`ollama_error`.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..embedding import Embedder
from ..errors import ContextOverflowError, DecodeError
from ..server.api_error import APIError
from . import fields

Body = Dict[str, Any]

#: OpenAI's limit on the inputs of one request.
MAX_INPUTS = 2048
#: ``encoding_format`` values OpenAI defines.
ENCODINGS = ("float", "base64")

_OPENAI_FIELDS = {"input", "model", "encoding_format", "dimensions", "user"}
_OLLAMA_EMBED_FIELDS = {"model", "input", "truncate", "options", "keep_alive", "dimensions"}
_OLLAMA_EMBEDDINGS_FIELDS = {"model", "prompt", "options", "keep_alive"}


@dataclass(frozen=True)
class OpenAIEmbeddings:
    """A ``/v1/embeddings`` body, parsed: texts or token lists, the encoding, the model named."""

    inputs: List[Union[str, List[int]]]
    encoding_format: str = "float"
    model: Optional[str] = None


@dataclass(frozen=True)
class OllamaEmbed:
    """An ``/api/embed`` body, parsed (``dimensions`` None: the model's size)."""

    inputs: List[str]
    truncate: bool = True
    dimensions: Optional[int] = None
    model: Optional[str] = None


@dataclass(frozen=True)
class OllamaEmbeddings:
    """A legacy ``/api/embeddings`` body, parsed."""

    prompt: str
    model: Optional[str] = None


# ------------------------------------------------------------------ OpenAI

def parse_openai(body: Any, n_embd: int) -> OpenAIEmbeddings:
    """Validate a ``/v1/embeddings`` body (JSON-decoded); ``n_embd`` is the
    embedder's vector size (``dimensions`` must equal it). APIError 400 naming
    the field for anything else."""
    _check_fields(body, _OPENAI_FIELDS)
    model = _model(body)
    if body.get("input") is None:
        raise APIError(400, "'input' is required", param="input")
    inputs = _openai_inputs(body["input"])
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODINGS:
        raise APIError(400, f"'encoding_format' must be 'float' or 'base64', got {encoding!r}",
                       param="encoding_format")
    dimensions = fields.integer(body, "dimensions", 1)
    if dimensions is not None and dimensions != n_embd:
        raise APIError(400, f"'dimensions' must be the model's embedding size, {n_embd} (pyspec does not shorten "
                       f"embeddings), got {dimensions}", param="dimensions")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise fields.type_error("user", "a string")
    return OpenAIEmbeddings(inputs=inputs, encoding_format=encoding, model=model)


def _openai_inputs(value: Any) -> List[Union[str, List[int]]]:
    want = "a string, an array of strings, an array of token ids or an array of such arrays"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise fields.type_error("input", want)
    if not value:
        raise APIError(400, "'input' must not be empty", param="input")
    if all(_is_id(t) for t in value):
        return [list(value)]
    if all(isinstance(x, str) for x in value):
        inputs: List[Union[str, List[int]]] = list(value)
    elif all(isinstance(x, list) and all(_is_id(t) for t in x) for x in value):
        inputs = [list(x) for x in value]
    else:
        raise fields.type_error("input", want + " (not a mix)")
    if len(inputs) > MAX_INPUTS:
        raise APIError(400, f"'input' holds {len(inputs)} inputs; at most {MAX_INPUTS} per request", param="input")
    return inputs


def openai_embeddings(embedder: Embedder, request: OpenAIEmbeddings, model: str) -> Dict[str, Any]:
    """Embed a parsed ``/v1/embeddings`` request: the answer, naming ``model``."""
    _check_pooled(embedder)
    tokens = _tokenized(embedder, request.inputs, truncate=False)
    vectors = _embed(embedder, tokens, normalize=True)
    return openai_answer(vectors, sum(len(t) for t in tokens), model, request.encoding_format)


def openai_answer(vectors: Union[np.ndarray, Sequence[Sequence[float]]], n_tokens: int, model: str,
                  encoding_format: str = "float") -> Dict[str, Any]:
    """OpenAI's embeddings answer: a ``list`` of ``embedding`` objects in input
    order, each a list of floats or (``"base64"``) the base64 of its
    little-endian float32 bytes; ``usage`` counts the input tokens."""
    if encoding_format not in ENCODINGS:
        raise ValueError(f"encoding_format must be 'float' or 'base64', got {encoding_format!r}")
    data = []
    for i, v in enumerate(vectors):
        row = np.asarray(v, dtype="<f4")
        embedding: Any = (base64.b64encode(row.tobytes()).decode("ascii") if encoding_format == "base64"
                          else row.tolist())
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


# ------------------------------------------------------------------ ollama

def parse_ollama_embed(body: Any, n_embd: int) -> OllamaEmbed:
    """Validate an ollama ``/api/embed`` body; ``n_embd`` bounds ``dimensions``."""
    _check_fields(body, _OLLAMA_EMBED_FIELDS)
    model = _model(body)
    value = body.get("input")
    if value is None or value == "":
        inputs: List[str] = []
    elif isinstance(value, str):
        inputs = [value]
    elif isinstance(value, list) and all(isinstance(x, str) for x in value):
        inputs = list(value)
    else:
        raise fields.type_error("input", "a string or an array of strings")
    _ollama_extras(body)
    dimensions = fields.integer(body, "dimensions", 0)
    if dimensions is not None and dimensions > n_embd:
        raise APIError(400, f"'dimensions' must be at most the model's embedding size, {n_embd}, got {dimensions}",
                       param="dimensions")
    return OllamaEmbed(inputs=inputs, truncate=fields.flag(body, "truncate", True),
                       dimensions=dimensions or None, model=model)


def ollama_embed(embedder: Embedder, request: OllamaEmbed, model: str, *,
                 started_ns: Optional[int] = None) -> Dict[str, Any]:
    """Embed a parsed ``/api/embed`` request: ollama's answer, naming ``model``
    (ollama names the request's). ``started_ns`` (``time.monotonic_ns()`` when
    the request arrived; None: now) starts ``total_duration``; the model is
    loaded already, so ``load_duration`` is 0."""
    start = time.monotonic_ns() if started_ns is None else started_ns
    _check_pooled(embedder)
    tokens = (_tokenized(embedder, request.inputs, truncate=request.truncate, hint="; 'truncate': true cuts it")
              if request.inputs else [])
    vectors = _embed(embedder, tokens, normalize=True) if tokens else np.zeros((0, embedder.n_embd), np.float32)
    d = request.dimensions
    if d is not None and d < vectors.shape[1]:
        # ollama's rule: the first d values, made unit length again (Matryoshka embeddings).
        vectors = vectors[:, :d]
        norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
        vectors = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return {"model": model, "embeddings": vectors.tolist(), "total_duration": time.monotonic_ns() - start,
            "load_duration": 0, "prompt_eval_count": sum(len(t) for t in tokens)}


def parse_ollama_embeddings(body: Any) -> OllamaEmbeddings:
    """Validate a legacy ollama ``/api/embeddings`` body."""
    _check_fields(body, _OLLAMA_EMBEDDINGS_FIELDS)
    model = _model(body)
    prompt = body.get("prompt")
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise fields.type_error("prompt", "a string")
    _ollama_extras(body)
    return OllamaEmbeddings(prompt=prompt, model=model)


def ollama_embeddings(embedder: Embedder, request: OllamaEmbeddings) -> Dict[str, Any]:
    """Embed a parsed ``/api/embeddings`` request: ``{"embedding": [...]}``,
    the vector as the model pools it (not normalised, as ollama's legacy
    route); an empty prompt gives an empty embedding (ollama loads the model then)."""
    if not request.prompt:
        return {"embedding": []}
    _check_pooled(embedder)
    tokens = _tokenized(embedder, [request.prompt], truncate=False, param="prompt")
    return {"embedding": _embed(embedder, tokens, normalize=False)[0].tolist()}


def ollama_error(e: APIError) -> Dict[str, str]:
    """The body of an ollama route's error (its clients read a string)."""
    return {"error": e.message}


def _ollama_extras(body: Body) -> None:
    """``options`` and ``keep_alive`` are accepted, and change nothing: the
    embedder's context is fixed when the server starts, and its model stays loaded."""
    if body.get("options") is not None and not isinstance(body["options"], dict):
        raise fields.type_error("options", "an object")
    keep = body.get("keep_alive")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (str, int, float))):
        raise fields.type_error("keep_alive", "a duration (a string such as \"5m\", or seconds)")


# ------------------------------------------------------------------ shared

def _check_fields(body: Any, known: set) -> None:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name in sorted(body):
        if name not in known:
            raise APIError(400, f"unsupported parameter '{name}' (pyspec serve does not implement it)", param=name)


def _model(body: Body) -> Optional[str]:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise fields.type_error("model", "a string")
    return model


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _check_pooled(embedder: Embedder) -> None:
    if embedder.pooling == "none":
        raise APIError(400, "this embedder pools nothing (pooling 'none': a vector per token), which the "
                       "embedding routes cannot answer; start it with a pooling type (mean, cls, last)",
                       param="input")


def _tokenized(embedder: Embedder, inputs: Sequence[Union[str, List[int]]], *, truncate: bool,
               param: str = "input", hint: str = "") -> List[List[int]]:
    """Each input's tokens (llama-server's tokenization of texts), checked:
    APIError 400 for an id outside the vocabulary, an empty input, or one
    longer than the embedder's context without ``truncate``."""
    try:
        tokens = embedder.tokens(list(inputs), truncate=truncate)
    except ValueError as e:
        raise APIError(400, str(e), param=param) from None
    name = param if len(tokens) == 1 else None
    for i, t in enumerate(tokens):
        where = name or f"{param}[{i}]"
        if not t:
            raise APIError(400, f"{where} is empty: it has no tokens", param=param)
        if len(t) > embedder.max_tokens:
            raise APIError(400, f"{where} has {len(t)} tokens, more than the {embedder.max_tokens} the embedder "
                           f"takes per input (its context){hint}", param=param)
    return tokens


def _embed(embedder: Embedder, tokens: List[List[int]], *, normalize: bool) -> np.ndarray:
    try:
        return embedder.embed_tokens(tokens, normalize=normalize)
    except (ContextOverflowError, ValueError) as e:  # checked above; the core's word is final
        raise APIError(400, str(e), param="input") from None
    except DecodeError as e:
        raise APIError(500, f"embedding failed: {e}", type="server_error") from None
