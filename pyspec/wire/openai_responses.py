"""OpenAI's Responses API (``POST /v1/responses``), the dialect of Codex CLI
and the OpenAI Agents SDK: a body read into OpenAI's chat body
(:func:`to_chat`, then wire/openai.py's one parse), and the answer written as
a Response object or its event stream (:class:`Stream`).

Reading:

=========================  ==================================================
``input``                  a string, or items: messages (``input_text`` /
                           ``output_text`` parts), ``function_call`` and
                           ``function_call_output``; reasoning items are
                           skipped; images and files are a 400
``instructions``           the system message (not carried to a chained turn)
``previous_response_id``   the stored conversation it continues
                           (server/doors/responses.py)
``tools``                  function tools; other tool types (web search,
                           file search ...) are skipped, as llama-server does
``text.format``            ``json_object`` or ``json_schema`` constrain the
                           answer
``max_output_tokens``      the answer's length
``store``                  keep the response for GET and for chaining
                           (default true); ``metadata`` is kept with it
=========================  ==================================================
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..server.api_error import APIError
from . import fields

_FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
           "max_output_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "store", "metadata",
           "previous_response_id", "user", "stop"}
#: Accepted without effect: how OpenAI runs and bills a request, and reasoning a local model does not report.
_NO_EFFECT = {"reasoning", "include", "truncation", "service_tier", "prompt_cache_key", "prompt_cache_retention",
              "safety_identifier", "background", "stream_options", "max_tool_calls", "top_logprobs", "conversation",
              "context_management", "verbosity"}
_COUNT_FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                 "previous_response_id", "reasoning", "truncation", "conversation"}
PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}


def _parts_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise fields.type_error(where, "a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal":
            out.append(str(part.get("refusal", "")))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise APIError(400, f"{where}[{j}]: {kind} is not supported (pyspec serves text-only models)",
                           param="input")
        else:
            raise APIError(400, f"{where}[{j}]: unsupported content part {kind!r}", param="input")
    return "\n".join(out)


def input_messages(value: Any) -> List[Dict[str, Any]]:
    """``input`` as OpenAI chat messages: consecutive function calls join one
    assistant message (after its text, if it has any), each output is a
    ``tool`` message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise fields.type_error("input", "a string or a list of input items")
    out: List[Dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"{where}.role must be user, assistant, system or developer", param="input")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _parts_text(item.get("content", ""), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", ""), str):
                raise APIError(400, f"{where}: a function_call needs 'name' and string 'arguments'", param="input")
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments", "")}}
            if out and out[-1]["role"] == "assistant":  # its text, or the calls made beside this one
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": output if isinstance(output, str) else _parts_text(output, f"{where}.output")})
        elif kind == "reasoning":
            continue  # the model's reasoning summary: not shown again
        else:
            raise APIError(400, f"{where}: unsupported input item type {kind!r}", param="input")
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise APIError(400, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                        "\"name\": ...}", param="tool_choice")


def _format(text: Any) -> Optional[Dict[str, Any]]:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise fields.type_error("text", "an object")
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise APIError(400, "'text.format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                       param="text")
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if not isinstance(fmt.get("schema"), dict):
        raise APIError(400, "'text.format' of type json_schema needs a 'schema' object", param="text")
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "output"), "schema": fmt["schema"]}}


def check_fields(body: Any, counting: bool = False) -> Dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    allowed = (_COUNT_FIELDS if counting else _FIELDS) | _NO_EFFECT
    for name in sorted(body):
        if name not in allowed:
            raise APIError(400, f"unsupported parameter '{name}' (pyspec serve does not implement it)", param=name)
    return body


def to_chat(body: Dict[str, Any], history: List[Dict[str, Any]], *, counting: bool = False) -> Dict[str, Any]:
    """The OpenAI chat body of a Responses body, after ``history`` (the
    conversation of its ``previous_response_id``, as chat messages)."""
    check_fields(body, counting)
    if "input" not in body:
        raise APIError(400, "'input' is required", param="input")
    messages = list(history)
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise fields.type_error("instructions", "a string")
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    messages += input_messages(body["input"])
    if not messages:
        raise APIError(400, "'input' holds no messages", param="input")
    chat: Dict[str, Any] = {"messages": messages}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    # A hosted tool (web search, file search, computer use ...) is OpenAI's to run.
    tools = fields.function_tools(body.get("tools"), lambda t: t.get("type") == "function", "parameters")
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if counting:
        return chat
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stream", "user", "stop"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


# ------------------------------------------------------------------ answers

def new_id(prefix: str = "resp") -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> Dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else []}


def call_item(call, status: str = "completed") -> Dict[str, Any]:
    return {"type": "function_call", "id": new_id("fc"), "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def usage(n_prompt: int, n_cached: int, n_out: int) -> Dict[str, Any]:
    return {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": n_cached},
            "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_prompt + n_out}


def response(resp_id: str, model: str, body: Dict[str, Any], output: List[Dict[str, Any]], *,
             status: str = "completed", finish: Optional[str] = None, use: Optional[Dict[str, Any]] = None,
             created: Optional[int] = None) -> Dict[str, Any]:
    """A Response object: the request's settings echoed as OpenAI echoes them."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    now = int(time.time())
    return {
        "id": resp_id, "object": "response", "created_at": created or now,
        "completed_at": now if status != "in_progress" else None, "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": model, "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"), "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": tools, "top_p": body.get("top_p", 1.0),
        "truncation": "disabled", "usage": use, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def output_of(text: str, calls: List[Any]) -> List[Dict[str, Any]]:
    items = [message_item(new_id("msg"), text)] if text else []
    return items + [call_item(c) for c in calls]


def status_of(finish: str) -> str:
    return "incomplete" if finish == "length" else "completed"


class Stream:
    """The Responses event stream of one answer: response.created and
    .in_progress; for the text, its message item (output_item.added,
    content_part.added, output_text.delta ..., the .done events); for each call
    its function_call item (arguments in one delta); response.completed (or
    .incomplete) with the whole Response. Each event has its sequence_number."""

    def __init__(self, resp_id: str, model: str, body: Dict[str, Any]) -> None:
        self.resp_id, self.model, self.body = resp_id, model, body
        self.created = int(time.time())
        self.seq = 0
        self.output: List[Dict[str, Any]] = []
        self.msg: Optional[Dict[str, Any]] = None  # the open message item
        self.calling: Optional[Dict[str, Any]] = None  # the function_call item being streamed
        self.text = ""
        self.final: Optional[Dict[str, Any]] = None  # the whole Response, once ended

    def event(self, kind: str, **data: Any) -> Tuple[str, Dict[str, Any]]:
        self.seq += 1
        return kind, {"type": kind, "sequence_number": self.seq - 1, **data}

    def _response(self, status: str, finish: Optional[str] = None, use=None) -> Dict[str, Any]:
        return response(self.resp_id, self.model, self.body, list(self.output), status=status, finish=finish,
                        use=use, created=self.created)

    def start(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        yield self.event("response.created", response=self._response("in_progress"))
        yield self.event("response.in_progress", response=self._response("in_progress"))

    def _close(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        if self.msg is None:
            return
        index, item_id = len(self.output), self.msg["id"]
        part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
        yield self.event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                         text=self.text, logprobs=[])
        yield self.event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                         part=part)
        item = message_item(item_id, self.text)
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.msg, self.text = None, ""

    def delta(self, text: str) -> Iterator[Tuple[str, Dict[str, Any]]]:
        index = len(self.output)
        if self.msg is None:
            self.msg = message_item(new_id("msg"), "", status="in_progress")
            yield self.event("response.output_item.added", output_index=index, item=self.msg)
            yield self.event("response.content_part.added", item_id=self.msg["id"], output_index=index,
                             content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                    "logprobs": []})
        self.text += text
        yield self.event("response.output_text.delta", item_id=self.msg["id"], output_index=index,
                         content_index=0, delta=text, logprobs=[])

    def call_start(self, call) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """A call's item, added once its name is decoded; its arguments follow."""
        yield from self._close()
        self.calling = call_item(call)
        yield self.event("response.output_item.added", output_index=len(self.output),
                         item={**self.calling, "arguments": "", "status": "in_progress"})

    def call_args(self, delta: str) -> Iterator[Tuple[str, Dict[str, Any]]]:
        yield self.event("response.function_call_arguments.delta", item_id=self.calling["id"],
                         output_index=len(self.output), delta=delta)

    def call(self, call) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """A call, whole: the rest of a streamed one's arguments, or its item
        with its arguments as one delta."""
        if self.calling is None or not call.streamed:
            yield from self.call_start(call)
        rest = call.arguments[call.streamed:] if call.streamed else call.arguments
        if rest:
            yield from self.call_args(rest)
        index, item = len(self.output), {**self.calling, "arguments": call.arguments, "status": "completed"}
        yield self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                         name=item["name"], arguments=item["arguments"])
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.calling = None

    def error(self, e: APIError) -> Dict[str, Any]:
        """The error event a stream ends with when the answer fails midway."""
        return self.event("error", code=e.code or e.type, message=e.message, param=e.param)[1]

    def end(self, finish: str, use: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
        yield from self._close()
        status = status_of(finish)
        self.final = self._response(status, finish, use)
        yield self.event("response.completed" if status == "completed" else "response.incomplete",
                         response=self.final)




def as_chat_messages(text: str, calls: List[Any]) -> List[Dict[str, Any]]:
    """An answer as the chat messages a chained turn continues from."""
    msg: Dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in calls]
    return [msg]

