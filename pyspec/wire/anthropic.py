"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``),
the dialect of Claude Code and the ``anthropic`` client: a body read into
OpenAI's chat body (:func:`to_chat`, then wire/openai.py's one parse), and the
answer written back as a Message or its event stream (:class:`Stream`).

Reading:

=====================  =====================================================
``system``             a string or text blocks: the first, system message
``messages``           text, ``tool_use`` (assistant) and ``tool_result``
                       (user) blocks; images and documents are a 400 (the
                       models served read text only)
``tools``              ``{name, description, input_schema}``; server tools
                       (a ``type`` other than ``custom``) are skipped
``tool_choice``        ``auto``, ``any`` (a call is required), ``tool``
                       (that one), ``none``; ``disable_parallel_tool_use``
``stop_sequences``     stop strings; ``stop_reason: "stop_sequence"`` names it
``max_tokens``         the answer's length (absent: until the context ends)
``output_config``      ``format`` (a JSON schema) constrains the answer;
                       ``effort`` has no effect
``metadata``,          accepted without effect (so are ``cache_control``,
``thinking``           ``speed`` and the other fields of where and how
                       Anthropic runs a request): no thinking is separated
                       from the answer (the text is the model's whole turn)
=====================  =====================================================

Usage counts as Anthropic's does: ``input_tokens`` are the prompt tokens
processed, ``cache_read_input_tokens`` the ones found in the prompt cache (their
sum is count_tokens' ``input_tokens``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..server.api_error import APIError
from . import fields

#: Anthropic's top-level fields; the ones without effect are noted in the docstring.
_FIELDS = {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
           "tools", "tool_choice", "output_config", "output_format"}
#: Accepted without effect: where and how Anthropic runs a request, and what a local model has no part in.
_NO_EFFECT = {"metadata", "thinking", "service_tier", "cache_control", "container", "diagnostics", "inference_geo",
              "speed", "user_profile_id", "workspace_id", "context_management", "mcp_servers"}
_COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "output_config", "output_format"}
#: Anthropic's parameter names for the chat body's, for errors the common parse raises.
PARAMS = {"stop": "stop_sequences", "response_format": "output_config"}


def _text_blocks(value: Any, where: str) -> str:
    """A string, or text blocks (``cache_control`` and ``citations`` accepted), joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise fields.type_error(where, "a string or a list of content blocks")
    parts = []
    for i, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("image", "document", "search_result"):
            raise APIError(400, f"{where}[{i}]: {kind} blocks are not supported (pyspec serves text-only models)",
                           param=where)
        if kind != "text" or not isinstance(block.get("text"), str):
            raise APIError(400, f"{where}[{i}] must be a text block", param=where)
        parts.append(block["text"])
    return "\n".join(parts)


def _message(i: int, m: Any) -> List[Dict[str, Any]]:
    """One Anthropic message as OpenAI chat messages: tool results become
    ``tool`` messages (before the user's text, as they answer the last turn);
    an assistant's ``tool_use`` blocks become its ``tool_calls``."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise APIError(400, f"{where} must be an object with 'role' user or assistant", param="messages")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of content blocks", param="messages")
    text: List[str] = []
    calls: List[Dict[str, Any]] = []
    results: List[Dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
            continue  # the model's earlier reasoning: not shown again, as Anthropic drops it
        elif kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise APIError(400, f"{at}: a tool_use block needs 'name' and an object 'input'", param="messages")
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and m["role"] == "user":
            body = block.get("content", "")
            out = _text_blocks(body, f"{at}.content") if body is not None else ""
            if block.get("is_error"):
                out = "Error: " + out
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": out})
        elif kind in ("image", "document"):
            raise APIError(400, f"{at}: {kind} blocks are not supported (pyspec serves text-only models)",
                           param="messages")
        else:
            raise APIError(400, f"{at}: unsupported content block {kind!r} in a {m['role']} message",
                           param="messages")
    out = list(results)
    if m["role"] == "assistant":
        msg: Dict[str, Any] = {"role": "assistant", "content": "\n".join(text)}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    elif text or not results:
        out.append({"role": "user", "content": "\n".join(text)})
    return out


def _tool_choice(value: Any, body: Dict[str, Any]) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise APIError(400, "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                       param="tool_choice")
    if kind == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": value.get("name")}}
    else:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if value.get("disable_parallel_tool_use"):
        body["parallel_tool_calls"] = False


def to_chat(body: Any, *, counting: bool = False) -> Dict[str, Any]:
    """The OpenAI chat body that says what an Anthropic body says (``counting``:
    a count_tokens body, which has no answer settings)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    allowed = (_COUNT_FIELDS if counting else _FIELDS) | _NO_EFFECT
    for name in sorted(body):
        if name not in allowed:
            raise APIError(400, f"{name}: Extra inputs are not permitted (pyspec serve does not implement it)",
                           param=name)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    messages: List[Dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    for i, m in enumerate(body["messages"]):
        messages.extend(_message(i, m))
    chat: Dict[str, Any] = {"messages": messages}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    # A server tool (a type other than custom: web search, code execution ...) is Anthropic's to run.
    tools = fields.function_tools(body.get("tools"), lambda t: t.get("type") in (None, "custom"), "input_schema")
    if tools:
        chat["tools"] = tools
        _tool_choice(body.get("tool_choice"), chat)
    fmt = _output_format(body)
    if fmt is not None:
        chat["response_format"] = fmt
    if counting:
        return chat
    for name in ("max_tokens", "temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if "temperature" in chat:
        fields.number(body, "temperature", 0.0, 1.0, 1.0)  # Anthropic's range
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    return chat


def _output_format(body: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Structured outputs (``output_config.format``, or the beta's
    ``output_format``): ``{"type": "json_schema", "schema": {...}}``."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise fields.type_error("output_config", "an object")
    fmt = (config or {}).get("format", body.get("output_format"))
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise APIError(400, "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                       param="output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


# ------------------------------------------------------------------ answers

def new_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def stop_reason(finish: str, n_calls: int, stop_word: Optional[str]) -> str:
    if finish == "length":
        return "max_tokens"
    if n_calls:
        return "tool_use"
    return "stop_sequence" if stop_word is not None else "end_turn"


def usage(n_prompt: int, n_cached: int, n_out: int) -> Dict[str, int]:
    return {"input_tokens": n_prompt - n_cached, "output_tokens": n_out, "cache_read_input_tokens": n_cached,
            "cache_creation_input_tokens": 0}


def tool_block(call) -> Dict[str, Any]:
    try:
        args = json.loads(call.arguments)
    except ValueError:  # a grammar keeps calls to JSON; a free-form one that is not JSON stays whole
        args = {"arguments": call.arguments}
    return {"type": "tool_use", "id": tool_id(), "name": call.name, "input": args if isinstance(args, dict) else {}}


def message(msg_id: str, model: str, text: str, calls: List[Any], reason: str, stop_word: Optional[str],
            use: Dict[str, int]) -> Dict[str, Any]:
    """A whole answer: Anthropic's Message."""
    content: List[Dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [tool_block(c) for c in calls]
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop_word, "usage": use}


def error_body(e: APIError) -> Dict[str, Any]:
    """Anthropic's error object for a refusal."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
    return {"type": "error", "error": {"type": kinds.get(e.status, "api_error"), "message": e.message}}


class Stream:
    """Anthropic's event stream of one answer, built from the turn's parts:
    message_start, then each content block (start, deltas, stop), then
    message_delta (the stop reason and final usage) and message_stop."""

    def __init__(self, msg_id: str, model: str, n_prompt: int) -> None:
        self.msg_id, self.model, self.n_prompt = msg_id, model, n_prompt
        self.index = -1        # the open block's index
        self.open: Optional[str] = None  # its type: "text" or "tool_use"

    @staticmethod
    def event(kind: str, **data: Any) -> Tuple[str, Dict[str, Any]]:
        return kind, {"type": kind, **data}

    def start(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        yield self.event("message_start", message={
            "id": self.msg_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage(self.n_prompt, 0, 0)})
        yield self.event("ping")

    def _close(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        if self.open is not None:
            yield self.event("content_block_stop", index=self.index)
            self.open = None

    def text(self, text: str) -> Iterator[Tuple[str, Dict[str, Any]]]:
        if self.open != "text":
            yield from self._close()
            self.index += 1
            self.open = "text"
            yield self.event("content_block_start", index=self.index, content_block={"type": "text", "text": ""})
        yield self.event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": text})

    def call_start(self, call) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """A call's block, opened once its name is decoded; its input follows."""
        yield from self._close()
        self.index += 1
        self.open = "tool_use"
        yield self.event("content_block_start", index=self.index,
                         content_block={"type": "tool_use", "id": tool_id(), "name": call.name, "input": {}})

    def call_args(self, delta: str) -> Iterator[Tuple[str, Dict[str, Any]]]:
        yield self.event("content_block_delta", index=self.index,
                         delta={"type": "input_json_delta", "partial_json": delta})

    def call(self, call) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """A call, whole: the rest of a streamed one's input, or its block with
        its input as one delta."""
        if self.open == "tool_use" and call.streamed:
            rest = call.arguments[call.streamed:]
        else:
            yield from self.call_start(call)
            rest = json.dumps(tool_block(call)["input"])
        if rest:
            yield from self.call_args(rest)
        yield from self._close()

    def end(self, reason: str, stop_word: Optional[str], use: Dict[str, int]) -> Iterator[Tuple[str, Dict[str, Any]]]:
        yield from self._close()
        yield self.event("message_delta", delta={"stop_reason": reason, "stop_sequence": stop_word}, usage=use)
        yield self.event("message_stop")
