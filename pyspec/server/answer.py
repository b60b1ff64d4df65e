"""A job's answer: its events (from the scheduler) turned into OpenAI's
response, one JSON body or an SSE stream (``data: {...}`` chunks, then
``data: [DONE]``), with tool calls parsed out of chat answers; a client that
leaves has its job cancelled. Also the HTTP face of every refusal:
:func:`http_error` (the scheduler's errors as statuses) and
:func:`error_response`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Dict, List, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..chat.calls import CallParser, parse_calls
from ..wire import llama_fields
from ..wire import openai as protocol
from . import responses
from .jobs import EngineFailed, Job, JobCancelled, JobRefused, QueueFull, SchedulerError, ShuttingDown
from .metrics import Metrics, RequestClock
from .api_error import APIError
from .responses import FINISH_REASON


def http_error(e: SchedulerError) -> APIError:
    """The HTTP face of the scheduler's refusals: 503 with ``Retry-After`` when
    busy or stopping, 400 for a sequence the engine refused, 499 for a job
    cancelled before it started, 500 for a broken engine."""
    if isinstance(e, QueueFull):
        return APIError(503, str(e), type="server_error", headers={"Retry-After": "1"})
    if isinstance(e, ShuttingDown):
        return APIError(503, str(e), type="server_error", headers={"Retry-After": "5"})
    if isinstance(e, JobRefused):
        return APIError(400, str(e))
    if isinstance(e, JobCancelled):
        return APIError(499, str(e))
    if isinstance(e, EngineFailed):
        return APIError(500, str(e), type="server_error")
    raise TypeError(f"no HTTP status for {type(e).__name__}")


def error_response(e: APIError, metrics: Metrics) -> JSONResponse:
    """A refused request's answer (OpenAI's error object), counted by its status."""
    metrics.request_done(e.status)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class Answer:
    """Turns a job's events into OpenAI's response: whole, or streamed."""

    def __init__(self, kind: str, parsed: protocol.ParsedRequest, job: Job, model_name: str, target,
                 metrics: Metrics, clock: RequestClock, tool_fmt: Optional[str] = None) -> None:
        self.kind, self.parsed, self.job, self.model, self.target = kind, parsed, job, model_name, target
        self.tool_fmt = tool_fmt  # the format tool calls are parsed from (None: no tools)
        self.tool_names = [t["function"]["name"] for t in parsed.tools or []]
        self.metrics, self.clock = metrics, clock
        self.id = responses.new_id(kind)
        self.created = responses.now()
        self.n_choices = len(job.prompts) * parsed.settings.n
        clock.choices(self.n_choices)
        self.n_prompt = sum(len(p) for p in job.prompts)
        self.out_tokens: List[List[int]] = [[] for _ in range(self.n_choices)]  # each choice's, as delivered

    def _piece(self, token: int) -> bytes:
        return self.target.native.token_to_piece(token, False)

    def _logprobs(self, entries, tokens, offset: int = 0):
        if entries is None:
            return None
        if self.kind == "chat":
            return responses.chat_logprobs(entries, tokens, self._piece)
        return responses.completion_logprobs(entries, tokens, self._piece, offset)

    async def _events(self, request: Request, watch: bool) -> AsyncIterator[tuple]:
        async for event in job_events(self.job, request, self.clock, self.n_choices, watch):
            if event[0] == "delta":
                self.out_tokens[event[1]] += event[3]
            yield event

    async def whole(self, request: Request) -> Response:
        metrics = self.metrics
        texts = [""] * self.n_choices
        tokens: List[List[int]] = [[] for _ in range(self.n_choices)]
        lps: List[list] = [[] for _ in range(self.n_choices)]
        results: List[Any] = [None] * self.n_choices
        try:
            async for event in self._events(request, watch=True):
                if event[0] == "delta":
                    _, i, text, toks, lp = event
                    texts[i] += text
                    tokens[i] += toks
                    lps[i] += lp or []
                else:
                    results[event[1]] = event[2]
        except APIError as e:
            return error_response(e, metrics)
        if any(r is None for r in results):  # the client left
            metrics.request_done(499)
            return Response(status_code=499)
        choices = []
        for i, r in enumerate(results):
            lp = self._logprobs(lps[i] if self.parsed.settings.logprobs is not None else None, tokens[i])
            finish = FINISH_REASON[r.stop_reason]
            if self.kind == "chat":
                message: Dict[str, Any] = {"role": "assistant", "content": texts[i]}
                if self.tool_fmt is not None:
                    # The parsed content also without calls: a call cut short is not content.
                    content, calls = parse_calls(self.tool_fmt, texts[i], self.tool_names)
                    message["content"] = content
                    if calls:
                        message = {"role": "assistant", "content": content or None,
                                   "tool_calls": [c.to_openai() for c in calls]}
                        finish = _finish_with_calls(finish)
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
            else:
                choices.append({"index": i, "text": texts[i], "logprobs": lp, "finish_reason": finish})
        metrics.request_done(200)
        return JSONResponse(llama_fields.pick({
            "id": self.id, "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created, "model": self.model, "choices": choices,
            **self._figures(results, sum(len(t) for t in tokens)),
        }, self.parsed.response_fields))

    def _chunk(self, choices: List[Dict[str, Any]], **extra) -> Dict[str, str]:
        obj = {"id": self.id, "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
               "created": self.created, "model": self.model, "choices": choices, **extra}
        return {"data": json.dumps(obj, ensure_ascii=False)}

    async def stream(self, request: Request) -> AsyncIterator[Dict[str, str]]:
        answered = False
        try:
            async for chunk in self._stream(request):
                yield chunk
            answered = True
        finally:
            if not answered:  # the client left (the stream was cancelled)
                self.metrics.request_done(499)

    @staticmethod
    def _tool_deltas(events) -> List[Dict[str, Any]]:
        """Chunks' deltas for a choice's parsed events: content, and each call as
        OpenAI streams it (index, id and name first, then its arguments, as they
        are decoded)."""
        deltas = []
        for kind, value in events:
            if kind == "content":
                deltas.append({"content": value})
                continue
            if kind == "call_args":
                call, text = value
                deltas.append({"tool_calls": [{"index": call.index, "function": {"arguments": text}}]})
                continue
            if kind == "call_start" or not value.streamed:
                deltas.append({"tool_calls": [{"index": value.index, "id": value.id, "type": "function",
                                               "function": {"name": value.name, "arguments": ""}}]})
            rest = value.arguments[value.streamed:] if kind == "call" else ""
            if rest:
                deltas.append({"tool_calls": [{"index": value.index, "function": {"arguments": rest}}]})
        return deltas

    async def _stream(self, request: Request) -> AsyncIterator[Dict[str, str]]:
        n_out = 0
        results: List[Any] = [None] * self.n_choices
        offsets = [0] * self.n_choices
        parsers = ([CallParser(self.tool_fmt, self.tool_names, stream_arguments=True) for _ in range(self.n_choices)]
                   if self.tool_fmt else None)
        try:
            if self.kind == "chat":  # OpenAI's first chunk of each choice names the role
                yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None} for i in range(self.n_choices)])
            async for event in self._events(request, watch=False):
                if event[0] == "delta":
                    _, i, text, toks, lp = event
                    n_out += len(toks)
                    lp_obj = self._logprobs(lp, toks, offsets[i])
                    offsets[i] += len(text)
                    if parsers is not None:
                        deltas = self._tool_deltas(parsers[i].feed(text))
                        for d in deltas or ([{}] if lp_obj is not None else []):
                            yield self._chunk([{"index": i, "delta": d, "logprobs": lp_obj, "finish_reason": None}])
                            lp_obj = None
                        continue
                    body = ({"delta": {"content": text}} if self.kind == "chat" else {"text": text})
                    yield self._chunk([{"index": i, **body, "logprobs": lp_obj, "finish_reason": None}])
                else:
                    _, i, r, _seed = event
                    results[i] = r
                    finish = FINISH_REASON[r.stop_reason]
                    if parsers is not None:
                        for d in self._tool_deltas(parsers[i].finish()):
                            yield self._chunk([{"index": i, "delta": d, "logprobs": None, "finish_reason": None}])
                        if parsers[i].n_calls:
                            finish = _finish_with_calls(finish)
                    body = {"delta": {}} if self.kind == "chat" else {"text": ""}
                    last = all(x is not None for x in results)
                    # The last choice's final chunk carries the figures, as llama.cpp's server does.
                    extra = {} if not last else self._figures(results, n_out)
                    yield self._chunk([{"index": i, **body, "logprobs": None, "finish_reason": finish}], **extra)
        except APIError as e:
            self.metrics.request_done(e.status)
            yield {"data": json.dumps(e.body())}
            return
        if any(r is None for r in results):
            raise asyncio.CancelledError  # the client left: counted by stream()
        self.metrics.request_done(200)
        if self.parsed.include_usage:  # OpenAI's own usage chunk: no choices
            yield self._chunk([], **self._figures(results, n_out))
        yield {"data": "[DONE]"}

    def _figures(self, results, n_out: int) -> Dict[str, Any]:
        # A prompt's tokens count once (its n samples share them): its first choice's cached share.
        n = self.parsed.settings.n
        firsts = [results[p * n].stats for p in range(len(self.job.prompts))]
        cached = sum(s.n_cached_tokens for s in firsts)
        usage = responses.usage(self.n_prompt, n_out, cached)
        if self.job.prediction is not None:
            usage["completion_tokens_details"] = responses.prediction_details(self.job.prediction, self.out_tokens)
        return {"usage": usage, "timings": responses.timings([r.stats for r in results], self.n_prompt, cached,
                                                             sum(s.n_prompt_decoded for s in firsts))}


async def job_events(job: Job, request: Request, clock: RequestClock, n_choices: int,
                     watch: bool) -> AsyncIterator[tuple]:
    """A job's events until each of its ``n_choices`` is done; cancels it if the
    client leaves. Times the tokens as they come (the latency histograms of
    /metrics). ``watch``: look for a departed client also while tokens flow (a
    whole answer's client sees nothing until the end, and may leave); a
    stream's departure ends its response, which cancels the job, and polling a
    stream would also end it early while the server shuts down gracefully."""
    remaining = n_choices
    next_check = time.monotonic() + 0.5
    try:
        while remaining:
            try:
                event = await asyncio.wait_for(job.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                event = None
            if event is None or (watch and time.monotonic() >= next_check):
                next_check = time.monotonic() + 0.5
                if await request.is_disconnected():
                    return
            if event is None:
                continue
            if event[0] == "delta":
                clock.tokens(event[1], len(event[3]))
            elif event[0] == "done":
                remaining -= 1
                if not remaining:
                    clock.finished(job.admitted)
            elif event[0] == "error":
                raise http_error(event[1])
            yield event
    finally:
        if remaining:
            job.cancel("left")


def _finish_with_calls(finish: str) -> str:
    """OpenAI's finish_reason for an answer that made calls: "tool_calls", unless
    it was cut short ("length")."""
    return "tool_calls" if finish == "stop" else finish
