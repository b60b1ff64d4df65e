"""The OpenAI wire format of requests: what a request may say (:func:`parse`
into a :class:`ParsedRequest` and its frozen :class:`RequestSettings`), and
:class:`APIError`, the refusal every layer of the server raises.

Parsing is strict: a field the server does not implement is a 400 that names it
(:class:`APIError`), never silently ignored. A field whose value is the API's own
default (``best_of: 1``, ``n: 1`` …) is accepted, because clients send those
unasked. Sampling follows OpenAI's meaning: only ``temperature`` and ``top_p``
truncate unless the pyspec extensions ``top_k`` and ``min_p`` are given; the
penalties and ``logit_bias`` act as in llama-server (llama_fields.py). What a response says: responses.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..chat import RESERVED
from ..chat.tools import ToolChoice, check_choice, check_tools, tool_constraint, tool_format
from ..constraints import Constraint
from ..errors import ConstraintError
from ..prediction import from_body
from ..request import RequestError, one_constraint
from ..sampling import Sampling
from ..server.api_error import APIError
from . import fields, llama_fields

#: OpenAI's limit on top_logprobs (and on the legacy completions' logprobs).
MAX_TOP_LOGPROBS = 20

@dataclass(frozen=True)
class RequestSettings:
    """One request's settings for every choice it asks for, decided once by
    :func:`parse` (its constraint too: the body's, or its tool calls')."""

    max_tokens: Optional[int]  # None: until the context is full
    sampling: Sampling = Sampling.OPENAI
    seed: Optional[int] = None
    stop: List[str] = field(default_factory=list)
    n: int = 1
    logprobs: Optional[int] = None  # None: off; k: the token's and the k most likely
    draft_max: Optional[int] = None
    policy: Optional[str] = None
    drafter: Optional[str] = None
    constraint: Optional[Constraint] = None  # what the answer must match (pyspec/constraints.py)
    constraint_param: Optional[str] = None   # the field that asked for it ("tools" for calls), named in errors
    prediction: Optional[str] = None         # Predicted Outputs: what the answer will mostly be (prediction.py)


@dataclass
class ParsedRequest:
    kind: str                                  # "completion" or "chat"
    model: Optional[str]
    prompts: List[Union[str, List[int], List[Dict[str, str]]]]  # one per prompt (chat: one message list)
    settings: RequestSettings
    stream: bool = False
    include_usage: bool = False
    user: str = ""                             # the end user (memory is kept per user: users.py)
    tools: Optional[List[Dict[str, Any]]] = None         # chat: tool definitions, for the template
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice("none"))  # chat: what calls are allowed
    tool_format: Optional[str] = None          # chat: the format its calls are parsed from (None: no tools)
    template_vars: Dict[str, Any] = field(default_factory=dict)  # chat: chat_template_kwargs
    suffix: Optional[str] = None               # completion: fill in between prompt and suffix (fim.py)
    healing: Optional[bool] = None             # completion with a suffix: heal the last typed token (request.heals)
    response_fields: Optional[List[str]] = None  # llama-server's: flat "a/b" keys of a whole answer (llama_fields.py)


# ------------------------------------------------------------------ parsing
# Fields accepted when they hold the API's default value (they change nothing).
_NEUTRAL = {
    "best_of": (1, None),
    "echo": (False, None),
    "suffix": (None, ""),  # chat's (a completion's suffix is read: fim.py)
    "functions": (None,),
    "function_call": (None, "none"),
    "store": (False, None),
    "metadata": (None,),
    "service_tier": (None, "auto", "default"),
    "modalities": (None,),
    "audio": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
# Accepted and without effect on the output by the API's own definition.
# (llama-server's: the prompt is always cached, the slot is the one with the longest cached prefix.)
_NO_EFFECT: set = {"cache_prompt", "id_slot", "t_max_prompt_ms"}
# response_format is OpenAI's; json_schema and grammar are llama-server's body fields.
_COMMON = {"user", "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
           "top_k", "min_p", "draft_max", "policy", "drafter", "response_format", "json_schema", "grammar"}
_COMMON |= {"prediction", "n_predict", "samplers", "response_fields"}  # the last three: llama-server's (llama.vim)
_COMMON |= {"frequency_penalty", "presence_penalty", "logit_bias", "repeat_penalty", "repeat_last_n"}
_FIELDS = {
    "completion": _COMMON | {"prompt", "logprobs", "suffix", "healing"},
    "chat": _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                       "parallel_tool_calls", "chat_template_kwargs"},
}


def _prompts(value: Any) -> List[Union[str, List[int]]]:
    """OpenAI's prompt: a string, a list of strings, token ids, or a list of token-id lists."""
    def is_ids(x):
        return isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(value, str):
        return [value]
    if is_ids(value):
        return [list(value)]
    if isinstance(value, list) and value and all(isinstance(p, str) or is_ids(p) for p in value):
        return list(value)
    raise fields.type_error("prompt", "a string, a list of strings, a list of token ids or a list of such lists")


# Message fields the chat template receives as sent (tool-use turns).
_MESSAGE_EXTRAS = ("name", "tool_calls", "tool_call_id", "reasoning_content")


def _messages(value: Any) -> List[Dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise fields.type_error("messages", "a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = _joined(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or text parts", param="messages")
        unknown = sorted(set(m) - {"role", "content", *_MESSAGE_EXTRAS})
        if unknown:
            raise APIError(400, f"messages[{i}]: unsupported field '{unknown[0]}'", param="messages")
        out.append({"role": m["role"], "content": content, **{k: m[k] for k in _MESSAGE_EXTRAS if k in m}})
    return out


def _joined(parts) -> str:
    """Text parts joined as llama-server joins them: a newline between, none after empty text."""
    text = ""
    for part in parts:
        text += ("\n" if text else "") + part
    return text


def _tools(body: Dict[str, Any]) -> Tuple[Optional[List[Dict[str, Any]]], ToolChoice]:
    """Tool definitions (the template shows them to the model) and what the
    request allows (pyspec/chat/tools.py). With ``tool_choice: "none"`` the
    model is not shown them."""
    tools = body.get("tools")
    try:
        if tools is not None:
            tools = check_tools(tools) or None
    except ConstraintError as e:
        raise APIError(400, str(e), param="tools") from None
    try:
        choice = check_choice(body.get("tool_choice"), tools, body.get("parallel_tool_calls"))
    except ConstraintError as e:
        param = "parallel_tool_calls" if "parallel_tool_calls" in str(e) else "tool_choice"
        raise APIError(400, str(e), param=param) from None
    return (tools if choice.mode != "none" else None), choice


def _constraint(body: Dict[str, Any]) -> Tuple[Optional[Constraint], Optional[str]]:
    """The answer's constraint: OpenAI's ``response_format`` ({"type": "text"},
    {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}), or llama-server's ``json_schema`` (a schema) or
    ``grammar`` (GBNF or Lark text); at most one of them."""
    given = [name for name in ("response_format", "json_schema", "grammar") if body.get(name) is not None]
    fmt = body.get("response_format")
    if fmt == {"type": "text"}:
        given.remove("response_format")
    if len(given) > 1:
        raise APIError(400, f"give one of {' and '.join(given)}, not both", param=given[1])
    if not given:
        return None, None
    name = given[0]
    try:
        if name == "grammar":
            if not isinstance(body["grammar"], str):
                raise fields.type_error("grammar", "a string (GBNF or Lark)")
            return Constraint.grammar(body["grammar"]), name
        if name == "json_schema":
            if not isinstance(body["json_schema"], (dict, bool)):
                raise fields.type_error("json_schema", "a JSON schema object")
            return Constraint.json_schema(body["json_schema"]), name
        if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
            raise APIError(400, "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                                "{\"type\": \"json_schema\", \"json_schema\": {...}}", param=name)
        if fmt["type"] == "json_object":
            return Constraint.json_object(), name
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec and "name" not in spec:
            raise APIError(400, "'response_format.json_schema' must be {\"name\", \"schema\", \"strict\"}",
                           param=name)
        return Constraint.json_schema(spec.get("schema", {})), name
    except ConstraintError as e:
        raise APIError(400, f"'{name}': {e}", param=name) from None


def _template_vars(body: Dict[str, Any]) -> Dict[str, Any]:
    extra = body.get("chat_template_kwargs")
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise fields.type_error("chat_template_kwargs", "an object")
    taken = sorted(RESERVED & set(extra))
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set '{taken[0]}'", param="chat_template_kwargs")
    return extra


def _request_constraint(body: Dict[str, Any], tools, choice: ToolChoice,
                        fmt: Optional[str]) -> Tuple[Optional[Constraint], Optional[str]]:
    """The request's one constraint and the field that asked for it (request.one_constraint)."""
    constraint, param = _constraint(body)
    calls = tool_constraint(fmt, tools, choice) if fmt is not None else None
    try:
        return one_constraint(constraint, param, calls, required=choice.mode == "required")
    except RequestError as e:
        raise APIError(400, str(e), param=e.param) from None


def parse(kind: str, body: Any, *, max_n: int, policies: Sequence[str], drafters: Sequence[str],
          max_draft: int, template: Optional[str] = None) -> ParsedRequest:
    """Validate a request body (already JSON-decoded) for ``kind`` ("completion", "chat").
    ``template``: the chat template's source, whose format tool calls take
    (None: the built-in ChatML's, hermes)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name in sorted(body):
        if name in _FIELDS[kind] or name in _NO_EFFECT:
            continue
        if name in _NEUTRAL and body[name] in _NEUTRAL[name]:
            continue
        what = "with this value " if name in _NEUTRAL else ""
        raise APIError(400, f"unsupported parameter '{name}' {what}(pyspec serve does not implement it)", param=name)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise fields.type_error("model", "a string")
    if kind == "chat":
        if "messages" not in body:
            raise APIError(400, "'messages' is required", param="messages")
        prompts: list = [_messages(body["messages"])]
        max_tokens = fields.max_tokens(body, None)
        logprobs = fields.flag(body, "logprobs")
        top = fields.integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top is not None and not logprobs:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        k = (top or 0) if logprobs else None
    else:
        if "prompt" not in body:
            raise APIError(400, "'prompt' is required", param="prompt")
        prompts = _prompts(body["prompt"])
        max_tokens = fields.max_tokens(body, 16)  # OpenAI's default for completions
        suffix = body.get("suffix") or None  # "": none, as clients send it unasked
        if suffix is not None and not isinstance(suffix, str):
            raise fields.type_error("suffix", "a string")
        if suffix is not None and not all(isinstance(p, str) for p in prompts):
            raise APIError(400, "with 'suffix' the prompt is the text before it: a string, not token ids",
                           param="suffix")
        k = fields.integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    stream = fields.flag(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise APIError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise APIError(400, "'stream_options' supports only 'include_usage'", param="stream_options")
        include_usage = bool(options.get("include_usage", False))
    n = fields.integer(body, "n", 1, max_n, default=1)
    if n * len(prompts) > max_n:
        raise APIError(400, f"{len(prompts)} prompts x n={n} choices exceed the server's {max_n} parallel "
                            f"sequences (pyspec serve --parallel)", param="n")
    openai = Sampling.OPENAI  # what a request that names nothing gets
    chain = llama_fields.samplers(body)
    if chain is not None:  # llama-server's way: the chain says which fields act
        sampling = llama_fields.chain_sampling(body, chain, openai)
    else:
        sampling = Sampling(
            temperature=fields.number(body, "temperature", 0.0, 2.0, openai.temperature),
            top_p=fields.number(body, "top_p", 0.0, 1.0, openai.top_p),
            top_k=fields.integer(body, "top_k", 0, default=openai.top_k),
            min_p=fields.number(body, "min_p", 0.0, 1.0, openai.min_p),
            **llama_fields.penalties(body, None),
        )
    if sampling.top_p == 0:
        raise APIError(400, "'top_p' must be > 0", param="top_p")
    tools, choice = _tools(body) if kind == "chat" else (None, ToolChoice("none"))
    fmt = tool_format(template) if tools else None  # a template that does not say: hermes
    constraint, constraint_param = _request_constraint(body, tools, choice, fmt)
    settings = RequestSettings(
        max_tokens=max_tokens,
        sampling=sampling,
        seed=fields.seed(body),
        stop=list(fields.stop(body)),
        n=n,
        logprobs=k,
        draft_max=fields.draft_max(body, max_draft),
        policy=fields.choice(body, "policy", policies),
        drafter=fields.choice(body, "drafter", drafters),
        constraint=constraint,
        constraint_param=constraint_param,
        prediction=_prediction(body),
    )
    user = body.get("user")
    user = "" if user is None else user  # some clients send null
    if not isinstance(user, str):
        raise APIError(400, "'user' must be a string", param="user")
    picked = llama_fields.response_fields(body)
    if kind == "chat":
        return ParsedRequest(kind, model, prompts, settings, stream, include_usage, user, tools=tools,
                             tool_choice=choice, tool_format=fmt, template_vars=_template_vars(body),
                             response_fields=picked)
    return ParsedRequest(kind, model, prompts, settings, stream, include_usage, user, suffix=suffix,
                         response_fields=picked, healing=fields.flag(body, "healing"))


def _prediction(body: Dict[str, Any]) -> Optional[str]:
    try:
        return from_body(body.get("prediction"))
    except ValueError as e:
        raise APIError(400, str(e), param="prediction") from None
