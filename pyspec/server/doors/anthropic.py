"""Anthropic's Messages API: ``POST /v1/messages`` (whole or streamed) and
``POST /v1/messages/count_tokens`` (the prompt's tokens, counted by the same
rendering the answer's prompt takes). Shapes: pyspec/wire/anthropic.py."""

from __future__ import annotations

from typing import List

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...wire import anthropic as wire
from ..api_error import APIError
from . import Door, sse_event


class Messages(Door):
    error_body = staticmethod(wire.error_body)

    def routes(self) -> List[Route]:
        return [Route("/v1/messages", self.create, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])]

    def stream_error(self, e: APIError):
        return sse_event("error", wire.error_body(e))

    async def create(self, request: Request) -> Response:
        try:
            chat = wire.to_chat(await self.body(request))
            parsed, turn = await self.start(request, chat, "chat", wire.PARAMS, "messages")
        except APIError as e:
            return self.refuse(e)
        model, msg_id = self.h.model_name, wire.new_id()
        if parsed.stream:
            return EventSourceResponse(self.counted(self._events(request, turn, model, msg_id), turn), ping=15,
                                       sep="\n")
        whole = await self.whole(turn, request)
        if isinstance(whole, Response):
            return whole
        text, calls, end = whole
        self.done()
        return JSONResponse(wire.message(msg_id, model, text, calls, wire.stop_reason(end.finish, len(calls),
                                                                                       end.stop_word),
                                         end.stop_word, wire.usage(end.n_prompt, end.n_cached, end.n_out)))

    async def _events(self, request: Request, turn, model: str, msg_id: str):
        stream = wire.Stream(msg_id, model, turn.n_prompt)
        for kind, data in stream.start():
            yield sse_event(kind, data)
        async for kind, value in turn.parts(request, watch=False):
            if kind == "text":
                events = stream.text(value)
            elif kind == "call_start":
                events = stream.call_start(value)
            elif kind == "call_args":
                events = stream.call_args(value[1])
            elif kind == "call":
                events = stream.call(value)
            else:
                reason = wire.stop_reason(value.finish, value.n_calls, value.stop_word)
                events = stream.end(reason, value.stop_word, wire.usage(value.n_prompt, value.n_cached, value.n_out))
            for k, data in events:
                yield sse_event(k, data)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens as /v1/messages renders it (its ``input_tokens``
        plus ``cache_read_input_tokens``)."""
        try:
            chat = wire.to_chat(await self.body(request), counting=True)
            tokens = self.prompt(chat, wire.PARAMS)
        except APIError as e:
            return self.refuse(e)
        self.done()
        return JSONResponse({"input_tokens": len(tokens)})
