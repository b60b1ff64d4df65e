"""``POST /infill``: code completion for editors, as llama.cpp's llama-server
serves it to llama.vim and llama.vscode (docs/editor.md).

The body (pyspec/wire/llama_server.py's ``parse``): ``input_prefix``, ``input_suffix``, ``prompt`` (the
typed part of the cursor line), ``input_extra`` (other files' chunks), the
sampling fields with their ``samplers`` chain, ``n_predict``, ``n_indent``,
``t_max_predict_ms``, ``stop``, ``n_cmpl``, ``stream``, ``response_fields``;
``layout`` (pyspec's: ``"still"``, the default, or ``"llama-server"``:
fim.py) picks the prompt's layout, and ``healing`` (pyspec's, a boolean:
default on, fim.heal) whether a half-typed last word is healed. Fields that only tune llama-server
(``cache_prompt``, ``id_slot``, ``t_max_prompt_ms``, ``samplers`` names that
are off at their defaults ...) are accepted; one that would change the answer
and that pyspec does not implement is a 400 naming it.

The ``infill`` sampler is applied as llama.cpp's (cpp/core/infill.h; it
needs top_k in 1..256). A chain without ``temperature`` samples at
temperature 1, as llama-server's does (its chain ends in a draw at the
logits' scale).

The answer (:class:`InfillAnswer`) is llama-server's native object on one line
(``"content":"..."``: llama.vim reads it with a pattern that allows no space),
an array of them for ``n_cmpl`` > 1, or an SSE stream of ``data: {...}``
chunks ending with the whole object (no ``[DONE]``), with ``response_fields``
picking flat ``"a/b"`` keys out of it.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..wire import llama_fields
from ..wire.llama_server import InfillRequest
from ..wire.openai import APIError
from . import responses
from .answer import Answer, error_response

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
            "timings": responses.timings([st], n_prompt, st.n_cached_tokens, st.n_prompt_decoded),
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
