"""A ring of chunks that never makes a keystroke wait.

llama.vim sends other files' chunks (``input_extra``, its "ring") with every
suggestion, and a ring update (only the chunks, no text around a cursor)
whenever the user pauses for 3 s and a chunk is queued: when the cursor moves
far, on a yank, a save, a buffer change. A FIM prompt puts the chunks first
(``[extra] PRE prefix SUF suffix MID ...``: fim.py), so a changed ring makes
everything after it stale: the next keystroke would process the cursor's whole
prefix and suffix again (issue 61: 300 to 800 tokens, 5 to 12 s on 2 cores,
the longest waits of a session; llama-server pays the same).

So, per client (newest.client_of):

- A suggestion that continues the client's last prompt (the still layout, at
  most ``CONTINUES`` new tokens with the chunks that prompt had) is served
  with those chunks while newer ones are prepared: its prompt is exact, with a
  ring a few seconds old, as the chunks were when the cursor came to this text.
- The newer chunks are prepared beside it: the same text after the new chunks,
  prefilled as a warm-up with no answer (max_tokens 0). Like every warm-up
  (newest.py, scheduler.py) it runs only while no real request runs or waits,
  the client's next request or warm-up cancels it, and what it prefilled by
  then stays cached (an editor's prompt goes in in chunks), so the next one
  goes on from there. Once one ends, the client's suggestions take the new
  chunks, found cached.
- A ring update prepares the client's last suggestion's text with its chunks
  the same way.
- A suggestion elsewhere (a prompt that does not continue: the cursor moved
  to other text) takes its own chunks at once: it is processed anyway.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Callable, Optional, Sequence, Tuple

from ..fim import InfillPrompt
from ..prefix import common_prefix
from ..wire.llama_server import InfillSource
from .jobs import Job
from .newest import Client

#: Most new tokens a suggestion served with the cached chunks may process: a
#: keystroke's or a new line's; more means the cursor moved to other text.
CONTINUES = 64


@dataclasses.dataclass
class _Client:
    source: InfillSource          # its last suggestion's text, with the chunks its prompt had
    tokens: Sequence[int]         # that prompt
    preparing: Optional[Tuple[Job, InfillSource, Sequence[int]]] = None  # newer chunks being prefilled


class WarmUps:
    """Each client's last prompt and the chunks being prepared for it (the
    most recent ``size`` clients). Lives on the event loop's thread."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._clients: "OrderedDict[Client, _Client]" = OrderedDict()

    def plan(self, client: Client, source: InfillSource, fill: InfillPrompt,
             build: Callable[[InfillSource], InfillPrompt]) -> Tuple[InfillPrompt, Optional[InfillSource]]:
        """The prompt to serve a request with (``fill``, built from ``source``,
        or the same text with the chunks already cached), and the text with
        newer chunks to prepare beside it (None: none). ``build`` makes a
        source's prompt."""
        st = self._clients.get(client)
        if st is not None and st.preparing is not None:
            job, ready, tokens = st.preparing
            if job.ended and not job.cancelled:  # prepared: the new chunks are cached
                st.source, st.tokens, st.preparing = ready, tokens, None
        if source.ring_only:
            if st is None or st.source.extra == source.extra:
                return fill, None
            return fill, dataclasses.replace(st.source, extra=source.extra)
        if st is not None and source.extra != st.source.extra and source.layout == "still":
            kept = dataclasses.replace(source, extra=st.source.extra)
            kept_fill = build(kept)
            if len(kept_fill.tokens) - common_prefix(kept_fill.tokens, st.tokens) <= CONTINUES:
                self._remember(client, kept, kept_fill.tokens)
                return kept_fill, source
        self._remember(client, source, fill.tokens)
        return fill, None

    def preparing(self, client: Client, job: Job, source: InfillSource, tokens: Sequence[int]) -> None:
        """``job`` prefills ``source``'s prompt (``tokens``) for ``client``."""
        st = self._clients.get(client)
        if st is not None:
            st.preparing = (job, source, tokens)

    def _remember(self, client: Client, source: InfillSource, tokens: Sequence[int]) -> None:
        st = self._clients.get(client)
        if st is None:
            st = self._clients[client] = _Client(source, tokens)
        else:
            st.source, st.tokens = source, tokens
        self._clients.move_to_end(client)
        while len(self._clients) > self.size:
            self._clients.popitem(last=False)
