"""``create_chat_completion`` of :class:`pyspec.Llama`: the chat rendered by
the GGUF's own template (pyspec/chat/templates.py), its constraint from
``response_format``, ``grammar`` or the tools (pyspec/chat/tools.py, as the
server builds it), and the answer in llama-cpp-python's ``chat.completion``
dicts, whole or streamed, with tool calls parsed out of the text by the
server's parser.

Where llama-cpp-python itself differs by chat handler, the GGUF-template
handler's shapes are followed; a named ``tool_choice`` also reports the call
as ``function_call``, as llama-cpp-python does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

from ..chat.tools import CallParser, ToolChoice, check_choice, check_tools, parse_calls, tool_constraint, tool_format
from ..constraints import Constraint
from ..request import one_constraint
from ..results import Completion
from ..results import FINISH_REASON
from . import completion, options
from .completion import Call

if TYPE_CHECKING:
    from .llama import Llama


@dataclass
class ChatRequest:
    tokens: List[int]
    constraint: Optional[Constraint]
    choice: ToolChoice
    tool_format: Optional[str]  # the format calls are parsed from (None: no tools shown)
    names: List[str]


def prepare(llm: "Llama", messages: List[Dict[str, Any]], *, functions, function_call, tools, tool_choice,
            response_format, grammar) -> ChatRequest:
    """The prompt tokens and the answer's constraint. Legacy ``functions`` and
    ``function_call`` become tools and a tool choice, as in llama-cpp-python."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, dict) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    tools = check_tools(tools) if tools else None
    choice = check_choice(tool_choice, tools)
    shown = tools if choice.mode != "none" else None  # as the server: "none" shows the model no tools
    target = llm.model
    tokens = target.prompt_tokens(messages, tools=shown)
    fmt = tool_format(target.chat_template.source) if shown else None
    constraint = _constraint(response_format, grammar)
    calls = tool_constraint(fmt, shown, choice) if fmt is not None else None
    param = "grammar" if grammar is not None else "response_format"
    constraint, _ = one_constraint(constraint, param, calls, required=choice.mode == "required")
    return ChatRequest(tokens, constraint, choice, fmt, [t["function"]["name"] for t in shown or []])


def _constraint(response_format: Optional[Dict[str, Any]], grammar: Any) -> Optional[Constraint]:
    """``grammar``, or ``response_format``: {"type": "text"}, {"type":
    "json_object"} (with llama-cpp-python's optional "schema"), or OpenAI's
    {"type": "json_schema", "json_schema": {"schema": ...}}."""
    fmt = response_format
    if fmt is None or fmt == {"type": "text"}:
        return options.grammar_constraint(grammar)
    if grammar is not None:
        raise ValueError("give response_format or grammar, not both")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return Constraint.json_schema(fmt["schema"]) if "schema" in fmt else Constraint.json_object()
    if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        return Constraint.json_schema(fmt["json_schema"].get("schema", {}))
    raise ValueError(f"response_format must be {{'type': 'text'}}, {{'type': 'json_object'}} (optionally with "
                     f"'schema') or {{'type': 'json_schema', 'json_schema': {{'schema': ...}}}}; got {fmt!r}")


def logprobs_object(lp: Optional[Dict[str, list]]) -> Optional[Dict[str, Any]]:
    """A completion's logprobs in chat's shape (llama-cpp-python's conversion: no bytes)."""
    if lp is None:
        return None
    return {"content": [{"token": token, "bytes": None, "logprob": value,
                         "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in top.items()]}
                        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])],
            "refusal": None}


def _named(request: ChatRequest) -> bool:
    return request.choice.name is not None


def whole(llm: "Llama", request: ChatRequest, call: Call) -> Dict[str, Any]:
    out = completion.run(llm, call)
    tokens = completion.generated(llm, out)
    lp = completion.logprobs_object(llm, tokens, out.logprobs, 0) if call.logprobs is not None else None
    finish = FINISH_REASON[out.stop_reason]
    message: Dict[str, Any] = {"role": "assistant", "content": out.text}
    if request.tool_format is not None:
        content, calls = parse_calls(request.tool_format, out.text, request.names)
        message["content"] = content
        if calls:
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [c.to_openai() for c in calls]}
            if _named(request):
                message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
            finish = "tool_calls" if finish == "stop" else finish
    return {"id": "chat" + call.id, "object": "chat.completion", "created": call.created, "model": call.model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs_object(lp), "finish_reason": finish}],
            "usage": completion.usage(call, len(tokens))}


def _chunk(call: Call, delta: Dict[str, Any], logprobs: Any = None, finish: Optional[str] = None) -> Dict[str, Any]:
    return {"id": "chat" + call.id, "model": call.model, "created": call.created, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


_EMPTY = {"role": None, "content": None, "function_call": None, "tool_calls": None}


def stream(llm: "Llama", request: ChatRequest, call: Call) -> Iterator[Dict[str, Any]]:
    """llama-cpp-python's chunks: the role, then the content as it comes,
    then an empty delta with the finish reason. A tool call comes out whole
    (its name and arguments in one delta) once its text is complete. With
    logprobs, each token is its own chunk, given once the answer is complete."""
    named = _named(request)
    yield _chunk(call, {**_EMPTY, "role": "assistant"} if named else {"role": "assistant"})
    parser = CallParser(request.tool_format, request.names) if request.tool_format is not None else None
    out: Optional[Completion] = None
    for item in completion.pieces(llm, call):
        if isinstance(item, Completion):
            out = item
        elif call.logprobs is not None:
            continue
        elif parser is None:
            yield _chunk(call, {"content": item})
        else:
            yield from _events(call, parser.feed(item), named)
    assert out is not None
    if call.logprobs is not None:
        for c in completion.token_chunks(llm, call, out):
            choice = c["choices"][0]
            events = parser.feed(choice["text"]) if parser is not None else [("content", choice["text"])]
            lp = logprobs_object(choice["logprobs"])
            for d in _deltas(events, named) or [{}]:
                yield _chunk(call, d, lp)
                lp = None
    if parser is not None:
        yield from _events(call, parser.finish(), named)
    finish = FINISH_REASON[out.stop_reason]
    if parser is not None and parser.n_calls:
        finish = "tool_calls" if finish == "stop" else finish
    yield _chunk(call, dict(_EMPTY) if named else {}, None, finish)


def _events(call: Call, events, named: bool) -> Iterator[Dict[str, Any]]:
    for d in _deltas(events, named):
        yield _chunk(call, d)


def _deltas(events, named: bool) -> List[Dict[str, Any]]:
    """Deltas of parsed events: content text, or a whole call."""
    out = []
    for kind, value in events:
        if kind == "content":
            out.append({"content": value})
            continue
        d: Dict[str, Any] = {"tool_calls": [{"index": value.index, "id": value.id, "type": "function",
                                             "function": {"name": value.name, "arguments": value.arguments}}]}
        if named:
            d = {"role": None, "content": None,
                 "function_call": {"name": value.name, "arguments": value.arguments}, **d}
        out.append(d)
    return out
