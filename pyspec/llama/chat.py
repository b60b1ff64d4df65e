"""``create_chat_completion`` of :class:`pyspec.Llama`: the chat rendered by
the GGUF's own template (pyspec/chat/templates.py) or by a named
``chat_format`` (chat_formats.py, with its stop strings and BOS rule), its
constraint from ``response_format``, ``grammar`` or the tools
(pyspec/chat/tools.py, as the server builds it; functions.py under
``chatml-function-calling``), and the answer in llama-cpp-python's
``chat.completion`` dicts, whole or streamed, with tool calls parsed out of
the text by the server's parser (functions.py's for chatml-function-calling).

Where llama-cpp-python itself differs by chat handler, the GGUF-template
handler's shapes are followed; a named ``tool_choice`` also reports the call
as ``function_call``, as llama-cpp-python does. Under a named format other
than chatml-function-calling the model is shown no tools, as there: a named
``tool_choice`` makes the whole answer that function's arguments (streamed
as argument pieces, as there), "auto" answers in text, "required" is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

from ..chat.calls import CallParser, ToolCall, parse_calls
from ..chat.tools import ToolChoice, check_choice, check_tools, tool_constraint, tool_format
from ..constraints import Constraint
from ..request import one_constraint
from ..results import Completion
from ..results import FINISH_REASON
from . import chat_formats, completion, options
from . import functions as fcall
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
    format_stop: List[str] = field(default_factory=list)  # a chat format's stop strings
    arguments_of: Optional[str] = None  # the answer is this function's arguments (a chat format's named tool_choice)
    prompt: Optional[str] = None  # a named chat format's prompt text (what the tokens are)

    def stops(self, stop: Any) -> List[str]:
        """The caller's stop strings, then the chat format's (as llama-cpp-python adds them)."""
        given = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        return given + self.format_stop

    def parser(self, completion_id: str) -> Any:
        """The parser of the answer's calls (None: no tools shown)."""
        if self.tool_format == fcall.FORMAT:
            return fcall.FunctionsParser(self.names, completion_id)
        return CallParser(self.tool_format, self.names) if self.tool_format is not None else None

    def parse(self, text: str, completion_id: str):
        if self.tool_format == fcall.FORMAT:
            return fcall.parse(text, self.names, completion_id)
        return parse_calls(self.tool_format, text, self.names)


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
    if llm.chat_format not in (None, "chat_template.default"):  # a named format (an unknown name: ValueError)
        return _prepare_format(llm, messages, tools, tool_choice, response_format, grammar)
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


def _prepare_format(llm: "Llama", messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]],
                    tool_choice: Any, response_format, grammar) -> ChatRequest:
    """A chat in a named format: its prompt as llama-cpp-python writes it,
    tokenized with BOS as the format says; tools as described above."""
    name = llm.chat_format
    calling = name == chat_formats.FUNCTION_CALLING
    choice = check_choice(tool_choice, tools)
    if calling and tool_choice is None:  # llama-cpp-python shows tools only for a tool_choice given
        choice = ToolChoice("none")
    answer = _constraint(response_format, grammar)
    param = "grammar" if grammar is not None else "response_format"
    names = [t["function"]["name"] for t in tools or []]
    shown = tools if calling and tools and choice.mode != "none" else None
    rendered = chat_formats.render(name, messages, tools=shown, show_tools=shown is not None)
    prompt, fmt, arguments_of, constraint = rendered.prompt, None, None, answer
    if tools and choice.name is not None:
        tool = next(t for t in tools if t["function"]["name"] == choice.name)
        prompt += fcall.head(choice.name) if calling else ""
        constraint, _ = one_constraint(answer, param, fcall.arguments_constraint(tool), required=True)
        arguments_of = choice.name
    elif shown is not None:
        required = choice.mode == "required"
        constraint, _ = one_constraint(answer, param, fcall.constraint(shown, required=required),
                                       required=required)
        fmt = fcall.FORMAT
    elif tools and choice.mode == "required":
        raise ValueError(f"tool_choice='required' under chat_format={name!r}: this format shows the model no "
                         f"tools; name the function (tool_choice={{'type': 'function', 'function': {{'name': ...}}}}) "
                         f"or use chat_format='{chat_formats.FUNCTION_CALLING}'")
    tokens = list(llm.model.native.tokenize(prompt, rendered.add_bos, True))
    return ChatRequest(tokens, constraint, choice, fmt, names if fmt else [], format_stop=rendered.stop,
                       arguments_of=arguments_of, prompt=prompt)


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
    if request.arguments_of is not None:
        name = request.arguments_of
        message = {"role": "assistant", "content": None, "function_call": {"name": name, "arguments": out.text},
                   "tool_calls": [_arguments_call(request, call, out.text).to_openai()]}
        finish = "tool_calls" if finish == "stop" else finish
    elif request.tool_format is not None:
        content, calls = request.parse(out.text, call.id)
        message["content"] = content
        if calls:
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [c.to_openai() for c in calls]}
            if _named(request) or (request.tool_format == fcall.FORMAT and len(calls) == 1):
                message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
            finish = "tool_calls" if finish == "stop" else finish
    return {"id": "chat" + call.id, "object": "chat.completion", "created": call.created, "model": call.model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs_object(lp), "finish_reason": finish}],
            "usage": completion.usage(call, len(tokens))}


def _arguments_call(request: ChatRequest, call: Call, arguments: str) -> ToolCall:
    """The one call of a named tool_choice under a chat format (llama-cpp-python's id)."""
    assert request.arguments_of is not None
    return ToolCall(request.arguments_of, arguments, id=fcall.call_id(0, request.arguments_of, call.id))


def _chunk(call: Call, delta: Dict[str, Any], logprobs: Any = None, finish: Optional[str] = None) -> Dict[str, Any]:
    return {"id": "chat" + call.id, "model": call.model, "created": call.created, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


_EMPTY = {"role": None, "content": None, "function_call": None, "tool_calls": None}


def stream(llm: "Llama", request: ChatRequest, call: Call) -> Iterator[Dict[str, Any]]:
    """llama-cpp-python's chunks: the role, then the content as it comes,
    then an empty delta with the finish reason. A tool call comes out whole
    (its name and arguments in one delta) once its text is complete. With
    logprobs, each token is its own chunk, given once the answer is complete."""
    if request.arguments_of is not None:
        yield from _stream_arguments(llm, request, call)
        return
    named = _named(request)
    yield _chunk(call, {**_EMPTY, "role": "assistant"} if named else {"role": "assistant"})
    parser = request.parser(call.id)
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


def _stream_arguments(llm: "Llama", request: ChatRequest, call: Call) -> Iterator[Dict[str, Any]]:
    """A named tool_choice under a chat format, streamed as llama-cpp-python
    does: each piece of the arguments as it comes, in ``function_call`` and
    in the one ``tool_calls`` entry."""
    def piece(text: str) -> Dict[str, Any]:
        c = _arguments_call(request, call, text)
        return {"role": None, "content": None, "function_call": {"name": c.name, "arguments": text},
                "tool_calls": [{"index": 0, **c.to_openai()}]}

    yield _chunk(call, {**_EMPTY, "role": "assistant"})
    out: Optional[Completion] = None
    for item in completion.pieces(llm, call):
        if isinstance(item, Completion):
            out = item
        elif call.logprobs is None and item:
            yield _chunk(call, piece(item))
    assert out is not None
    if call.logprobs is not None:
        for c in completion.token_chunks(llm, call, out):
            yield _chunk(call, piece(c["choices"][0]["text"]), logprobs_object(c["choices"][0]["logprobs"]))
    finish = FINISH_REASON[out.stop_reason]
    yield _chunk(call, dict(_EMPTY), None, "tool_calls" if finish == "stop" else finish)


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
