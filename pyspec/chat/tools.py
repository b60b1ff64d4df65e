"""Tool calls: how a chat template's model writes them, the grammar that makes
it write a well-formed one, and the parser that reads them back out of its text.

Formats (chosen from the template's own text, :func:`tool_format`):

* ``hermes`` (Qwen2.5, Hermes, many others):
  ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block
  per call;
* ``llama3`` (Llama 3.1-3.3 JSON tool calling): the whole answer is
  ``{"name": "f", "parameters": {...}}``, maybe after ``<|python_tag|>``;
* ``mistral``: ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]`` (the
  control token does not show in the text).

Under hermes, a whole answer that is one ``{"name": ..., "arguments": ...}``
object naming a tool of the request, bare or in a Markdown ```json block, is
read as that call too: code models of the Qwen2.5 family answer so under
``"auto"`` (llama-server then returns the block as content, and no call).

``tool_choice`` (OpenAI's): ``"none"`` shows the model no tools; ``"auto"``
leaves the text free until the model opens a call, whose body then follows
the grammar of the tools' parameter schemas (a lazy trigger; hermes); with
``"required"`` or a named function the whole answer is a call (hermes, llama3).
The parser is one state machine for streamed and whole answers
(:class:`CallParser`), so both give the same calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..constraints import JSON_WHITESPACE, Constraint
from ..errors import ConstraintError

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
FENCE = "```json"
FORMATS = ("hermes", "llama3", "mistral")


def tool_format(template_source: Optional[str]) -> str:
    """The format a template's model writes calls in (hermes when the template
    does not say: the built-in ChatML template's family)."""
    src = template_source or ""
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or ("ipython" in src and '"parameters"' in src):
        return "llama3"
    return "hermes"


# ------------------------------------------------------------------ request side

@dataclass(frozen=True)
class ToolChoice:
    """What a request allows: ``mode`` "none", "auto" or "required" (a named
    function is "required" with ``name``), and several calls or one."""

    mode: str = "auto"
    name: Optional[str] = None
    parallel: bool = True


def check_tools(tools: Any) -> List[Dict[str, Any]]:
    """OpenAI's ``tools``, validated: each ``{"type": "function", "function":
    {"name", "description"?, "parameters"?}}``. ConstraintError names the field."""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ConstraintError("tools must be a list of tool objects")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ConstraintError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ConstraintError(f"tools[{i}].function.name must be a non-empty string of at most 64 characters")
        if name in names:
            raise ConstraintError(f"tools[{i}].function.name '{name}' is defined twice")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ConstraintError(f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def check_choice(choice: Any, tools: Optional[Sequence[Mapping[str, Any]]], parallel: Any = None) -> ToolChoice:
    """OpenAI's ``tool_choice`` and ``parallel_tool_calls`` against ``tools``."""
    if parallel is not None and not isinstance(parallel, bool):
        raise ConstraintError("parallel_tool_calls must be a boolean")
    par = True if parallel is None else parallel
    names = [t["function"]["name"] for t in tools or []]
    if choice is None:
        return ToolChoice("auto" if names else "none", parallel=par)
    if choice in ("none", "auto", "required"):
        if choice == "required" and not names:
            raise ConstraintError("tool_choice 'required' needs tools")
        return ToolChoice(choice, parallel=par)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise ConstraintError(f"tool_choice names the function {name!r}, which is not among the tools")
        return ToolChoice("required", name=name, parallel=False)
    raise ConstraintError("tool_choice must be 'none', 'auto', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def _call_schema(tools: Sequence[Mapping[str, Any]], name: Optional[str], args_key: str) -> Dict[str, Any]:
    """One call to any of the tools (or the one named): its name, then arguments
    that follow that tool's parameter schema."""
    options = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
                        "required": ["name", args_key], "additionalProperties": False})
    schema: Dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": JSON_WHITESPACE}


def _hermes_required(call_json: str, parallel: bool) -> str:
    """The whole answer is calls (one unless ``parallel``), and the turn may end
    wherever the template's model ends it after a complete call: right after
    its JSON (models that never learnt the closing tag end there, and would
    otherwise be made to write it as text, whose last token may be ">\\n"),
    after the closing tag, or after the newline that follows it. A separator
    that must be followed by another call would leave a model that writes
    ">\\n", or "</tool_call>" then "\\n", no way to stop: it runs to max_tokens
    (issue 48). The parser reads a last call without its closing tag."""
    close = f'"\\n{HERMES_CLOSE}"'
    rules = f'body: "{HERMES_OPEN}\\n" {call_json}\nlast: body ({close} "\\n"?)?\n'
    if not parallel:
        return "start: last\n" + rules
    return f'start: (body {close} "\\n")* last\n' + rules


def tool_constraint(fmt: str, tools: Sequence[Mapping[str, Any]], choice: ToolChoice) -> Optional[Constraint]:
    """The grammar of a request's answer under ``choice`` (None: free text)."""
    if choice.mode == "none" or not tools:
        return None
    if fmt == "hermes":
        call_json = "%json " + json.dumps(_call_schema(tools, choice.name, "arguments"))
        if choice.mode == "required":
            return Constraint("lark", _hermes_required(call_json, choice.parallel))
        # auto: any text, until the model opens a call; then the call's grammar.
        calls = "call*" if choice.parallel else "call?"
        return Constraint("lark", f"start: {calls} TEXT\n"
                                  f"call: opening \"\\n\" {call_json} \"\\n{HERMES_CLOSE}\"\n"
                                  f"opening[lazy]: TEXT \"{HERMES_OPEN}\"\n"
                                  f"TEXT: /(.|\\n)*/\n")
    if fmt == "llama3" and choice.mode == "required":
        return Constraint("lark", "start: %json " + json.dumps(_call_schema(tools, choice.name, "parameters")) + "\n")
    return None  # mistral, and llama3 under auto: parsed, not constrained


# ------------------------------------------------------------------ answer side

@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object's text
    id: str = ""
    index: int = 0  # its place among the answer's calls

    def to_openai(self) -> Dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call_of(obj: Any, args_keys: Tuple[str, ...]) -> Optional[ToolCall]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in args_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):  # some models write the arguments as JSON text
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            if not isinstance(args, dict):
                return None
            return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
    return None


def _hermes_call(body: str) -> Optional[ToolCall]:
    """The call a <tool_call> block's body writes (None: it writes none)."""
    try:
        return _call_of(json.loads(body), ("arguments", "parameters"))
    except ValueError:
        return None


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


Event = Tuple[str, Union[str, ToolCall]]  # ("content", text) or ("call", ToolCall)


class CallParser:
    """Reads an answer's text as it comes (:meth:`feed`, then :meth:`finish`)
    and returns its events: content text, and each call once it is complete.
    Whitespace between calls and around them is not content. A call that does
    not parse stays in the content as the model wrote it; one the answer ends
    in (hermes) is a call if its JSON is complete, else dropped."""

    def __init__(self, fmt: str, names: Sequence[str] = ()) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"tool format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        self.fmt = fmt
        self.names = set(names)  # the request's tools (hermes: a bare or fenced JSON call names one)
        self._buf = ""          # text not yet given out
        self._in_call = False   # hermes: inside <tool_call> ... </tool_call>
        self._ws = ""           # whitespace held back: content only if more content follows
        self._whole: Optional[bool] = None  # llama3/mistral: the answer may be one JSON call (wait for its end)
        self._after_call = False  # no content since the last call
        self.n_calls = 0

    def feed(self, text: str) -> List[Event]:
        self._buf += text
        return self._hermes(final=False) if self.fmt == "hermes" else self._whole_answer(final=False)

    def finish(self) -> List[Event]:
        return self._hermes(final=True) if self.fmt == "hermes" else self._whole_answer(final=True)

    # content, with whitespace held back until something other than a call follows it
    def _content(self, text: str, out: List[Event]) -> None:
        if not text:
            return
        stripped = text.rstrip()
        if not stripped:
            self._ws += text
            return
        out.append(("content", self._ws + stripped))
        self._ws = text[len(stripped):]
        self._after_call = False

    def _call(self, call: ToolCall, out: List[Event]) -> None:
        self._ws = ""
        self._after_call = True
        call.id, call.index = _new_id(), self.n_calls
        self.n_calls += 1
        out.append(("call", call))

    def _hermes(self, final: bool) -> List[Event]:
        out: List[Event] = []
        if self._whole is None and self.names:
            head = self._buf.lstrip()
            if not final and (not head or (len(head) < len(FENCE) and FENCE.startswith(head))):
                return out  # too early to tell
            self._whole = head.startswith(FENCE) or head.startswith("{")
        if self._whole:
            if not final:
                return out
            self._whole = False
            call = self._json_call(self._buf)
            if call is not None:
                self._buf = ""
                self._call(call, out)
                return out
        while True:
            if not self._in_call:
                at = self._buf.find(HERMES_OPEN)
                if at < 0:
                    # Keep back what may be the start of an opening tag; at the
                    # end, one right after a call is a call cut short: it goes.
                    keep = _partial_suffix(self._buf, HERMES_OPEN)
                    if final:
                        cut = keep and self._after_call and not self._buf[:-keep].strip()
                        self._buf, keep = (self._buf[:-keep], 0) if cut else (self._buf, 0)
                    self._content(self._buf[:len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                self._content(self._buf[:at], out)
                self._buf = self._buf[at:]
                self._in_call = True
            end = self._buf.find(HERMES_CLOSE)
            if end < 0:
                if final:
                    self._unclosed(out)
                return out
            raw = self._buf[:end + len(HERMES_CLOSE)]
            self._buf = self._buf[end + len(HERMES_CLOSE):]
            self._in_call = False
            call = _hermes_call(raw[len(HERMES_OPEN):-len(HERMES_CLOSE)])
            if call is None:
                self._content(raw, out)
            else:
                self._call(call, out)

    def _unclosed(self, out: List[Event]) -> None:
        """The answer ended inside a call: one whose JSON is complete is a call
        (the grammar lets a turn end there); one cut short (max_tokens) is
        markup, not content, and goes."""
        call = _hermes_call(self._buf[len(HERMES_OPEN):])
        self._buf, self._in_call = "", False
        if call is not None:
            self._call(call, out)

    def _whole_answer(self, final: bool) -> List[Event]:
        out: List[Event] = []
        if self._whole is None:
            head = self._buf.lstrip()
            marker, opener = ("<|python_tag|>", "{") if self.fmt == "llama3" else ("[TOOL_CALLS]", "[")
            if not final and len(head) < len(marker) and marker.startswith(head):
                return out  # too early to tell (a marker may be on its way)
            head = head[len(marker):].lstrip() if head.startswith(marker) else head
            if not head and not final:
                return out
            self._whole = head.startswith(opener)
        if not self._whole:
            self._content(self._buf, out)
            self._buf = ""
            if final:
                self._ws = ""
            return out
        if not final:
            return out
        calls = self._parse_whole(self._buf)
        if calls is None:
            self._content(self._buf, out)
        else:
            for c in calls:
                self._call(c, out)
        self._buf = ""
        return out

    def _json_call(self, text: str) -> Optional[ToolCall]:
        """A whole answer that is one call to a known tool, bare or fenced."""
        text = text.strip()
        if text.startswith(FENCE):
            if not text.endswith("```"):
                return None
            text = text[len(FENCE):-3].strip()
        try:
            call = _call_of(json.loads(text), ("arguments", "parameters"))
        except ValueError:
            return None
        return call if call is not None and call.name in self.names else None

    def _parse_whole(self, text: str) -> Optional[List[ToolCall]]:
        text = text.strip()
        for marker in ("<|python_tag|>", "[TOOL_CALLS]"):
            if text.startswith(marker):
                text = text[len(marker):].strip()
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        items = obj if isinstance(obj, list) else [obj]
        calls = [_call_of(o, ("parameters", "arguments")) for o in items]
        return calls if calls and all(c is not None for c in calls) else None


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def parse_calls(fmt: str, text: str, names: Sequence[str] = ()) -> Tuple[str, List[ToolCall]]:
    """A whole answer's content (without the calls' markup) and its calls,
    exactly as :class:`CallParser` streams them; ``names``: the request's tools."""
    p = CallParser(fmt, names)
    events = p.feed(text) + p.finish()
    content = "".join(e[1] for e in events if e[0] == "content")  # type: ignore[misc]
    calls = [e[1] for e in events if e[0] == "call"]
    return content, calls  # type: ignore[return-value]
