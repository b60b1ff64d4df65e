"""Python keywords -> :class:`~pyspec.request.Request`: the dialect of
``generate``, ``generate_batch``, ``stream`` and ``infill``.

The keywords are derived from the values they build, not typed by hand:
:class:`~pyspec.Sampling`'s fields, :class:`~pyspec.Drafting`'s fields, the
constraint's (:func:`pyspec.constraints.from_keywords`), and the request's
own below. What each means is pyspec/request.py's.

Quirks of this dialect:

=================  ==========================================================
``prompt``         a string (one user message unless ``chat=False``), chat
                   messages, token ids, or a built FIM prompt
``suffix``         fill in the middle: ``prompt`` is the text before it
``sampling``       a whole :class:`~pyspec.Sampling`; the field keywords change it
``drafting``       a whole :class:`~pyspec.Drafting`; the field keywords change it
``max_tokens``     default :data:`pyspec.settings.MAX_TOKENS`
=================  ==========================================================
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import constraints, fim
from .. import prediction as prediction_
from ..drafting import FIELDS as DRAFTING_KEYS
from ..errors import ContextOverflowError
from ..request import Request, for_fill, infill_prompt, seed_of, stops_of
from ..sampling import Sampling
from ..settings import MAX_TOKENS

if TYPE_CHECKING:
    from ..generation import Generator

SAMPLING_KEYS: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Sampling))
CONSTRAINT_KEYS: Tuple[str, ...] = ("constraint", "json_schema", "grammar", "regex")
#: The request's own keywords (the prompt's form, its limits, FIM, prediction).
REQUEST_KEYS: Tuple[str, ...] = ("sampling", "drafting", "max_tokens", "seed", "stop", "logprobs", "n", "chat",
                                 "suffix", "healing", "prediction")
KEYWORDS: Tuple[str, ...] = REQUEST_KEYS + SAMPLING_KEYS + DRAFTING_KEYS + CONSTRAINT_KEYS
#: The keywords whose absence means something other than None.
DEFAULTS: Dict[str, Any] = {"max_tokens": MAX_TOKENS, "n": 1, "chat": True}


def takes_keywords(*left_out: str) -> Callable:
    """Give an entry that takes ``**settings`` a signature naming each of
    :data:`KEYWORDS` (but ``left_out``), so that ``help()``, editors and the
    docs' checks see the keywords it takes."""
    def document(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        have = {p.name for p in params} | set(left_out)
        params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=DEFAULTS.get(k)) for k in KEYWORDS
                   if k not in have]
        fn.__signature__ = sig.replace(parameters=params)
        return fn
    return document


def requests(generator: "Generator", prompts: Sequence[Any], settings: Dict[str, Any], *,
             infill: Optional[Dict[str, Any]] = None, what: str = "generate") -> List[Request]:
    """One request per prompt, every one with the same settings (``what``:
    the call, named in errors). ``infill``: ``infill()``'s ``extra`` and
    ``layout``, with each prompt the text before the cursor."""
    settings = dict(settings)
    unknown = sorted(set(settings) - set(KEYWORDS))
    if unknown:
        raise TypeError(f"{what}() got unexpected keyword arguments: {', '.join(unknown)}")
    get = settings.get
    sampling = generator.sampling(get("sampling"), **{k: get(k) for k in SAMPLING_KEYS})
    constraint = constraints.from_keywords(get("constraint"), json_schema=get("json_schema"), grammar=get("grammar"),
                                           regex=get("regex"))
    drafting = generator.drafting(get("drafting"), **{k: get(k) for k in DRAFTING_KEYS})
    suffix, healing = get("suffix"), get("healing")
    if suffix is not None and infill is None:
        infill = {}
    if healing is not None and infill is None:
        raise TypeError("healing= acts where a fill-in-the-middle prompt is built: with suffix= or infill() "
                        "(an InfillPrompt has it built in)")
    target = generator.target
    prediction = get("prediction")
    predicted = tuple(prediction_.tokens_of(target, prediction)) if prediction is not None else None
    limits = dict(max_tokens=settings.get("max_tokens", DEFAULTS["max_tokens"]), stop=stops_of(get("stop")),
                  logprobs=get("logprobs"), seed=seed_of(get("seed")), n=settings.get("n", DEFAULTS["n"]))
    out = []
    for prompt in prompts:
        fill = prompt if isinstance(prompt, fim.InfillPrompt) else None
        if infill is not None:
            if not isinstance(prompt, str):
                raise TypeError("suffix= fills in between two texts: the prompt must be the text before it")
            fill = infill_prompt(target, prompt, suffix if suffix is not None else infill["suffix"],
                                 extra=infill.get("extra", ()), layout=infill.get("layout", "still"),
                                 healing=healing, constrained=constraint is not None)
        if fill is not None:
            tokens, wanted = for_fill(fill, constraint)
        else:
            tokens, wanted = generator.prompt_tokens(prompt, chat=settings.get("chat", DEFAULTS["chat"])), constraint
        request = Request(tuple(tokens), sampling, drafting, wanted, fill=fill, prediction=predicted, **limits)
        try:
            request.checked(target.n_ctx, target.n_vocab)
        except ContextOverflowError as e:  # the rule is request.py's; the hint this dialect's
            raise ContextOverflowError(f"{e} (load the model with a larger n_ctx, or shorten the prompt)") from None
        out.append(request.with_prediction(generator))
    return out
