"""``POST /infill``: code completion for editors, as llama.cpp's llama-server
serves it to llama.vim and llama.vscode (docs/editor.md).

The body (:func:`parse`): ``input_prefix``, ``input_suffix``, ``prompt`` (the
typed part of the cursor line), ``input_extra`` (other files' chunks), the
sampling fields with their ``samplers`` chain, ``n_predict``, ``n_indent``,
``t_max_predict_ms``, ``stop``, ``n_cmpl``, ``stream``, ``response_fields``;
``layout`` (pyspec's: ``"still"``, the default, or ``"llama-server"``:
fim.py) picks the prompt's layout, and ``healing`` (pyspec's, a boolean:
default on, fim.heal) whether a half-typed last word is healed. Fields that only tune llama-server
(``cache_prompt``, ``id_slot``, ``t_max_prompt_ms``, ``samplers`` names that
are off at their defaults ...) are accepted; one that would change the answer
and that pyspec does not implement is a 400 naming it.

The ``infill`` sampler is not applied: the answer follows the target's
distribution under top-k/top-p/min-p and temperature (docs/editor.md says
why). A chain without ``temperature`` samples at temperature 1, as
llama-server's does (its chain ends in a draw at the logits' scale).

The answer (:class:`InfillAnswer`) is llama-server's native object on one line
(``"content":"..."``: llama.vim reads it with a pattern that allows no space),
an array of them for ``n_cmpl`` > 1, or an SSE stream of ``data: {...}``
chunks ending with the whole object (no ``[DONE]``), with ``response_fields``
picking flat ``"a/b"`` keys out of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import fim
from ..settings import SEED_BITS
from . import llama_fields, protocol, responses
from .answer import Answer, error_response
from .intake import fim_prompt
from .protocol import APIError, ParsedRequest, RequestSettings

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


def parse(body: Any, target, *, max_n: int, n_batch: int) -> InfillRequest:
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
    n_predict = -1
    for name in ("n_predict", "max_completion_tokens", "max_tokens"):  # llama-server's order
        if body.get(name) is not None:
            n_predict = protocol._int(body, name, -1)
            break
    chain = llama_fields.samplers(body, llama_fields.DEFAULT_CHAIN)
    sampling = llama_fields.chain_sampling(body, chain, llama_fields.DEFAULTS, protocol._float, protocol._int)
    stop = body.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "'stop' must be a list of strings", param="stop")
    n = body.get("n_cmpl", body.get("n", 1))
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_n:
        raise APIError(400, f"n_cmpl must be an integer in [1, {max_n}] (the server's slots: pyspec serve "
                            f"--parallel)", param="n_cmpl")
    stream = protocol._flag(body, "stream", False)
    fields = llama_fields.response_fields(body)
    seed = body.get("seed")
    seed = None if seed in (None, -1, 0xFFFFFFFF) else protocol._int(body, "seed", 0, 2**SEED_BITS - 1)
    healing = protocol._flag(body, "healing")
    if healing and layout == "llama-server":
        raise APIError(400, "'healing' is the still layout's: llama-server's puts the typed text before the suffix",
                       param="healing")
    fill = fim_prompt(target, lambda: fim.build(target, prefix, suffix, typed=typed, extra=extra, n_batch=n_batch,
                                                n_predict=n_predict, layout=layout, healing=healing))
    # n_predict 0 (a client's warm-up, to cache the prompt): one token, as llama-server samples one.
    max_tokens = None if n_predict < 0 else max(n_predict, 1)
    settings = RequestSettings(max_tokens=max_tokens, sampling=sampling, seed=seed, stop=[s for s in stop if s],
                               n=n, draft_max=protocol._int(body, "draft_max", 0))
    parsed = ParsedRequest("completion", body.get("model"), [fill.tokens], settings, stream=stream)
    editor = {"n_indent": protocol._int(body, "n_indent", 0, default=0),
              "t_max_predict_ms": float(protocol._int(body, "t_max_predict_ms", -1, default=-1))}
    return InfillRequest(parsed, fill, editor, fields, chain, n_predict)


_STOP_TYPE = {"eog": "eos", "stop": "word", "max_tokens": "limit", "context": "limit", "cancelled": "limit"}


class InfillAnswer(Answer):
    """A job's events as llama-server's native /infill response."""

    def __init__(self, request: InfillRequest, job, model_name: str, target, metrics, clock, n_ctx: int) -> None:
        super().__init__("completion", request.parsed, job, model_name, target, metrics, clock)
        self.req, self.n_ctx = request, n_ctx

    def _object(self, i: int, text: str, result) -> Dict[str, Any]:
        st, c = result.stats, self.job.choices[i] if i < len(self.job.choices) else None
        watch = c.watch if c is not None else None
        stop_type = "limit" if watch is not None and watch.stopped else _STOP_TYPE.get(result.stop_reason, "none")
        if watch is not None:
            text = watch.final(text)
        n_prompt = len(self.req.fill.tokens)
        s = self.req.parsed.settings
        obj = {
            "index": i, "content": text, "tokens": [], "id_slot": c.slot if c else -1,
            "stop": True, "model": self.model, "tokens_predicted": st.n_generated, "tokens_evaluated": n_prompt,
            "generation_settings": {"n_ctx": self.n_ctx, "n_predict": self.req.n_predict,
                                    "temperature": s.sampling.temperature, "top_k": s.sampling.top_k,
                                    "top_p": s.sampling.top_p, "min_p": s.sampling.min_p, "stop": s.stop,
                                    "samplers": [x for x in self.req.samplers if x in llama_fields.APPLIED],
                                    "layout": self.req.fill.layout},
            "prompt": "", "has_new_line": "\n" in text, "truncated": result.stop_reason == "context",
            "stop_type": stop_type, "stopping_word": "", "tokens_cached": n_prompt + st.n_generated,
            "timings": responses.timings([st], n_prompt, st.n_cached_tokens),
        }
        return obj

    def _shaped(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        return llama_fields.pick(obj, self.req.response_fields)

    async def whole(self, request: Request) -> Response:
        texts = [""] * self.n_choices
        results: List[Any] = [None] * self.n_choices
        try:
            async for event in self._events(request, watch=True):
                if event[0] == "delta":
                    texts[event[1]] += event[2]
                else:
                    results[event[1]] = event[2]
        except APIError as e:
            return error_response(e, self.metrics)
        if any(r is None for r in results):
            self.metrics.request_done(499)
            return Response(status_code=499)
        self.metrics.request_done(200)
        objs = [self._shaped(self._object(i, texts[i], r)) for i, r in enumerate(results)]
        return JSONResponse(objs[0] if len(objs) == 1 else objs)

    async def native_stream(self, request: Request) -> AsyncIterator[Dict[str, str]]:
        results: List[Any] = [None] * self.n_choices
        sent = [""] * self.n_choices
        n_prompt = len(self.req.fill.tokens)
        try:
            async for event in self._events(request, watch=False):
                if event[0] == "delta":
                    _, i, text, toks, _lp = event
                    c = self.job.choices[i]
                    if c.watch is not None and c.watch.cut_at is not None:
                        text = c.watch.final(sent[i] + text)[len(sent[i]):]
                    sent[i] += text
                    yield {"data": _compact({"index": i, "content": text, "tokens": list(toks), "stop": False,
                                             "id_slot": c.slot, "tokens_predicted": len(self.out_tokens[i]),
                                             "tokens_evaluated": n_prompt})}
                else:
                    results[event[1]] = event[2]
                    yield {"data": _compact(self._shaped(self._object(event[1], "", event[2])))}
        except APIError as e:
            self.metrics.request_done(e.status)
            yield {"data": _compact(e.body())}
            return
        self.metrics.request_done(200 if all(r is not None for r in results) else 499)


def _compact(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
