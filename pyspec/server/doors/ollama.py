"""ollama's API on any port (``pyspec serve --port 11434`` for tools that
assume ollama's): ``GET /``, ``/api/version``, ``/api/tags``, ``/api/ps``,
``POST /api/show``, ``/api/chat``, ``/api/generate``; a 501 for the routes
that manage models (pull, push, create, copy, delete). Shapes:
pyspec/wire/ollama.py."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ... import fim
from ...wire import ollama as wire
from ..api_error import APIError
from . import Door, ndjson


class Ollama(Door):
    error_body = staticmethod(wire.error_body)

    def routes(self) -> List[Route]:
        manage = [Route(f"/api/{name}", self.manages, methods=["POST", "DELETE"])
                  for name in ("pull", "push", "create", "copy", "delete")]
        return [Route("/", self.root, methods=["GET", "HEAD"]),
                Route("/api/version", self.version, methods=["GET"]),
                Route("/api/tags", self.tags, methods=["GET"]),
                Route("/api/ps", self.ps, methods=["GET"]),
                Route("/api/show", self.show, methods=["POST"]),
                Route("/api/chat", self.chat, methods=["POST"]),
                Route("/api/generate", self.generate, methods=["POST"]),
                *manage]

    def stream_error(self, e: APIError) -> Dict[str, Any]:
        return wire.error_body(e)

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": wire.VERSION})

    def _model(self) -> Dict[str, Any]:
        target, name = self.target, self.h.model_name
        return {"name": name, "model": name, "modified_at": wire.created_at(),
                "size": os.path.getsize(target.path), "digest": "", "details": wire.details(target)}

    async def tags(self, request: Request) -> Response:
        try:
            self.check_key(request)  # as /v1/models: the model's name and file behind the key
        except APIError as e:
            return self.refuse(e)
        return JSONResponse({"models": [self._model()]})

    async def ps(self, request: Request) -> Response:
        try:
            self.check_key(request)
        except APIError as e:
            return self.refuse(e)
        return JSONResponse({"models": [{**self._model(), "expires_at": "2999-01-01T00:00:00Z", "size_vram": 0,
                                         "context_length": self.target.n_ctx}]})

    async def show(self, request: Request) -> Response:
        try:
            body = await self.body(request)
            if not isinstance(body, dict):
                raise APIError(400, "the request body must be a JSON object")
            name = body.get("model", body.get("name"))  # "name": ollama's older field
            self.h.intake.check_model(name if isinstance(name, str) else None)
        except APIError as e:
            return self.refuse(e)
        target = self.target
        details = wire.details(target)
        capabilities = ["completion", "tools"]
        try:
            fim.FimTokens.of(target).check()
            capabilities.append("insert")
        except fim.FimUnsupported:
            pass
        arch = details["family"]
        info = {"general.architecture": arch, f"{arch}.context_length": target.n_ctx,
                "general.parameter_count": target.native.n_params}
        return self.answered({"license": "", "modelfile": f"FROM {target.path}\n", "parameters": "",
                             "template": target.chat_template.source or "", "details": details, "model_info": info,
                             "capabilities": capabilities, "modified_at": wire.created_at()})

    async def manages(self, request: Request) -> Response:
        return self.refuse(APIError(501, f"{request.url.path}: pyspec serve runs the model it was started with "
                                         f"(pyspec models pull fetches the default models)"))

    async def chat(self, request: Request) -> Response:
        arrival = time.monotonic()
        try:
            body = await self.body(request)
            if isinstance(body, dict) and body.get("messages") == []:  # ollama's way of loading a model
                return self._loaded(chat=True)
            chat = wire.chat_body(body)
            parsed, turn = await self.start(request, chat, "chat", wire.PARAMS, "ollama_chat")
        except APIError as e:
            return self.refuse(e)
        return await self._answer(request, parsed, turn, arrival, chat=True)

    async def generate(self, request: Request) -> Response:
        arrival = time.monotonic()
        try:
            read = wire.generate_body(await self.body(request))
            if read is None:  # ollama's way of loading a model: it is loaded
                return self._loaded(chat=False)
            kind, body = read
            parsed, turn = await self.start(request, body, kind, wire.PARAMS, "ollama_generate")
        except APIError as e:
            return self.refuse(e)
        return await self._answer(request, parsed, turn, arrival, chat=False)

    def _loaded(self, chat: bool) -> Response:
        return JSONResponse({**self._piece(chat), "done": True, "done_reason": "load"})

    def _piece(self, chat: bool, text: str = "", calls=None) -> Dict[str, Any]:
        out: Dict[str, Any] = {"model": self.h.model_name, "created_at": wire.created_at()}
        if chat:
            msg: Dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = wire.calls_of(calls)
            out["message"] = msg
        else:
            out["response"] = text
        return out

    async def _answer(self, request: Request, parsed, turn, arrival: float, chat: bool) -> Response:
        if parsed.stream:
            return ndjson(self.counted(self._lines(request, turn, arrival, chat), turn))
        whole = await self.whole(turn, request)
        if isinstance(whole, Response):
            return whole
        text, calls, end = whole
        out = {**self._piece(chat, text, calls), **wire.figures(end, arrival)}
        self.done()
        return JSONResponse(out)

    async def _lines(self, request: Request, turn, arrival: float, chat: bool):
        async for kind, value in turn.parts(request, watch=False):
            if kind == "text":
                yield {**self._piece(chat, value), "done": False}
            elif kind == "call":  # ollama sends a call whole
                yield {**self._piece(chat, "", [value]), "done": False}
            elif kind == "end":
                yield {**self._piece(chat), **wire.figures(value, arrival)}
