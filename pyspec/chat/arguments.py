"""A hermes call's arguments as the model writes them, before the call ends:
so a client sees a file being written while it is decoded, not after.

A ``<tool_call>`` body under the tools' grammar reads ``{"name": "f",
"arguments": {...}}``. :class:`ArgumentsScanner` finds the name once its string
is closed, then hands out the arguments object's text as it grows, up to the
brace that closes it; it scans each character once (a 10 kB file written
token by token costs 10 kB of scanning, not 10 kB per token). The call's
``arguments`` is then exactly that text (calls.CallParser), so the deltas
add up to the parsed call."""

from __future__ import annotations

import json
import re
from typing import Optional

# The body's head up to the arguments value (the grammar fixes the whitespace;
# a looser head is read too).
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


class ArgumentsScanner:
    """Feed it a call body's text so far (:meth:`scan`, growing); ``name`` is
    set once the head is complete, :meth:`scan` returns the arguments' new
    text each time, and ``closed`` says the object's last brace came."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.closed = False
        self._start = -1      # where the arguments object starts in the body
        self._pos = 0         # body characters scanned so far
        self._depth = 0
        self._in_string = False
        self._escaped = False

    @property
    def started(self) -> bool:
        return self.name is not None

    def scan(self, body: str) -> str:
        """The arguments text that ``body`` (the whole body so far) adds."""
        if self.name is None:
            m = _HEAD.match(body)
            # Only an object streams: arguments written as a JSON string are
            # re-read as JSON when the call is whole.
            if m is None or m.end() >= len(body) or body[m.end()] != "{":
                return ""
            try:
                name = json.loads(m.group(1))
            except ValueError:
                return ""
            self.name, self._start, self._pos = name, m.end(), m.end()
        if self.closed:
            return ""
        begin = self._pos
        for i in range(self._pos, len(body)):
            c = body[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c == "{" or c == "[":
                self._depth += 1
            elif c == "}" or c == "]":
                self._depth -= 1
                if self._depth == 0:
                    self.closed = True
                    self._pos = i + 1
                    return body[begin:self._pos]
        self._pos = len(body)
        return body[begin:]

    def text(self, body: str) -> str:
        """The arguments text scanned so far."""
        return body[self._start:self._pos] if self._start >= 0 else ""
