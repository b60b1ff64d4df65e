"""One generation request, whatever door it came in by (issue 58).

Every entry — Python keywords, the CLI, OpenAI's routes, llama-server's
``/infill``, llama-cpp-python's calls — turns what it was given into
:class:`Request` values (its module under ``pyspec/wire/`` does that and
nothing else), and two drivers run them: the in-process
:class:`~pyspec.generation.Generator` and the server's scheduler, both
through ``Generator.setup(request)``.

This module is the one home of what a request *means*:

- a fill-in-the-middle prompt and its healing (:func:`infill_prompt`,
  :func:`heals`): which layout, whether the half-typed word is taken back,
  and that healing is the request's one constraint;
- a Predicted Output becomes drafting (:meth:`Request.with_prediction`: a
  memory of its own and a drafter that reads it) and is counted at the end;
- seed sentinels (:func:`seed_of`: None, -1 and llama.cpp's 0xFFFFFFFF draw
  a fresh seed);
- ``stop`` (:func:`stops_of`: empty strings are dropped, since they would
  stop before the first token);
- no ``-inf`` bias under a constraint (a row could be left with no token);
- the prompt's checks, each with one wording (:class:`PromptError`);
- the finishing step (:meth:`Request.finish`: the healed text taken out of
  the answer, the prediction counted; :meth:`Request.unheal` for a stream).

A request holds one prompt; ``n`` samples of it run together. A batch of
prompts (``generate_batch``, OpenAI's prompt list) is one request per prompt,
built by one call with the same settings.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, List, Optional, Sequence, Tuple

from . import fim
from . import prediction as prediction_
from .constraints import Constraint
from .drafting import Drafting
from .errors import ContextOverflowError
from .results import Completion
from .sampling import Sampling
from .settings import MAX_TOKENS, check_seed

if TYPE_CHECKING:
    from .generation import Generator

#: Seeds that mean "draw a fresh one": llama.cpp's LLAMA_DEFAULT_SEED and -1,
#: which llama-server, llama-cpp-python and their clients send for it.
FRESH_SEEDS = (-1, 0xFFFFFFFF)


class RequestError(ValueError):
    """Settings of a request that cannot go together; ``param`` names the
    field a client would change."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class PromptError(ValueError):
    """A prompt no model can read: empty, or with ids outside the vocabulary.
    (One longer than the context: :class:`~pyspec.ContextOverflowError`.)"""


@dataclass(frozen=True)
class Request:
    """One prompt and everything that decides its answer.

    ``tokens``: the prompt as the target reads it (a FIM prompt laid out and
    healed: ``fill``). ``sampling``, ``drafting`` (None: plain decoding) and
    ``constraint`` (the one constraint: the caller's, or healing's) are
    resolved. ``max_tokens`` None runs to the end of the context. ``seed``
    None draws a fresh one when the request runs. ``prediction``: a Predicted
    Output's tokens (drafted from, never trusted; counted by :meth:`finish`)."""

    tokens: Tuple[int, ...]
    sampling: Sampling = Sampling.API
    drafting: Optional[Drafting] = None
    constraint: Optional[Constraint] = None
    max_tokens: Optional[int] = MAX_TOKENS
    stop: Tuple[str, ...] = ()
    logprobs: Optional[int] = None
    seed: Optional[int] = None
    n: int = 1
    fill: Optional["fim.InfillPrompt"] = None
    prediction: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.constraint is not None and any(b == float("-inf") for _, b in self.sampling.logit_bias):
            # Forbidding every token the constraint allows would leave a row with none.
            raise RequestError("logit_bias may not forbid tokens (-inf, false) under a grammar, schema, tool call "
                               "or healing: give a finite bias such as -100", "logit_bias")

    @property
    def heal(self) -> str:
        """The healed text the answer begins with and the answer shown leaves out ("": none)."""
        return self.fill.heal if self.fill is not None else ""

    def unheal(self) -> "fim.Unheal":
        """A new cutter of one streamed answer: drops the healed text from its front."""
        return fim.Unheal(self.heal)

    def finish(self, out: Completion) -> Completion:
        """The answer as the caller sees it: the healed text taken out (also
        from an answer cut inside it), the prediction's tokens counted."""
        changes: dict = {}
        if self.heal:
            changes["text"] = self.fill.visible(out.text)
        if self.prediction is not None:
            accepted, rejected = prediction_.counts(self.prediction, out.tokens)
            changes.update(accepted_prediction_tokens=accepted, rejected_prediction_tokens=rejected)
        return dataclasses.replace(out, **changes) if changes else out

    def with_prediction(self, generator: "Generator") -> "Request":
        """This request drafting from its prediction (pyspec/prediction.py): a
        memory of its own (the prompt's tail, then the prediction), and a
        drafter that reads memory. Plain decoding stays plain."""
        if not self.prediction or self.drafting is None:
            return self
        drafter = prediction_.drafter_for(self.drafting.drafter or generator.drafter, generator.has_draft_model)
        drafting = dataclasses.replace(self.drafting, drafter=drafter,
                                       prediction_memory=prediction_.memory_for(self.tokens, self.prediction))
        return dataclasses.replace(self, drafting=drafting)

    def checked(self, n_ctx: int, n_vocab: int) -> "Request":
        """This request, if its prompt fits a context of ``n_ctx`` cells with
        room for an answer and its ids lie in the vocabulary; else
        :class:`PromptError` or :class:`~pyspec.ContextOverflowError` (ValueErrors)."""
        check_prompt(self.tokens, n_ctx, n_vocab)
        return self


def check_prompt(tokens: Sequence[int], n_ctx: int, n_vocab: int) -> None:
    """The prompt checks of every entry, each with one wording."""
    if not tokens:
        raise PromptError("the prompt is empty")
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        raise PromptError(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
    if len(tokens) >= n_ctx:
        raise ContextOverflowError(f"This model's maximum context length is {n_ctx} tokens; the prompt has "
                                   f"{len(tokens)}")


def seed_of(value) -> Optional[int]:
    """A request's seed: None (a fresh one drawn when it runs) for None and
    the sentinels :data:`FRESH_SEEDS`; else a seed the core takes
    (:func:`pyspec.settings.check_seed`)."""
    if value is None:
        return None
    try:
        if not isinstance(value, bool) and operator.index(value) in FRESH_SEEDS:
            return None
    except TypeError:
        pass  # not an integer: check_seed says so
    return check_seed(value)


def stops_of(stop: Optional[Iterable[str]]) -> Tuple[str, ...]:
    """Stop strings (a string is one). An empty string is dropped: it would
    match before the first token (clients send ``""`` for none)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    stop = list(stop)
    if not all(isinstance(s, str) for s in stop):
        raise TypeError("stop must be a string or a list of strings")
    return tuple(s for s in stop if s)


def one_constraint(answer: Optional[Constraint], param: Optional[str], calls: Optional[Constraint], *,
                   required: bool) -> Tuple[Optional[Constraint], Optional[str]]:
    """The request's one constraint and the field that asked for it: the
    answer's format (``answer``, asked for by ``param``: a schema, grammar or
    response format), else its tool calls' grammar (``calls``; with a format,
    calls are only parsed). A call ``required`` beside a constrained answer
    is a :class:`RequestError`."""
    if calls is None:
        return answer, param if answer is not None else None
    if answer is None:
        return calls, "tools"
    if required:
        raise RequestError(f"tool_choice requires a call, and '{param}' constrains the answer otherwise: give one "
                           f"of them", "tool_choice")
    return answer, param


def heals(requested: Optional[bool], *, constrained: bool, layout: str = "still") -> bool:
    """Whether a FIM prompt heals its last typed token (:func:`pyspec.fim.heal`):
    as ``requested``, by default wherever the request has no constraint of
    its own (healing is one, and a request takes one). Only the still layout
    heals: llama-server's puts the typed text before the suffix, whole.
    Asking for what cannot be is a ValueError."""
    if requested and layout != "still":
        raise RequestError("healing is the still layout's: llama-server's puts the typed text before the suffix, "
                           "whole", "healing")
    if requested and constrained:
        raise RequestError("token healing constrains the answer itself: a fill-in-the-middle request with a JSON "
                           "schema, grammar or regex takes healing=False", "healing")
    if layout != "still":
        return False
    return not constrained if requested is None else bool(requested)


def infill_prompt(target, prefix: str, suffix: str, *, typed: Optional[str] = None,
                  extra: Sequence["fim.Chunk"] = (), layout: str = "still", healing: Optional[bool] = None,
                  constrained: bool = False, n_batch: Optional[int] = None,
                  n_predict: int = -1) -> "fim.InfillPrompt":
    """The FIM prompt of a request (pyspec/fim.py): the text between
    ``prefix`` and ``suffix``; ``typed`` is the cursor line's typed part
    (None: ``prefix``'s last line, as a caller that gives the text before the
    cursor whole). Healing as :func:`heals` decides. Raises
    :class:`pyspec.fim.FimUnsupported` for a model without FIM tokens."""
    heal = heals(healing, constrained=constrained, layout=layout)
    if typed is None:
        cut = prefix.rfind("\n") + 1
        prefix, typed = prefix[:cut], prefix[cut:]
    return fim.build(target, prefix, suffix, typed=typed, extra=extra, layout=layout, healing=heal,
                     n_batch=target.native.n_batch if n_batch is None else n_batch, n_predict=n_predict)


def for_fill(fill: "fim.InfillPrompt", constraint: Optional[Constraint]) -> Tuple[List[int], Optional[Constraint]]:
    """A FIM prompt's tokens and the request's one constraint: healing's
    where it heals (the caller's must then be None), else the caller's."""
    if fill.heal and constraint is not None:
        raise RequestError("a healed FIM prompt takes no other constraint (build it with healing=False)", "healing")
    return list(fill.tokens), constraint or fill.constraint()
