"""llama-server's own routes, for the clients that call them (Continue's
llama.cpp provider, llama.vscode): ``POST /completion`` (whole or streamed,
with its ``timings``, ``n_probs`` and stop fields), ``/tokenize``,
``/detokenize``, ``/apply-template`` (exactly the prompt a chat request
decodes), ``GET /props`` and ``/slots``. Request fields:
pyspec/wire/llama_server.py."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ... import __version__
from ...wire import fields, llama_fields
from ...wire import llama_server as wire
from ..api_error import APIError
from ..responses import timings

#: The seed llama-server reports for "a fresh one each time" (LLAMA_DEFAULT_SEED).
SEED_FRESH = 4294967295
from . import Door

_STOP_TYPE = {"eog": "eos", "stop": "word", "max_tokens": "limit", "context": "limit", "cancelled": "none"}


def generation_settings(sampling, *, n_predict: int, seed: int, stop: List[str], n_probs: int,
                        samplers: List[str], stream: bool = False) -> Dict[str, Any]:
    """llama-server's ``generation_settings`` (``/props``' ``params``): the
    fields pyspec implements, as it names them (the samplers pyspec does not
    have, DRY, XTC, mirostat ..., are not reported)."""
    return {"n_predict": n_predict, "seed": seed, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty,
            "repeat_last_n": sampling.penalty_last_n, "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            # llama-server's form; a forbidden token's -inf (no JSON for it) as null
            "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in sampling.logit_bias],
            "n_probs": n_probs, "stop": list(stop),
            "samplers": list(samplers), "ignore_eos": False, "n_keep": 0, "max_tokens": n_predict, "stream": stream}


class LlamaServer(Door):
    def routes(self) -> List[Route]:
        return [Route("/completion", self.completion, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/apply-template", self.apply_template, methods=["POST"]),
                Route("/props", self.props, methods=["GET"]),
                Route("/slots", self.slots, methods=["GET"])]

    def _piece(self, token: int) -> bytes:
        return self.target.native.token_to_piece(token, False)

    def _probs(self, entries, tokens) -> List[Dict[str, Any]]:
        def one(tok: int, lp: float) -> Dict[str, Any]:
            b = self._piece(tok)
            return {"id": tok, "token": b.decode("utf-8", errors="replace"), "bytes": list(b), "logprob": lp}
        return [{**one(t, lp), "top_logprobs": [one(u, v) for u, v in top]} for t, (lp, top) in zip(tokens, entries)]

    async def completion(self, request: Request) -> Response:
        try:
            body = await self.body(request)
            converted = wire.completion_body(
                body, lambda text, first: self.target.tokenize(text, add_special=first, parse_special=True))
            parsed, turn = await self.start(request, converted, "completion", {}, "completion")
        except APIError as e:
            return self.refuse(e)
        st = parsed.settings
        context = {"return_tokens": bool(body.get("return_tokens")), "n_probs": bool(converted.get("logprobs")),
                   "fields": llama_fields.response_fields(body), "prompt": body["prompt"],
                   "settings": generation_settings(
                       st.sampling, n_predict=-1 if st.max_tokens is None else st.max_tokens,
                       seed=SEED_FRESH if st.seed is None else st.seed, stop=st.stop, n_probs=st.logprobs or 0,
                       samplers=converted["samplers"], stream=parsed.stream)}
        if parsed.stream:
            return EventSourceResponse(self.counted(self._chunks(request, turn, context), turn), ping=15, sep="\n")
        whole = await self.whole(turn, request)
        if isinstance(whole, Response):
            return whole
        text, _, end = whole
        out = self._final(turn, end, text, context)
        if context["n_probs"]:
            out["completion_probabilities"] = self._probs(end.logprobs, end.tokens)
        answer = JSONResponse(llama_fields.pick(out, context["fields"]))
        self.done()
        return answer

    def _final(self, turn, end, text: str, context) -> Dict[str, Any]:
        return {"index": 0, "content": text, "tokens": end.tokens if context["return_tokens"] else [], "id_slot": -1,
                "stop": True, "model": self.h.model_name, "tokens_predicted": end.n_out,
                "tokens_evaluated": end.n_prompt, "prompt": context["prompt"], "has_new_line": "\n" in text,
                "generation_settings": context["settings"], "truncated": False,
                "stop_type": _STOP_TYPE.get(end.result.stop_reason, "none"),
                "stopping_word": end.stop_word or "", "tokens_cached": end.n_prompt + end.n_out,
                "timings": timings([end.stats], end.n_prompt, end.n_cached)}

    async def _chunks(self, request: Request, turn, context):
        async for kind, value in turn.parts(request, watch=False):
            if kind == "end":
                yield {"data": _dumps(llama_fields.pick(self._final(turn, value, "", context), context["fields"]))}
            else:  # no tools here: each text part is one delta of the engine's (turn.delta)
                chunk = {"index": 0, "content": value, "tokens": [], "stop": False, "id_slot": -1,
                         "tokens_evaluated": turn.n_prompt}
                if context["n_probs"]:
                    chunk["completion_probabilities"] = self._probs(turn.delta[1], turn.delta[0])
                yield {"data": _dumps(chunk)}

    async def tokenize(self, request: Request) -> Response:
        """``content`` as token ids (``add_special`` false and ``parse_special``
        true by default, as llama-server; ``with_pieces``: each id with its text)."""
        try:
            body = await self.body(request)
            content = body.get("content") if isinstance(body, dict) else None
            if not isinstance(content, str):
                raise APIError(400, "\"content\" must be a string", param="content")
            tokens = self.target.tokenize(content, add_special=bool(fields.flag(body, "add_special", False)),
                                          parse_special=bool(fields.flag(body, "parse_special", True)))
            with_pieces = fields.flag(body, "with_pieces", False)
        except APIError as e:
            return self.refuse(e)
        if not with_pieces:
            return self.answered({"tokens": tokens})
        out = []
        for t in tokens:
            b = self.target.native.token_to_piece(t, True)
            try:
                piece: Any = b.decode("utf-8")
            except UnicodeDecodeError:  # part of a character: its bytes, as llama-server gives them
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return self.answered({"tokens": out})

    async def detokenize(self, request: Request) -> Response:
        try:
            body = await self.body(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                       and 0 <= t < self.target.n_vocab for t in tokens):
                raise APIError(400, f"\"tokens\" must be a list of token ids in [0, {self.target.n_vocab})",
                               param="tokens")
        except APIError as e:
            return self.refuse(e)
        return self.answered({"content": self.target.detokenize(tokens, special=True)})

    async def apply_template(self, request: Request) -> Response:
        """The text a chat request's prompt is: the template's rendering of its
        messages (and tools), before it is tokenized."""
        try:
            body = await self.body(request)
            chat = {k: v for k, v in body.items() if k in ("messages", "tools", "tool_choice", "chat_template_kwargs",
                                                          "parallel_tool_calls", "model")} \
                if isinstance(body, dict) else body
            parsed = self.h.intake.parse(chat, "chat")
            text = self.target.apply_chat_template(parsed.prompts[0], tools=parsed.tools,
                                                   variables=parsed.template_vars)
        except APIError as e:
            return self.refuse(e)
        except (ValueError, RuntimeError) as e:
            return self.refuse(APIError(400, f"cannot build the prompt: {e}", param="messages"))
        return self.answered({"prompt": text})

    async def props(self, request: Request) -> Response:
        try:
            self.check_key(request)  # it shows the model's path and template: as /v1/models, behind the key
        except APIError as e:
            return self.refuse(e)
        target, h = self.target, self.h
        params = generation_settings(llama_fields.DEFAULTS, n_predict=-1, seed=SEED_FRESH, stop=[], n_probs=0,
                                     samplers=llama_fields.DEFAULT_CHAIN)
        source = target.chat_template.source or ""
        caps = {"supports_tools": "tools" in source, "supports_tool_calls": "tool_calls" in source,
                "supports_system_role": True, "supports_parallel_tool_calls": "tool_calls" in source,
                "supports_string_content": True}
        return JSONResponse({
            "default_generation_settings": {"n_ctx": target.n_ctx, "params": params, "model": h.model_name},
            "total_slots": h.parallel, "model_path": str(target.path), "model_alias": h.model_name,
            "chat_template": source, "chat_template_caps": caps,
            "modalities": {"vision": False, "audio": False, "video": False},
            "model_ftype": target.description.split(" ", 2)[-1],
            "bos_token": _token_text(target, "bos"), "eos_token": _token_text(target, "eos"),
            "build_info": f"pyspec {__version__}", "is_sleeping": False})

    async def slots(self, request: Request) -> Response:
        try:
            self.check_key(request)
        except APIError as e:
            return self.refuse(e)
        s, n_ctx = self.h.scheduler, self.target.n_ctx
        busy = s.busy_slots if s is not None else 0
        return JSONResponse([{"id": i, "n_ctx": n_ctx, "is_processing": i < busy} for i in range(self.h.parallel)])


def _token_text(target, which: str) -> str:
    tok = getattr(target.native, which)
    return target.native.token_text(tok) if tok >= 0 else ""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
