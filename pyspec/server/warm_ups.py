"""An editor's ring warm-up that also prepares its next suggestion.

llama.vim sends its ring of chunks (other files' text) whenever the user
pauses for 3 s (its ``ring_update``: only ``input_extra``, no text around a
cursor), so that they are cached before the next suggestion. But a FIM prompt
puts the chunks first (``[extra] PRE prefix SUF suffix MID ...``: fim.py), so
a changed ring makes everything after it stale: the next keystroke's request
processes its whole prefix and suffix again (issue 61: 300 to 800 tokens, 5 to
12 s on 2 cores, the longest waits of a session). llama-server pays the same.

So when a client's ring warm-up brings chunks other than its last
suggestion's, the server also prefills that suggestion's text after the new
chunks: a second warm-up, with no answer (max_tokens 0). The next keystroke
on that line then finds all but its new characters cached. It is cache work
on the client's behalf only: every answer is its own request's. Like every
warm-up (newest.py, scheduler.py) it runs only while no real request runs or
waits, and the client's next request or warm-up cancels it; what it prefilled
by then stays cached (an editor's prompt goes in in chunks).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Optional

from ..wire.llama_server import InfillSource
from .newest import Client


class WarmUps:
    """Each client's last suggestion's text (the most recent ``size`` clients)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._last: "OrderedDict[Client, InfillSource]" = OrderedDict()

    def note(self, client: Client, source: InfillSource) -> Optional[InfillSource]:
        """Take in a request's text. For a ring update whose chunks differ from
        the client's last suggestion's, returns that suggestion's text with the
        new chunks, to prefill beside it; else None."""
        if not source.ring_only:
            self._last[client] = source
            self._last.move_to_end(client)
            while len(self._last) > self.size:
                self._last.popitem(last=False)
            return None
        last = self._last.get(client)
        if last is None or last.extra == source.extra:
            return None  # nothing to prepare, or its prompt is cached as it is
        self._last[client] = dataclasses.replace(last, extra=source.extra)
        return self._last[client]
