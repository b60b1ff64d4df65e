"""The server's doors besides OpenAI's own routes (app.py): each dialect's
routes in a module of its own, over one path to the scheduler.

- :mod:`.anthropic`: Anthropic's Messages API (Claude Code);
- :mod:`.responses`: OpenAI's Responses API (Codex CLI, the Agents SDK), with
  stored responses for ``previous_response_id``;
- :mod:`.ollama`: ollama's ``/api/*`` (Copilot, Zed, Continue, Open WebUI);
- :mod:`.llama_server`: llama-server's own routes (``/completion``,
  ``/tokenize``, ``/props`` ...);
- :mod:`.embeddings`: OpenAI's and ollama's embeddings, in the generating process.

A dialect's request is read by its adapter in pyspec/wire/ into OpenAI's chat
or completion body, which goes through the one intake (:meth:`Door.start`); the
answer comes back as a :class:`~pyspec.server.turn.Turn`'s parts, which the
dialect writes in its own shape.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Tuple, Union

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..answer import http_error
from ..api_error import APIError
from ..intake import authorized, prompt_tokens, read_body, same_key
from ..jobs import Job, SchedulerError
from ..newest import editor_like
from ..turn import Turn

ErrorBody = Callable[[APIError], Dict[str, Any]]


def renamed(e: APIError, params: Mapping[str, str]) -> APIError:
    """``e`` with its parameter called by the dialect's name (the common parse
    names OpenAI's fields)."""
    name = params.get(e.param or "")
    if name is None:
        return e
    message = e.message.replace(f"'{e.param}'", f"'{name}'")
    return APIError(e.status, message, param=name, type=e.type, code=e.code, headers=e.headers)


class Door:
    """What every dialect's handlers share: the server's handlers (``h``: its
    intake, scheduler, metrics and key), and the dialect's error shape."""

    error_body: ErrorBody = staticmethod(lambda e: e.body())

    def __init__(self, h) -> None:
        self.h = h

    @property
    def target(self):
        return self.h.target

    def refuse(self, e: APIError) -> JSONResponse:
        self.h.metrics.request_done(e.status)
        return JSONResponse(self.error_body(e), status_code=e.status, headers=e.headers)

    def check_key(self, request: Request) -> None:
        """The API key, as ``Authorization: Bearer`` or as Anthropic's and
        ollama's clients send it (``x-api-key``)."""
        key = self.h.api_key
        if key is None or authorized(request, key):
            return
        if same_key(request.headers.get("x-api-key", ""), key):
            return
        raise APIError(401, "a valid API key is required (Authorization: Bearer ... or x-api-key)",
                       type="authentication_error", code="invalid_api_key")

    async def body(self, request: Request) -> Any:
        self.check_key(request)
        return await read_body(request)

    async def start(self, request: Request, body: Dict[str, Any], kind: str, params: Mapping[str, str],
                    endpoint: str, user: str = "") -> Tuple[Any, Turn]:
        """Submit an OpenAI body (``kind`` "chat" or "completion") of one prompt
        and one answer, from ``request``'s client: its parsed form and the
        :class:`Turn` that reads it. Errors name the dialect's fields (``params``)."""
        h = self.h
        clock = h.metrics.clock()
        try:
            parsed, requests = await h.intake.of_body(body, kind)
        except APIError as e:
            raise renamed(e, params) from None
        job = Job(requests, asyncio.get_running_loop(), user=user or parsed.user or "",
                  warm_up=parsed.settings.max_tokens == 0)
        try:
            h.submit(job, request, fim=editor_like(parsed, request))
        except SchedulerError as e:
            raise http_error(e) from None
        h.metrics.request_started(endpoint)
        names = [t["function"]["name"] for t in parsed.tools or []]
        turn = Turn(job, target=h.target, metrics=h.metrics, clock=clock, tool_format=parsed.tool_format,
                    tool_names=names, stops=parsed.settings.stop)
        return parsed, turn

    async def whole(self, turn: Turn, request: Request) -> Union[Tuple[str, List[Any], Any], Response]:
        """A whole answer's (text, calls, end), or the response that ends the
        request instead: its refusal, or a 499 for a client that left."""
        try:
            whole = await turn.whole(request)
        except APIError as e:
            return self.refuse(e)
        if whole is None:
            self.done(499)
            return left()
        return whole

    def prompt(self, chat: Dict[str, Any], params: Mapping[str, str]) -> List[int]:
        """A chat body's prompt tokens, exactly as a generation request's
        (count_tokens, input_tokens, /apply-template)."""
        try:
            parsed = self.h.intake.parse(chat, "chat")
            return prompt_tokens(self.target, "chat", parsed.prompts[0], parsed)
        except APIError as e:
            raise renamed(e, params) from None

    def done(self, status: int = 200) -> None:
        self.h.metrics.request_done(status)

    def answered(self, obj: Any) -> JSONResponse:
        """A POST route's answer, counted as a 200 (its refusals are counted by :meth:`refuse`)."""
        out = JSONResponse(obj)
        self.done()
        return out

    async def counted(self, chunks: AsyncIterator[Any], turn: Turn,
                      error: Optional[Callable[[APIError], Any]] = None) -> AsyncIterator[Any]:
        """A stream's chunks, its outcome counted: 200 once ``turn`` ended, 499
        when the client left (the stream is cancelled, or the turn noticed it
        first), the status of an error it ends with, which ``error`` (default:
        :meth:`stream_error`) writes as its last chunk."""
        outcome = 499
        try:
            async for chunk in chunks:
                yield chunk
            outcome = 200 if turn.ended else 499
        except APIError as e:
            outcome = e.status
            yield (error or self.stream_error)(e)
        finally:
            self.done(outcome)

    def stream_error(self, e: APIError) -> Any:
        return {"data": json.dumps(self.error_body(e))}


def ndjson(chunks: AsyncIterator[Dict[str, Any]]) -> StreamingResponse:
    """A stream of JSON lines (ollama's)."""
    async def lines():
        async for chunk in chunks:
            yield json.dumps(chunk, ensure_ascii=False) + "\n"
    return StreamingResponse(lines(), media_type="application/x-ndjson")


def sse_event(kind: Optional[str], data: Any) -> Dict[str, str]:
    """One server-sent event (``kind``: its ``event:`` line, None for none)."""
    out = {"data": json.dumps(data, ensure_ascii=False)}
    if kind is not None:
        out["event"] = kind
    return out


def left() -> Response:
    """The answer to a client that left before its whole answer was ready."""
    return Response(status_code=499)


def routes(h, embedding_model=None) -> list:
    """Every door's routes over the server's handlers ``h`` (embeddings from
    ``embedding_model``, a Model; None: the target)."""
    from .anthropic import Messages
    from .embeddings import Embeddings
    from .llama_server import LlamaServer
    from .ollama import Ollama
    from .responses import Responses

    return [*Messages(h).routes(), *Responses(h).routes(), *Ollama(h).routes(), *LlamaServer(h).routes(),
            *Embeddings(h, embedding_model).routes()]
