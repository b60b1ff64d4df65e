"""The HTTP face of the server (Starlette): OpenAI's routes over the scheduler.

:func:`create_app` puts the rooms together and holds the routes table; the
handlers (:class:`Handlers`) check a request (intake.py: the API key, the
body, the wire format of pyspec/wire/, the prompts' tokens, the constraint),
hand it to the :class:`~.scheduler.Scheduler` as a :class:`~.jobs.Job` and
answer from its events (answer.py: one JSON response or an SSE stream). A
client that disconnects has its sequences cancelled, and so has an editor's
``/infill`` once the same client sends a newer one (newest.py); every refusal is
OpenAI's error object with a 4xx (503 with ``Retry-After`` when the queue is
full), never a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import asynccontextmanager
from typing import Optional

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from ..memory import DEFAULT_CAP_MB
from ..settings import PARALLEL, PREFILL_CHUNK
from ..testing import TestControls, controls
from .answer import Answer, error_response, http_error
from ..wire import llama_server
from . import doors, infill
from .intake import Intake, authorized, read_body
from .jobs import Job, SchedulerError
from .metrics import Metrics
from .newest import NewestWins, client_of, editor_like
from .warm_ups import WarmUps
from .api_error import APIError
from .scheduler import DEFAULT_CACHE_RAM_MB, MAX_DRAFT, Scheduler
from .users import UserMemories


def create_app(decoder, *, model_name: str, parallel: int = PARALLEL, queue_size: int = 4 * PARALLEL,
               api_key: Optional[str] = None, prefill_chunk: int = PREFILL_CHUNK, memory_mb: float = DEFAULT_CAP_MB,
               memory_users: int = 8, cache_ram_mb: float = DEFAULT_CACHE_RAM_MB, cache_dir: Optional[str] = None,
               strict_model_name: bool = False, embedding_model=None,
               _test: Optional[TestControls] = None) -> Starlette:
    """An ASGI app serving ``decoder`` (a Model or SpeculativeDecoder whose
    target, and draft model, hold at least ``parallel`` sequences: more keep
    more conversations cached) under ``model_name``. Caches the context gives
    up are kept in host memory up to ``cache_ram_mb`` (0: none), and with
    ``cache_dir`` saved there at shutdown and loaded at startup.
    ``_test``: TEST-ONLY controls (:class:`pyspec.testing.TestControls`: the
    lossless and prompt-cache tests' negative controls, the PIT probe).
    Memory for suffix drafting is kept per user (``memory_mb`` each, for up to
    ``memory_users`` users; 0 MB: none; server/users.py). A request naming
    another model is answered by this one (its answer names ``model_name``),
    unless ``strict_model_name``: then it is a 404. Embeddings come from
    ``embedding_model`` (a Model; None: the target, server/doors/embeddings.py)."""
    from ..speculative import DRAFTERS, POLICIES

    _test = controls(_test)  # a wrong kind fails here, not when the server starts
    policies = list(POLICIES) if decoder.speculative else []
    drafters = [d for d in DRAFTERS if not DRAFTERS[d]["needs_draft_model"] or getattr(decoder, "draft", None)]
    drafters = drafters if decoder.speculative else []
    intake = Intake(decoder, model_name=model_name, parallel=parallel, policies=policies, drafters=drafters,
                    max_draft=MAX_DRAFT, strict_model_name=strict_model_name)
    h = Handlers(decoder.target, model_name=model_name, parallel=parallel, api_key=api_key, intake=intake)
    memories = UserMemories(memory_mb if decoder.speculative else 0, memory_users)

    @asynccontextmanager
    async def lifespan(app):
        h.scheduler = Scheduler(decoder, parallel=parallel, queue_size=queue_size, prefill_chunk=prefill_chunk,
                                cache_ram_mb=cache_ram_mb, cache_dir=cache_dir, memories=memories.get,
                                _test=_test)
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, h.scheduler.stop)

    routes = [
        Route("/v1/completions", h.completions, methods=["POST"]),
        Route("/infill", h.infill, methods=["POST"]),
        Route("/v1/chat/completions", h.chat, methods=["POST"]),
        Route("/v1/models", h.models, methods=["GET"]),
        Route("/health", h.health, methods=["GET"]),
        Route("/v1/health", h.health, methods=["GET"]),
        Route("/metrics", h.metrics_route, methods=["GET"]),
        *doors.routes(h, embedding_model),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: not_found, 405: not_found, Exception: crashed})
    app.state.shutdown = h.shutdown
    return app


class Handlers:
    """The routes' handlers over one server's state: the scheduler (set once the
    app has started), the metrics, and the intake that checks requests."""

    def __init__(self, target, *, model_name: str, parallel: int, api_key: Optional[str], intake: Intake) -> None:
        self.target, self.model_name, self.parallel, self.api_key = target, model_name, parallel, api_key
        self.intake = intake
        self.scheduler: Optional[Scheduler] = None
        self.editors = NewestWins()  # fill-in-the-middle: a client's newest request wins
        self.warm_ups = WarmUps()    # /infill: a ring update also prefills the next suggestion's text
        self.metrics = Metrics(lambda: self.scheduler, model_name=model_name, n_ctx=target.n_ctx)
        self.created = int(time.time())

    def shutdown(self) -> None:
        """Refuse new requests; end the running ones at the next round (app.state.shutdown)."""
        if self.scheduler is not None:
            self.scheduler.shutdown()

    def submit(self, job: Job, request: Request, fim: bool) -> None:
        """Queue a job. An editor's (``fim``: /infill, or newest.editor_like)
        first cancels the same client's older ones (newest.py), before the
        queue counts them; its own prompt then goes in in chunks, so that the
        next one's cancel frees the engine within one (SequenceSpec::chunked)."""
        if fim:
            self.editors.claim(client_of(request), job, warm_up=job.warm_up)
            job.supersedable = True
        try:
            self.scheduler.submit(job)
        except SchedulerError:
            job.ended = True  # refused: never live
            raise

    def error(self, e: APIError) -> JSONResponse:
        return error_response(e, self.metrics)

    async def generate(self, request: Request, kind: str) -> Response:
        clock = self.metrics.clock()  # the request's arrival
        if not authorized(request, self.api_key):
            return self.error(APIError(401, "a valid API key is required (Authorization: Bearer ...)",
                                       type="authentication_error", code="invalid_api_key"))
        try:
            parsed, requests = await self.intake.read(request, kind)
            job = Job(requests, asyncio.get_running_loop(), user=parsed.user or "",
                      warm_up=parsed.settings.max_tokens == 0)
            self.submit(job, request, fim=editor_like(parsed, request))
        except SchedulerError as e:
            return self.error(http_error(e))
        except APIError as e:
            return self.error(e)
        self.metrics.request_started(kind)
        answer = Answer(kind, parsed, job, self.model_name, self.target, self.metrics, clock, parsed.tool_format)
        if parsed.stream:
            return EventSourceResponse(answer.stream(request), ping=15, sep="\n")
        return await answer.whole(request)

    async def infill(self, request: Request) -> Response:
        """llama-server's /infill (its body: wire/llama_server.py; its answer: server/infill.py)."""
        clock = self.metrics.clock()
        if not authorized(request, self.api_key):
            return self.error(APIError(401, "a valid API key is required (Authorization: Bearer ...)",
                                       type="authentication_error", code="invalid_api_key"))
        client = client_of(request)
        try:
            req = llama_server.parse(await read_body(request), self.target, max_n=self.parallel,
                                     n_batch=self.target.native.n_batch, max_draft=self.intake.max_draft)
            self.intake.check_model(req.parsed.model)
            fill, prepare = self.warm_ups.plan(client, req.source, req.fill, lambda s: s.prompt(self.target))
            if fill is not req.fill:  # served with the chunks already cached (warm_ups.py)
                req = dataclasses.replace(req, fill=fill, parsed=dataclasses.replace(req.parsed, prompts=[fill.tokens]))
            job = Job([self.intake.request(req.parsed.settings, req.fill.tokens, req.fill)],
                      asyncio.get_running_loop(), editor=req.editor, warm_up=req.warm_up)
            self.submit(job, request, fim=True)
        except SchedulerError as e:
            return self.error(http_error(e))
        except APIError as e:
            return self.error(e)
        if prepare is not None:
            self.prepare(client, prepare, req)
        self.metrics.request_started("infill")
        answer = infill.InfillAnswer(req, job, self.model_name, self.target, self.metrics, clock, self.target.n_ctx)
        if req.parsed.stream:
            return EventSourceResponse(answer.native_stream(request), ping=15, sep="\n")
        return await answer.whole(request)

    def prepare(self, client, source: llama_server.InfillSource, req: llama_server.InfillRequest) -> None:
        """Prefill ``source``'s prompt for ``client`` (warm_ups.py): a warm-up
        with no answer, cancelled with the client's warm-ups."""
        if self.scheduler.queue_depth >= self.scheduler.queue_size:
            return  # only a cache's gain is lost
        try:
            fill = dataclasses.replace(source, healing=False).prompt(self.target)
            settings = dataclasses.replace(req.parsed.settings, max_tokens=0, n=1)
            job = Job([self.intake.request(settings, fill.tokens, fill)], asyncio.get_running_loop(), warm_up=True,
                      supersedable=True)
            self.editors.join(client, job)
            self.scheduler.submit(job)
        except (APIError, SchedulerError):
            return  # likewise: the queue filled up, or the text no longer fits
        self.warm_ups.preparing(client, job, source, fill.tokens)

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, "completion")

    async def chat(self, request: Request) -> Response:
        return await self.generate(request, "chat")

    async def models(self, request: Request) -> Response:
        if not authorized(request, self.api_key):
            return self.error(APIError(401, "a valid API key is required", type="authentication_error"))
        target = self.target
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "pyspec",
             "meta": {"n_ctx": target.n_ctx, "n_vocab": target.n_vocab, "parallel": self.parallel}}]})

    async def health(self, request: Request) -> Response:
        s = self.scheduler
        if s is None or s.error is not None:
            return JSONResponse({"status": "error", "error": str(s.error) if s else "starting"}, status_code=503)
        running, cached = s.kv_cells
        ram = s.host_cache.stats if s.host_cache is not None else {}
        return JSONResponse({"status": "ok", "version": __version__, "slots_total": self.parallel,
                             "slots_busy": s.busy_slots, "queue_depth": s.queue_depth,
                             "kv_cells_running": running, "kv_cells_cached": cached,
                             "conversations_cached": s.conversations_cached,
                             "cache_ram_bytes": ram.get("bytes", 0), "cache_ram_capacity_bytes": ram.get("capacity", 0),
                             "cache_ram_entries": ram.get("entries", 0)})

    async def metrics_route(self, request: Request) -> Response:
        body, content_type = self.metrics.render()
        return PlainTextResponse(body, media_type=content_type)


async def not_found(request: Request, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    return JSONResponse(APIError(status, f"{request.method} {request.url.path}: "
                                         f"{'no such route' if status == 404 else 'not allowed'}").body(),
                        status_code=status)


async def crashed(request: Request, exc: Exception) -> Response:
    return JSONResponse(APIError(500, f"internal error: {exc}", type="server_error").body(), status_code=500)
