"""One answer of the dialects other than OpenAI's (Anthropic Messages, OpenAI
Responses, ollama, llama-server's ``/completion``): a job of one prompt and one
choice, its events read as the parts each dialect writes in its own shape
(pyspec/wire/): text, tool calls (parsed as answer.py parses them for OpenAI),
and the end with its figures (:class:`TurnEnd`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, List, Optional, Sequence, Tuple

from starlette.requests import Request

from ..chat.calls import CallParser
from ..results import FINISH_REASON
from .answer import job_events
from .jobs import Job
from .metrics import Metrics, RequestClock


@dataclass
class TurnEnd:
    """How an answer ended, and its figures."""

    result: Any                 # the core's result (stop_reason, tokens, stats)
    finish: str                 # OpenAI's finish_reason: "stop" or "length"
    stop_word: Optional[str]    # the stop string that ended it (None: another reason)
    n_prompt: int
    n_cached: int               # prompt tokens found in the prompt cache
    n_out: int
    n_calls: int
    tokens: List[int]           # the answer's tokens, as delivered
    logprobs: List[Any]         # with logprobs asked for: per token, (its logprob, [(token, logprob)])

    @property
    def stats(self):
        return self.result.stats


# ("text", str), ("call", ToolCall) or ("end", TurnEnd); before a call, as it is
# decoded: ("call_start", ToolCall) and ("call_args", (ToolCall, str)) (chat/calls.py).
Part = Tuple[str, Any]


class Turn:
    """A job's one answer as parts; ``tool_format`` (None: no tools) and
    ``tool_names`` read its calls, ``stops`` name the stop string that ended it."""

    def __init__(self, job: Job, *, target, metrics: Metrics, clock: RequestClock, tool_format: Optional[str],
                 tool_names: Sequence[str], stops: Sequence[str]) -> None:
        self.job, self.target, self.metrics, self.clock = job, target, metrics, clock
        self.parser = CallParser(tool_format, tool_names, stream_arguments=True) if tool_format else None
        self.stops = list(stops)
        self.n_prompt = len(job.prompts[0])
        self.ended = False  # the answer's end arrived (else: the client left, or it is still coming)
        self.delta: Tuple[List[int], List[Any]] = ([], [])  # the last delta's tokens and logprobs
        clock.choices(1)

    async def parts(self, request: Request, watch: bool) -> AsyncIterator[Part]:
        """The answer's parts; ends without an "end" part when the client left
        (then the job is cancelled). Raises :class:`APIError` for an engine error."""
        tokens: List[int] = []
        logprobs: List[Any] = []
        text = ""
        async for event in job_events(self.job, request, self.clock, 1, watch):
            if event[0] == "delta":
                tokens += event[3]
                logprobs += event[4] or []
                text += event[2]
                self.delta = (event[3], event[4] or [])
                if self.parser is None:
                    if event[2]:
                        yield "text", event[2]
                    continue
                for kind, value in self.parser.feed(event[2]):
                    yield ("text" if kind == "content" else kind), value
            else:
                result = event[2]
                if self.parser is not None:
                    for kind, value in self.parser.finish():
                        yield ("text" if kind == "content" else kind), value
                finish = FINISH_REASON[result.stop_reason]
                self.ended = True
                yield "end", TurnEnd(result, finish, self._stop_word(result, text), self.n_prompt,
                                     result.stats.n_cached_tokens, len(tokens),
                                     self.parser.n_calls if self.parser else 0, tokens, logprobs)

    async def whole(self, request: Request) -> Optional[Tuple[str, List[Any], TurnEnd]]:
        """The whole answer: its text, its calls and its end (None: the client left)."""
        text, calls, end = "", [], None
        async for kind, value in self.parts(request, watch=True):
            if kind == "text":
                text += value
            elif kind == "call":
                calls.append(value)
            elif kind == "end":
                end = value
        return None if end is None else (text, calls, end)

    def _stop_word(self, result, text: str) -> Optional[str]:
        """The stop string that ended the answer: the one its tokens hold right
        after the text delivered (the engine holds a stop string back)."""
        if result.stop_reason != "stop" or not self.stops:
            return None
        full = self.target.detokenize(list(result.tokens))
        rest = full[len(text):] if full.startswith(text) else full
        for s in self.stops:
            if rest.startswith(s) or s in rest:
                return s
        return self.stops[0] if len(self.stops) == 1 else None
