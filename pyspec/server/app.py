"""The HTTP face of the server (Starlette): OpenAI's routes over the scheduler.

Handlers parse and validate a request (:mod:`.protocol`), tokenize it, hand it
to the :class:`~.scheduler.Scheduler` and turn its events into one JSON response
or an SSE stream (``data: {...}`` chunks, then ``data: [DONE]``). A client that
disconnects has its sequences cancelled; every refusal is OpenAI's error object
with a 4xx (503 with ``Retry-After`` when the queue is full), never a 500 for
bad input.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, List, Optional

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from ..chat.tools import CallParser, parse_calls
from ..errors import ConstraintError
from ..memory import DEFAULT_CAP_MB
from ..settings import PARALLEL, PREFILL_CHUNK
from . import protocol
from .memories import UserMemories
from .metrics import Metrics, RequestClock
from .protocol import FINISH_REASON, APIError
from .scheduler import (DEFAULT_CACHE_RAM_MB, MAX_DRAFT, EngineFailed, Job, JobCancelled, JobRefused, QueueFull,
                        Scheduler, SchedulerError, ShuttingDown)

#: Largest request body accepted (a prompt of a few hundred thousand characters).
MAX_BODY_BYTES = 4 << 20


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


def create_app(decoder, *, model_name: str, parallel: int = PARALLEL, queue_size: int = 4 * PARALLEL,
               api_key: Optional[str] = None, prefill_chunk: int = PREFILL_CHUNK, memory_mb: float = DEFAULT_CAP_MB,
               memory_users: int = 8, cache_ram_mb: float = DEFAULT_CACHE_RAM_MB, prompt_cache_dir: Optional[str] = None,
               _test=None, _slot_choice: str = "engine") -> Starlette:
    """An ASGI app serving ``decoder`` (a Model or SpeculativeDecoder whose
    target, and draft model, hold at least ``parallel`` sequences: more keep
    more conversations cached) under ``model_name``. Caches the context gives
    up are kept in host memory up to ``cache_ram_mb`` (0: none), and with
    ``prompt_cache_dir`` saved there at shutdown and loaded at startup.
    ``_test`` holds TEST-ONLY negative controls (a wrong acceptance rule the
    lossless test must catch; :func:`pyspec.generation.test_controls`).
    Memory for suffix drafting is kept per user (``memory_mb`` each, for up to
    ``memory_users`` users; 0 MB: none; server/memories.py)."""
    from ..speculative import DRAFTERS, POLICIES

    state: Dict[str, Any] = {}
    target = decoder.target
    metrics = Metrics(lambda: state.get("scheduler"), model_name=model_name, n_ctx=target.n_ctx)
    policies = list(POLICIES) if decoder.speculative else []
    drafters = [d for d in DRAFTERS if not DRAFTERS[d]["needs_draft_model"] or getattr(decoder, "draft", None)]
    drafters = drafters if decoder.speculative else []
    created = int(time.time())
    memories = UserMemories(memory_mb if decoder.speculative else 0, memory_users)

    @asynccontextmanager
    async def lifespan(app):
        state["scheduler"] = Scheduler(decoder, parallel=parallel, queue_size=queue_size,
                                       prefill_chunk=prefill_chunk, cache_ram_mb=cache_ram_mb,
                                       prompt_cache_dir=prompt_cache_dir,
                                       memories=memories.get, _test=_test, _slot_choice=_slot_choice)
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, state["scheduler"].stop)

    def error(e: APIError) -> JSONResponse:
        metrics.request_done(e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    def authorized(request: Request) -> bool:
        if api_key is None:
            return True
        given = request.headers.get("authorization", "")
        return given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), api_key)

    async def read_body(request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        raw = b""
        try:
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > MAX_BODY_BYTES:
                    raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        except ClientDisconnect:  # gone before its body arrived: counted as a client that left
            raise APIError(499, "the client left before its request body arrived") from None
        try:
            body = json.loads(raw)
        except ValueError as e:  # UnicodeDecodeError (not UTF-8) is one
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise APIError(400, "the request body is nested too deeply") from None
        return protocol.unicode_checked(body)

    def tokens_of(kind: str, prompt, parsed) -> List[int]:
        try:
            if kind == "chat":
                ids = target.prompt_tokens(prompt, tools=parsed.tools, variables=parsed.template_vars)
            elif isinstance(prompt, str):
                ids = target.tokenize(prompt, add_special=True, parse_special=True)
            else:
                ids = list(prompt)
                bad = [t for t in ids if not 0 <= t < target.n_vocab]
                if bad:
                    raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{target.n_vocab - 1})",
                                   param="prompt")
        except (ValueError, RuntimeError) as e:
            raise APIError(400, f"cannot build the prompt: {e}",
                           param="messages" if kind == "chat" else "prompt") from None
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        if len(ids) >= target.n_ctx:
            raise APIError(400, f"This model's maximum context length is {target.n_ctx} tokens; the prompt has "
                                f"{len(ids)} (pyspec serve --n-ctx)", param="messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded")
        return ids

    async def compile_constraint(parsed) -> None:
        """Compile the request's one constraint (protocol.parse decided it): a
        400 naming the field when it does not compile."""
        s = parsed.settings
        if s.constraint is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, target.grammars.compile, s.constraint)
            except ConstraintError as e:
                raise APIError(400, f"'{s.constraint_param}': {e}", param=s.constraint_param) from None

    async def generate(request: Request, kind: str) -> Response:
        clock = metrics.clock()  # the request's arrival
        if not authorized(request):
            return error(APIError(401, "a valid API key is required (Authorization: Bearer ...)",
                                  type="authentication_error", code="invalid_api_key"))
        try:
            body = await read_body(request)
            parsed = protocol.parse(kind, body, max_n=parallel, policies=policies, drafters=drafters,
                                    max_draft=MAX_DRAFT, template=target.chat_template.source)
            if parsed.model not in (None, model_name):
                raise APIError(404, f"the model '{parsed.model}' does not exist (this server has '{model_name}')",
                               param="model", code="model_not_found")
            await compile_constraint(parsed)
            prompts = [tokens_of(kind, p, parsed) for p in parsed.prompts]
            job = Job(parsed.settings, prompts, asyncio.get_running_loop(), user=parsed.user or "")
            state["scheduler"].submit(job)
        except SchedulerError as e:
            return error(http_error(e))
        except APIError as e:
            return error(e)
        metrics.request_started(kind)
        answer = Answer(kind, parsed, job, model_name, target, metrics, clock, parsed.tool_format)
        if parsed.stream:
            return EventSourceResponse(answer.stream(request), ping=15, sep="\n")
        return await answer.whole(request)

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def models(request: Request) -> Response:
        if not authorized(request):
            return error(APIError(401, "a valid API key is required", type="authentication_error"))
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "pyspec",
             "meta": {"n_ctx": target.n_ctx, "n_vocab": target.n_vocab, "parallel": parallel}}]})

    async def health(request: Request) -> Response:
        s = state.get("scheduler")
        if s is None or s.error is not None:
            return JSONResponse({"status": "error", "error": str(s.error) if s else "starting"}, status_code=503)
        running, cached = s.kv_cells
        ram = s.prompt_cache.stats if s.prompt_cache is not None else {}
        return JSONResponse({"status": "ok", "version": __version__, "slots_total": parallel,
                             "slots_busy": s.busy_slots, "queue_depth": s.queue_depth,
                             "kv_cells_running": running, "kv_cells_cached": cached,
                             "conversations_cached": s.conversations_cached,
                             "cache_ram_bytes": ram.get("bytes", 0), "cache_ram_capacity_bytes": ram.get("capacity", 0),
                             "cache_ram_entries": ram.get("entries", 0)})

    async def metrics_route(request: Request) -> Response:
        body, content_type = metrics.render()
        return PlainTextResponse(body, media_type=content_type)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse(APIError(status, f"{request.method} {request.url.path}: "
                                             f"{'no such route' if status == 404 else 'not allowed'}").body(),
                            status_code=status)

    async def crashed(request: Request, exc: Exception) -> Response:
        return JSONResponse(APIError(500, f"internal error: {exc}", type="server_error").body(), status_code=500)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: not_found, Exception: crashed})
    app.state.shutdown = lambda: state["scheduler"].shutdown() if "scheduler" in state else None
    return app


class Answer:
    """Turns a job's events into OpenAI's response: whole, or streamed."""

    def __init__(self, kind: str, parsed: protocol.ParsedRequest, job: Job, model_name: str, target,
                 metrics: Metrics, clock: RequestClock, tool_fmt: Optional[str] = None) -> None:
        self.kind, self.parsed, self.job, self.model, self.target = kind, parsed, job, model_name, target
        self.tool_fmt = tool_fmt  # the format tool calls are parsed from (None: no tools)
        self.tool_names = [t["function"]["name"] for t in parsed.tools or []]
        self.metrics, self.clock = metrics, clock
        self.id = protocol.new_id(kind)
        self.created = protocol.now()
        self.n_choices = len(job.prompts) * parsed.settings.n
        clock.choices(self.n_choices)
        self.n_prompt = sum(len(p) for p in job.prompts)

    def _piece(self, token: int) -> bytes:
        return self.target.native.token_to_piece(token, False)

    def _logprobs(self, entries, tokens, offset: int = 0):
        if entries is None:
            return None
        if self.kind == "chat":
            return protocol.chat_logprobs(entries, tokens, self._piece)
        return protocol.completion_logprobs(entries, tokens, self._piece, offset)

    async def _events(self, request: Request, watch: bool) -> AsyncIterator[tuple]:
        """The job's events until every choice is done; cancels it if the client leaves.
        Times the tokens as they come (the latency histograms of /metrics).
        ``watch``: look for a departed client also while tokens flow (a whole
        answer's client sees nothing until the end, and may leave); a stream's
        departure ends its response, which cancels the job, and polling a stream
        would also end it early while the server shuts down gracefully."""
        remaining = self.n_choices
        next_check = time.monotonic() + 0.5
        try:
            while remaining:
                try:
                    event = await asyncio.wait_for(self.job.events.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    event = None
                if event is None or (watch and time.monotonic() >= next_check):
                    next_check = time.monotonic() + 0.5
                    if await request.is_disconnected():
                        return
                if event is None:
                    continue
                if event[0] == "delta":
                    self.clock.tokens(event[1], len(event[3]))
                elif event[0] == "done":
                    remaining -= 1
                    if not remaining:
                        self.clock.finished(self.job.admitted)
                elif event[0] == "error":
                    raise http_error(event[1])
                yield event
        finally:
            if remaining:
                self.job.cancel()

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
            metrics.request_done(e.status)
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
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
        return JSONResponse({
            "id": self.id, "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created, "model": self.model, "choices": choices,
            **self._figures(results, sum(len(t) for t in tokens)),
        })

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
        OpenAI streams it (index, id and name first, then its arguments)."""
        deltas = []
        for kind, value in events:
            if kind == "content":
                deltas.append({"content": value})
                continue
            deltas.append({"tool_calls": [{"index": value.index, "id": value.id, "type": "function",
                                           "function": {"name": value.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": value.index, "function": {"arguments": value.arguments}}]})
        return deltas

    async def _stream(self, request: Request) -> AsyncIterator[Dict[str, str]]:
        n_out = 0
        results: List[Any] = [None] * self.n_choices
        offsets = [0] * self.n_choices
        parsers = ([CallParser(self.tool_fmt, self.tool_names) for _ in range(self.n_choices)] if self.tool_fmt
                   else None)
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
                        # Calls come out whole, however many tokens a round emitted.
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
        cached = sum(results[p * n].stats.n_cached_tokens for p in range(len(self.job.prompts)))
        return {"usage": protocol.usage(self.n_prompt, n_out, cached),
                "timings": protocol.timings([r.stats for r in results], self.n_prompt, cached)}


def _finish_with_calls(finish: str) -> str:
    """OpenAI's finish_reason for an answer that made calls: "tool_calls", unless
    it was cut short ("length")."""
    return "tool_calls" if finish == "stop" else finish
