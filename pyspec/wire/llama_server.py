"""llama-server's native request fields -> :class:`~pyspec.request.Request`:
the body of ``POST /infill`` (:func:`parse`), as llama.vim and llama.vscode
send it (docs/editor.md; the answer's shape: server/infill.py).

Quirks of this dialect:

====================  =======================================================
``input_prefix``,     the text before and after the cursor line; ``prompt``
``input_suffix``      is the line's typed part; ``input_extra`` other files
``n_predict``         the answer's length first (then ``max_completion_tokens``,
                      ``max_tokens``: wire/fields.py); -1 none, 0 a warm-up
                      that samples one token, as llama-server does
``samplers``          the chain decides which sampling fields act
                      (wire/llama_fields.py); llama-server's defaults
``n_cmpl``            choices (``n`` too)
``seed``              -1 and 4294967295: a fresh one
``layout``,           pyspec's: the prompt's layout (``"still"`` or
``healing``           ``"llama-server"``) and its healing (pyspec/request.py)
====================  =======================================================

Fields that only tune llama-server (``cache_prompt``, ``id_slot``,
``t_max_prompt_ms``, ``samplers`` names that are off at their defaults ...)
are accepted; one that would change the answer and that pyspec does not
implement is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .. import fim
from .. import request as request_
from ..server.api_error import APIError
from . import fields, llama_fields
from .openai import ParsedRequest, RequestSettings

#: Fields that change the answer in llama-server and not here: refused unless neutral.
_REFUSED = {"grammar": (None, ""), "json_schema": (None,), "ignore_eos": (False, None),
            "mirostat": (0, None), "n_probs": (0, None), "lora": (None, []), "n_keep": (0, -1, None)}


@dataclass
class InfillRequest:
    parsed: ParsedRequest
    fill: fim.InfillPrompt
    editor: Dict[str, float]          # EditorStops' settings
    response_fields: Optional[List[str]] = None
    samplers: List[str] = field(default_factory=list)
    n_predict: int = -1
    #: A client caching a prompt, not asking for a suggestion: ``n_predict`` 0, or
    #: no text around a cursor at all (llama.vim's ring update: only ``input_extra``).
    warm_up: bool = False
    #: What the prompt was built from (server/warm_ups.py builds another from it).
    source: Optional["InfillSource"] = None


@dataclass(frozen=True)
class InfillSource:
    """What an /infill request's prompt is built from: the cursor's
    surroundings, other files' chunks, and the prompt's settings."""

    prefix: str
    suffix: str
    typed: str
    extra: List[fim.Chunk]
    layout: str
    n_predict: int
    healing: Optional[bool]
    n_batch: int

    @property
    def ring_only(self) -> bool:
        """Only other files' chunks, no text around a cursor: llama.vim's ring update."""
        return not (self.prefix or self.suffix or self.typed)

    def prompt(self, target) -> fim.InfillPrompt:
        """Its FIM prompt (pyspec/fim.py); APIError where it cannot be built."""
        return fields.fim_prompt(lambda: request_.infill_prompt(
            target, self.prefix, self.suffix, typed=self.typed, extra=self.extra, n_batch=self.n_batch,
            n_predict=self.n_predict, layout=self.layout, healing=self.healing))


def _extra(value: Any) -> List[fim.Chunk]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError(400, "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
                       param="input_extra")
    chunks = []
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise APIError(400, "extra_context chunk must contain a \"text\" field with a string value",
                           param="input_extra")
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise APIError(400, "extra_context chunk's \"filename\" field must be a string", param="input_extra")
        chunks.append(fim.Chunk(chunk["text"], name))
    return chunks


def _text(body: Dict[str, Any], name: str, required: bool) -> str:
    v = body.get(name)
    if v is None:
        if required:
            raise APIError(400, f"\"{name}\" is required", param=name)
        return ""
    if not isinstance(v, str):
        raise APIError(400, f"\"{name}\" must be a string", param=name)
    return v


def parse(body: Any, target, *, max_n: int, n_batch: int, max_draft: int) -> InfillRequest:
    """An /infill body checked, its FIM prompt laid out (a 501 for a model
    without FIM tokens, before anything else, as llama-server does)."""
    try:
        fim.FimTokens.of(target).check()
    except fim.FimUnsupported as e:
        raise APIError(501, str(e), type="not_supported_error") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, neutral in _REFUSED.items():
        if name in body and body[name] not in neutral:
            raise APIError(400, f"unsupported parameter '{name}' on /infill (pyspec serve does not implement it)",
                           param=name)
    prefix, suffix = _text(body, "input_prefix", True), _text(body, "input_suffix", True)
    typed = _text(body, "prompt", False)
    extra = _extra(body.get("input_extra"))
    layout = body.get("layout", "still")
    if layout not in fim.LAYOUTS:
        raise APIError(400, f"'layout' must be one of {', '.join(fim.LAYOUTS)}", param="layout")
    answer_length = fields.max_tokens(body, None, unlimited=fields.MAX_TOKENS_FIELDS)
    n_predict = -1 if answer_length is None else answer_length
    chain = llama_fields.samplers(body, llama_fields.DEFAULT_CHAIN)
    sampling = llama_fields.chain_sampling(body, chain, llama_fields.DEFAULTS)
    n = body.get("n_cmpl", body.get("n", 1))
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_n:
        raise APIError(400, f"n_cmpl must be an integer in [1, {max_n}] (the server's slots: pyspec serve "
                            f"--parallel)", param="n_cmpl")
    stream = fields.flag(body, "stream", False)
    picked = llama_fields.response_fields(body)
    healing = fields.flag(body, "healing")
    source = InfillSource(prefix, suffix, typed, extra, layout, n_predict, healing, n_batch)
    fill = source.prompt(target)
    # n_predict 0 (a client's warm-up, to cache the prompt): one token, as llama-server samples one.
    max_tokens = None if n_predict < 0 else max(n_predict, 1)
    settings = RequestSettings(max_tokens=max_tokens, sampling=sampling, seed=fields.seed(body),
                               stop=list(fields.stop(body)), n=n, draft_max=fields.draft_max(body, max_draft))
    parsed = ParsedRequest("completion", body.get("model"), [fill.tokens], settings, stream=stream)
    editor = {"n_indent": fields.integer(body, "n_indent", 0, default=0),
              "t_max_predict_ms": float(fields.integer(body, "t_max_predict_ms", -1, default=-1))}
    warm_up = n_predict == 0 or source.ring_only
    return InfillRequest(parsed, fill, editor, picked, chain, n_predict, warm_up, source)


# ------------------------------------------------------------------ /completion
#: /completion's fields that go to the common parse as they are.
_COMPLETION_PASSED = {"n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "stream", "samplers",
                      "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "logit_bias",
                      "grammar", "json_schema", "response_fields", "draft_max", "policy", "drafter", "model",
                      "max_tokens", "cache_prompt", "id_slot", "t_max_prompt_ms"}
#: Fields that only shape llama-server's answer or its runtime, accepted as they are.
_COMPLETION_QUIET = {"return_tokens", "n_probs", "timings_per_token", "return_progress"}
#: Fields accepted at their neutral values only (elsewhere they change the answer, and pyspec does not implement them).
_COMPLETION_NEUTRAL = {"ignore_eos": (False, None), "mirostat": (0, None), "lora": (None, []), "n_keep": (0, -1, None),
                       "dry_multiplier": (0, 0.0, None), "typical_p": (1, 1.0, None), "typ_p": (1, 1.0, None),
                       "xtc_probability": (0, 0.0, None), "top_n_sigma": (-1, -1.0, None), "n_cmpl": (1, None),
                       "n": (1, None), "post_sampling_probs": (False, None), "n_indent": (0, None),
                       "t_max_predict_ms": (-1, 0, None)}


def completion_prompt(value: Any, tokenize) -> Any:
    """/completion's ``prompt``: a string, token ids, or one list mixing
    strings and ids (each string tokenized in place, the first element with
    the model's BOS when it is a string, as llama-server's tokenize_mixed);
    several prompts in one request (a list of strings or of lists) are
    refused. ``tokenize(text, add_special)``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        return completion_prompt(value[0], tokenize)
    items_ok = isinstance(value, list) and value and all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                                         for x in value)
    if items_ok and any(isinstance(x, int) for x in value):
        out: List[int] = []
        for i, x in enumerate(value):
            out += tokenize(x, i == 0) if isinstance(x, str) else [x]
        return out
    raise APIError(400, "'prompt' must be a string, token ids, or a list mixing strings and token ids (one "
                        "prompt per /completion request)", param="prompt")


def completion_body(body: Any, tokenize) -> Dict[str, Any]:
    """The OpenAI completion body of a /completion body, with llama-server's
    defaults (its sampling chain and values, no length limit); ``n_probs``
    becomes ``logprobs``."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name in sorted(body):
        neutral = _COMPLETION_NEUTRAL.get(name)
        if neutral is not None and body[name] not in neutral:
            raise APIError(400, f"unsupported parameter '{name}' with this value on /completion (pyspec serve "
                                f"does not implement it)", param=name)
        if name not in _COMPLETION_PASSED and name not in _COMPLETION_QUIET and neutral is None and name != "prompt":
            raise APIError(400, f"unsupported parameter '{name}' on /completion (pyspec serve does not implement it)",
                           param=name)
    if "prompt" not in body:
        raise APIError(400, "\"prompt\" is required", param="prompt")
    out = {k: body[k] for k in _COMPLETION_PASSED if k in body}
    out["prompt"] = completion_prompt(body["prompt"], tokenize)
    out.setdefault("samplers", list(llama_fields.DEFAULT_CHAIN))
    for name in ("temperature", "top_k", "top_p", "min_p"):
        out.setdefault(name, getattr(llama_fields.DEFAULTS, name))
    if fields.max_tokens(body, None, unlimited=fields.MAX_TOKENS_FIELDS) is None:
        out.pop("max_tokens", None)
        out["n_predict"] = -1
    n_probs = fields.integer(body, "n_probs", 0, 20)
    if n_probs:
        out["logprobs"] = n_probs
    return out
