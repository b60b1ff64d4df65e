"""A request as the scheduler sees it: the :class:`Job` a handler submits (its
prompts, settings and user), the :class:`Choice` sequences it runs as, the
events it sends back, and the refusals (:class:`SchedulerError` and its kinds,
which answer.py's ``http_error`` alone turns into HTTP statuses).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Tuple

from ..generation import SequenceSetup
from ..request import Request

if TYPE_CHECKING:
    from ..fim import EditorStops, Unheal
    from ..memory import Memory


class SchedulerError(Exception):
    """Why the scheduler refused or ended a job (the HTTP layer maps each kind
    to a status: server/answer.py's ``http_error``)."""


class QueueFull(SchedulerError):
    """Too many jobs already wait for a slot; the client may retry soon."""


class ShuttingDown(SchedulerError):
    """The server is stopping and takes no new jobs."""


class JobRefused(SchedulerError):
    """The engine refused one of the job's sequences (e.g. a context overflow)."""


class JobCancelled(SchedulerError):
    """The job was cancelled (its client left) before it started."""


class EngineFailed(SchedulerError):
    """The engine broke; every job in flight ends with this."""


@dataclass
class Choice:
    """One sequence of a job, as the scheduler thread tracks it."""

    index: int
    prompt: List[int]
    seed: int
    handle: int = -1
    slot: int = -1
    setup: Optional[SequenceSetup] = None
    tokens: List[int] = field(default_factory=list)  # emitted, not yet delivered
    text: List[bytes] = field(default_factory=list)
    delivered: int = 0                                # tokens delivered so far
    done: bool = False
    unheal: Optional["Unheal"] = None                 # FIM: the healed text taken off the answer's front
    watch: Optional["EditorStops"] = None             # /infill: the editor's stop rules (n_indent, time)


@dataclass
class Job:
    """One HTTP request. Events on ``events`` (from the scheduler thread):
    ("delta", index, text, tokens, logprobs), ("done", index, result, seed),
    ("error", SchedulerError)."""

    requests: List[Request]           # one per prompt, with the same settings (n samples each)
    loop: asyncio.AbstractEventLoop
    events: "asyncio.Queue[Tuple]" = field(default_factory=asyncio.Queue)
    choices: List[Choice] = field(default_factory=list)
    cancelled: bool = False
    why: str = ""                      # why it was cancelled: "left" (the client), "superseded" (newest.py)
    ended: bool = False                # the scheduler is done with it (answered, refused or dropped)
    warm_up: bool = False              # a client caching a prompt (no tokens asked): admitted after real jobs
    user: str = ""                     # OpenAI's end-user id ("" for one local user): memory and policy follow it
    memory: Optional["Memory"] = None  # the user's, set once admitted: drafts copy from it, answers join it
    admitted: float = 0.0              # time.monotonic() when it left the queue (0: not yet)
    editor: Optional[dict] = None                 # /infill: EditorStops' settings for each choice
    supersedable: bool = False         # an editor's (newest.py): its prompt goes in in chunks, to stop soon

    @property
    def prompts(self) -> List[List[int]]:
        """Token ids, one list per prompt."""
        return [list(r.tokens) for r in self.requests]

    @property
    def prediction(self) -> Optional[Tuple[int, ...]]:
        """Predicted Outputs: the prediction's tokens (None: none)."""
        return self.requests[0].prediction

    @property
    def need(self) -> int:
        """Sequence slots it takes: one per choice."""
        return len(self.requests) * self.requests[0].n

    def cancel(self, why: str = "") -> None:
        """End its sequences at the next round (thread-safe). ``why``: "left"
        (the client is gone) or "superseded" (a newer request of the client's:
        server/newest.py) count it as abandoned work in /metrics."""
        if not self.cancelled:
            self.why = why
        self.cancelled = True

    def send(self, event: Tuple) -> None:
        """Hand the handler an event (from the scheduler's thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the client's event loop is closed: nobody listens
            pass
