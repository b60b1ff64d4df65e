"""Tool calls read back out of an answer's text, in the formats chat/tools.py
names (its docstring shows them): :class:`CallParser` is one state machine for
streamed and whole answers, so both give the same calls; :func:`parse_calls`
reads a whole answer with it."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .arguments import ArgumentsScanner
from .tools import FENCE, FORMATS, HERMES_CLOSE, HERMES_OPEN


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object's text
    id: str = ""
    index: int = 0  # its place among the answer's calls
    streamed: int = 0  # characters of ``arguments`` already given out as "call_args" events

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
    """The call a <tool_call> block's body writes (None: it writes none). Its
    arguments are the text the model wrote for them where that is an object:
    what a streamed call's "call_args" events add up to (chat/arguments.py)."""
    try:
        call = _call_of(json.loads(body), ("arguments", "parameters"))
    except ValueError:
        return None
    scanner = ArgumentsScanner()
    scanner.scan(body)
    if call is not None and scanner.closed and scanner.name == call.name:
        call.arguments = scanner.text(body)
    return call


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# ("content", text) or ("call", ToolCall); with stream_arguments also
# ("call_start", ToolCall) and ("call_args", (ToolCall, text)) before its "call".
Event = Tuple[str, Any]


class CallParser:
    """Reads an answer's text as it comes (:meth:`feed`, then :meth:`finish`)
    and returns its events: content text, and each call once it is complete.
    Whitespace between calls and around them is not content. A call that does
    not parse stays in the content as the model wrote it; one the answer ends
    in (hermes) is a call if its JSON is complete, else dropped.

    ``stream_arguments`` (hermes blocks): a call is announced ("call_start",
    with its id, index and name) as soon as its name is written, and its
    arguments follow as "call_args" deltas while they are decoded; its "call"
    event still comes whole, ``streamed`` saying how much of its arguments
    went out (a call cut short by the length limit was announced, and ends
    with no "call")."""

    def __init__(self, fmt: str, names: Sequence[str] = (), *, stream_arguments: bool = False) -> None:
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
        self._stream_arguments = stream_arguments
        self._scanner: Optional[ArgumentsScanner] = None  # the open block's arguments, while streamed
        self._announced: Optional[ToolCall] = None        # the open block's call, once its name came

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
        announced, self._announced, self._scanner = self._announced, None, None
        if announced is not None and announced.name == call.name:
            call.id, call.index, call.streamed = announced.id, announced.index, announced.streamed
        else:
            call.id, call.index = _new_id(), self.n_calls
            self.n_calls += 1
        out.append(("call", call))

    def _stream_open_call(self, out: List[Event]) -> None:
        """The open block's name and new arguments text, as events."""
        if self._scanner is None:
            self._scanner = ArgumentsScanner()
        body = self._buf[len(HERMES_OPEN):]
        delta = self._scanner.scan(body)
        if self._announced is None and self._scanner.started:
            self._announced = ToolCall(self._scanner.name, "", _new_id(), self.n_calls)
            self.n_calls += 1
            self._ws = ""
            out.append(("call_start", self._announced))
        if delta:
            self._announced.streamed += len(delta)
            out.append(("call_args", (self._announced, delta)))

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
                elif self._stream_arguments:
                    self._stream_open_call(out)
                return out
            raw = self._buf[:end + len(HERMES_CLOSE)]
            self._buf = self._buf[end + len(HERMES_CLOSE):]
            self._in_call = False
            call = _hermes_call(raw[len(HERMES_OPEN):-len(HERMES_CLOSE)])
            if call is None:
                self._announced = self._scanner = None
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
        self._announced = self._scanner = None

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
