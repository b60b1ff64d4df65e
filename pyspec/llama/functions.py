"""``chat_format="chatml-function-calling"``: llama-cpp-python's handler of
that name, in one constrained generation.

How it shows tools (the prompt is chat_formats.py's): the system message
lists each tool as ``functions.NAME:`` and its parameter schema, and tells
the model to answer either ``message:`` and text, or one or more
``functions.NAME:`` lines each followed by the call's JSON arguments. The
tools are shown only when ``tool_choice`` is given (not "none"): without it
the chat is plain ChatML (llama-cpp-python's rule, OpenAI's default aside).

What the model may write, by ``tool_choice``:

* a named function: the prompt ends with ``functions.NAME:\\n`` and the answer
  is its arguments, JSON that follows the function's schema; the answer is
  that call (``tool_calls`` and ``function_call``, as there);
* "auto": ``message:`` and free text (the content), or calls, each
  ``functions.NAME:\\n`` and JSON arguments that follow that tool's schema,
  one per line (:func:`constraint`);
* "required" (which llama-cpp-python's handler does not take): calls only.

llama-cpp-python decides "auto" in steps (``message`` or ``functions.NAME``
at temperature 0, then each call's arguments, then whether another call
follows); pyspec's grammar allows the same answers in one generation at the
call's own sampling settings, and streams them too (llama-cpp-python refuses
to stream "auto"). Calls come back as there: ids ``call__{i}_{name}_{cmpl id}``,
``function_call`` beside ``tool_calls`` when there is one call.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..chat.calls import ToolCall
from ..constraints import JSON_WHITESPACE, Constraint

#: The tool format of ChatRequest.tool_format for this handler's answers.
FORMAT = "chatml-functions"
MESSAGE = "message:\n"
CALL = "functions."


def head(name: str) -> str:
    """What opens a call of ``name`` (and ends the prompt of a named tool_choice)."""
    return f"{CALL}{name}:\n"


def _schema(tool: Mapping[str, Any]) -> Dict[str, Any]:
    params = dict(tool["function"].get("parameters") or {"type": "object"})
    return {**params, "x-guidance": {**JSON_WHITESPACE, **dict(params.get("x-guidance") or {})}}


def arguments_constraint(tool: Mapping[str, Any]) -> Constraint:
    """The answer to a named tool_choice: the tool's arguments."""
    return Constraint.json_schema(_schema(tool))


def constraint(tools: Sequence[Mapping[str, Any]], *, required: bool) -> Constraint:
    """The answer under "auto" (a message, or calls) or "required" (calls).
    After its last call the turn may end, or write a newline or
    ``<|im_end|>`` first (the stop string: it ends the answer there)."""
    rules = [f"call_{i}: {json.dumps(head(t['function']['name']), ensure_ascii=False)} %json "
             f"{json.dumps(_schema(t))}" for i, t in enumerate(tools)]
    lines = [("start: calls" if required else f"start: {json.dumps(MESSAGE)} TEXT | calls"),
             "calls: call (\"\\n\" call)* end?",
             'end: "\\n" | "\\n"? "<|im_end|>"',
             "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
             *rules,
             "TEXT: /(.|\\n)*/"]
    return Constraint("lark", "\n".join(lines) + "\n")


def call_id(index: int, name: str, completion_id: str) -> str:
    return f"call__{index}_{name}_{completion_id}"


Event = Tuple[str, Any]  # ("content", text) or ("call", ToolCall): pyspec/chat/tools.py's events


class FunctionsParser:
    """Reads an answer as it comes (:meth:`feed`, then :meth:`finish`), with
    pyspec/chat/calls.py's ``CallParser`` interface: after ``message:\\n``
    its text is content; after ``functions.NAME:\\n`` each call once its JSON
    is complete (one cut short goes); an answer that is neither (a
    response_format's JSON) is content as written."""

    def __init__(self, names: Sequence[str], completion_id: str) -> None:
        self.names = sorted(names, key=len, reverse=True)  # the longest name that matches
        self.completion_id = completion_id
        self._buf = ""
        self._state: Optional[str] = None  # "message", "calls" or "content", once known
        self._decoder = json.JSONDecoder()
        self.n_calls = 0

    def feed(self, text: str) -> List[Event]:
        self._buf += text
        return self._read(final=False)

    def finish(self) -> List[Event]:
        out = self._read(final=True)
        self._buf = ""
        return out

    def _read(self, final: bool) -> List[Event]:
        if self._state is None:
            buf = self._buf
            if buf.startswith(MESSAGE):
                self._state, self._buf = "message", buf[len(MESSAGE):]
            elif buf.startswith(CALL):
                self._state = "calls"
            elif MESSAGE.startswith(buf) or CALL.startswith(buf):
                if not final:
                    return []  # too early to tell
                self._buf, self._state = "", "content"  # cut short in the marker: markup, not content
            else:
                self._state = "content"
        if self._state != "calls":
            text, self._buf = self._buf, ""
            return [("content", text)] if text else []
        return self._calls(final)

    def _calls(self, final: bool) -> List[Event]:
        out: List[Event] = []
        while True:
            rest = self._buf.lstrip("\n")
            name = next((n for n in self.names if rest.startswith(head(n))), None)
            if name is None:
                break
            start = len(head(name))
            try:
                args, end = self._decoder.raw_decode(rest, start)
            except ValueError:
                break  # not complete yet (or cut short: it goes at the end)
            if not isinstance(args, dict):
                break
            call = ToolCall(name, rest[start:end], id=call_id(self.n_calls, name, self.completion_id),
                            index=self.n_calls)
            self.n_calls += 1
            out.append(("call", call))
            self._buf = rest[end:]
        if final:
            self._buf = ""
        return out


def parse(text: str, names: Sequence[str], completion_id: str) -> Tuple[str, List[ToolCall]]:
    """A whole answer's content and calls, exactly as :class:`FunctionsParser` streams them."""
    p = FunctionsParser(names, completion_id)
    events = p.feed(text) + p.finish()
    return "".join(v for k, v in events if k == "content"), [v for k, v in events if k == "call"]
