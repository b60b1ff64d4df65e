"""OpenAI's Responses API: ``POST /v1/responses`` (whole or streamed),
``GET`` and ``DELETE /v1/responses/{id}``, ``POST /v1/responses/input_tokens``.
Shapes: pyspec/wire/openai_responses.py.

``previous_response_id`` is served statefully: each stored response keeps its
conversation (as chat messages, its answer included), and a chained turn is
that conversation with the new items after it. The prompt it renders begins
with the tokens the last turn decoded, which the prompt cache still holds, so
only the new items are prefilled (usage's ``cached_tokens`` shows it).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...wire import openai_responses as wire
from ..api_error import APIError
from . import Door, sse_event

#: Stored responses kept, and the bytes of their JSON (the oldest go first past either).
MAX_STORED = 1024
MAX_STORED_BYTES = 64 << 20


@dataclass
class Stored:
    response: Dict[str, Any]
    messages: List[Dict[str, Any]] = field(default_factory=list)  # its conversation, without instructions

    @property
    def size(self) -> int:
        return len(json.dumps(self.response)) + len(json.dumps(self.messages))


class ResponseStore:
    """Responses kept for GET and for chaining, newest last, at most ``cap``."""

    def __init__(self, cap: int = MAX_STORED, cap_bytes: int = MAX_STORED_BYTES) -> None:
        self.cap, self.cap_bytes = cap, cap_bytes
        self._items: "OrderedDict[str, Tuple[Stored, int]]" = OrderedDict()
        self.bytes = 0

    def put(self, resp_id: str, stored: Stored) -> None:
        size = stored.size
        self._items[resp_id] = (stored, size)
        self.bytes += size
        while len(self._items) > self.cap or (self.bytes > self.cap_bytes and len(self._items) > 1):
            self.bytes -= self._items.popitem(last=False)[1][1]

    def get(self, resp_id: str, param: Optional[str] = None) -> Stored:
        item = self._items.get(resp_id)
        if item is None:
            raise APIError(404, f"Response with id '{resp_id}' not found.", param=param, code="not_found")
        return item[0]

    def delete(self, resp_id: str) -> None:
        self.get(resp_id)
        self.bytes -= self._items.pop(resp_id)[1]


class Responses(Door):
    def __init__(self, h) -> None:
        super().__init__(h)
        self.store = ResponseStore()

    def routes(self) -> List[Route]:
        return [Route("/v1/responses", self.create, methods=["POST"]),
                Route("/v1/responses/input_tokens", self.input_tokens, methods=["POST"]),
                Route("/v1/responses/{resp_id}", self.read, methods=["GET"]),
                Route("/v1/responses/{resp_id}", self.delete, methods=["DELETE"])]

    def history(self, body: Dict[str, Any]) -> List[Dict[str, Any]]:
        prev = body.get("previous_response_id")
        if prev is None:
            return []
        if not isinstance(prev, str):
            raise APIError(400, "'previous_response_id' must be a string", param="previous_response_id")
        return self.store.get(prev, "previous_response_id").messages

    async def create(self, request: Request) -> Response:
        try:
            body = wire.check_fields(await self.body(request))
            history = self.history(body)
            chat = wire.to_chat(body, history)
            parsed, turn = await self.start(request, chat, "chat", wire.PARAMS, "responses")
        except APIError as e:
            return self.refuse(e)
        # The conversation a later turn continues: without this turn's instructions (OpenAI's rule).
        said = history + wire.input_messages(body["input"])
        resp_id, model = wire.new_id(), self.h.model_name
        if parsed.stream:
            stream = wire.Stream(resp_id, model, body)
            return EventSourceResponse(self.counted(self._events(request, turn, stream, body, said), turn,
                                                    error=lambda e: sse_event("error", stream.error(e))),
                                       ping=15, sep="\n")
        whole = await self.whole(turn, request)
        if isinstance(whole, Response):
            return whole
        text, calls, end = whole
        out = wire.response(resp_id, model, body, wire.output_of(text, calls), status=wire.status_of(end.finish),
                            finish=end.finish, use=wire.usage(end.n_prompt, end.n_cached, end.n_out))
        self._keep(body, out, said, text, calls)
        self.done()
        return JSONResponse(out)

    def _keep(self, body, out, said, text, calls) -> None:
        if body.get("store", True) is not False:
            self.store.put(out["id"], Stored(out, said + wire.as_chat_messages(text, calls)))

    async def _events(self, request: Request, turn, stream: "wire.Stream", body, said):
        text, calls = "", []
        for kind, data in stream.start():
            yield sse_event(kind, data)
        async for kind, value in turn.parts(request, watch=False):
            if kind == "text":
                text += value
                events = stream.delta(value)
            elif kind == "call_start":
                events = stream.call_start(value)
            elif kind == "call_args":
                events = stream.call_args(value[1])
            elif kind == "call":
                calls.append(value)
                events = stream.call(value)
            else:
                events = stream.end(value.finish, wire.usage(value.n_prompt, value.n_cached, value.n_out))
            for k, data in events:
                yield sse_event(k, data)
        if stream.final is not None:
            self._keep(body, stream.final, said, text, calls)

    async def read(self, request: Request) -> Response:
        try:
            self.check_key(request)
            stored = self.store.get(request.path_params["resp_id"])
        except APIError as e:
            return self.refuse(e)
        self.done()
        return JSONResponse(stored.response)

    async def delete(self, request: Request) -> Response:
        resp_id = request.path_params["resp_id"]
        try:
            self.check_key(request)
            self.store.delete(resp_id)
        except APIError as e:
            return self.refuse(e)
        self.done()
        return JSONResponse({"id": resp_id, "object": "response", "deleted": True})

    async def input_tokens(self, request: Request) -> Response:
        """The prompt's tokens as /v1/responses renders it (its usage's ``input_tokens``)."""
        try:
            body = wire.check_fields(await self.body(request), counting=True)
            tokens = self.prompt(wire.to_chat(body, self.history(body), counting=True), wire.PARAMS)
        except APIError as e:
            return self.refuse(e)
        self.done()
        return JSONResponse({"object": "response.input_tokens", "input_tokens": len(tokens)})
