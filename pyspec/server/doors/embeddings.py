"""Embeddings in the generating process: OpenAI's ``POST /v1/embeddings``
ollama's ``/api/embed`` and
``/api/embeddings``. Computed by pyspec's core (pyspec/embedding.py) on a
context of their own over the served target (mean pooling, unit vectors, as
llama-server computes them with ``--embeddings --pooling mean``), or over
``pyspec serve --embedding-model FILE``; made on the first request, so that a
server nobody asks for embeddings pays nothing for them. They run on executor
thread of their own (one at a time: a long request does not hold up the
executor the intake compiles grammars on) while the scheduler's generations
run on theirs. Wire shapes:
pyspec/wire/embeddings.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...wire import embeddings as wire
from ..api_error import APIError
from . import Door


class Embeddings(Door):
    def __init__(self, h, embedding_model=None) -> None:
        super().__init__(h)
        self.embedding_model = embedding_model
        self._embedder = None
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="pyspec-embed")

    def routes(self) -> List[Route]:
        return [Route("/v1/embeddings", self.openai, methods=["POST"]),
                Route("/api/embed", self.ollama_embed, methods=["POST"]),
                Route("/api/embeddings", self.ollama_embeddings, methods=["POST"])]

    def embedder(self):
        """The embedder, made on first use (on the embedding thread); a 500
        that says why when llama.cpp cannot make its context."""
        with self._lock:
            if self._embedder is None:
                from ...embedding import Embedder

                try:
                    # Unpacked: a request's vectors are each input's alone, bit for bit (pyspec/embedding.py).
                    self._embedder = Embedder(self.embedding_model or self.target, pack=False)
                except (RuntimeError, ValueError, MemoryError) as e:
                    raise APIError(500, f"cannot make the embedding context: {e}", type="server_error") from None
            return self._embedder

    async def _run(self, work: Callable[[Any], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: work(self.embedder()))

    async def _n_embd(self) -> int:
        return await self._run(lambda e: e.n_embd)

    async def _answer(self, request: Request, parse, embed, error_body=None) -> Response:
        started = time.monotonic_ns()
        try:
            body = await self.body(request)
            parsed = parse(body, await self._n_embd())
            self.h.intake.check_model(getattr(parsed, "model", None))
            out = await self._run(lambda e: embed(e, parsed, started))
        except APIError as e:
            if error_body is None:
                return self.refuse(e)
            self.h.metrics.request_done(e.status)
            return JSONResponse(error_body(e), status_code=e.status)
        self.done()
        return JSONResponse(out)

    async def openai(self, request: Request) -> Response:
        return await self._answer(request, wire.parse_openai,
                                  lambda e, p, _: wire.openai_embeddings(e, p, self.h.model_name))

    async def ollama_embed(self, request: Request) -> Response:
        return await self._answer(request, wire.parse_ollama_embed,
                                  lambda e, p, t: wire.ollama_embed(e, p, self.h.model_name, started_ns=t),
                                  wire.ollama_error)

    async def ollama_embeddings(self, request: Request) -> Response:
        return await self._answer(request, lambda body, _: wire.parse_ollama_embeddings(body),
                                  lambda e, p, _: wire.ollama_embeddings(e, p), wire.ollama_error)
