"""``create_completion`` of :class:`pyspec.Llama`: a call's prompt, context
and seed settled (:func:`prepare`), then run by the pyspec generator and
answered in llama-cpp-python's ``text_completion`` dicts, whole
(:func:`whole`) or as a stream of chunks (:func:`stream`). Chat answers are
built from the same run (chat.py).

The prompt is tokenized as llama-cpp-python tokenizes it (control tokens
parsed, BOS where the vocabulary asks, no chat template); ``suffix`` is a
fill-in-the-middle prompt from the model's FIM tokens (pyspec/fim.py);
``finish_reason`` is the server's mapping of pyspec's stop reasons.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union

from .. import request as request_
from ..constraints import Constraint
from ..errors import ContextOverflowError
from ..request import Request
from ..results import Completion
from ..sampling import Sampling
from ..results import FINISH_REASON
from . import options

if TYPE_CHECKING:
    from .llama import Llama


@dataclass
class Call:
    """One completion call, its arguments settled."""

    request: Request
    n_prompt: int
    prompt_text: str  # what echo repeats
    text_offset: int  # llama-cpp-python's first text_offset: len(prompt)
    logprobs: Optional[int]
    echo: bool
    id: str
    created: int
    model: str
    # An empty prompt: llama-cpp-python counts the BOS it starts from as the
    # answer's first token (max_tokens and usage include it; a space after it goes).
    bos_answer: bool = False


def prepare(llm: "Llama", prompt: Union[str, List[int]], *, suffix: Optional[str] = None,
            max_tokens: Optional[int], logprobs: Optional[int], echo: bool, stop, seed: Optional[int],
            model: Optional[str], constraint: Optional[Constraint], sampling: Sampling) -> Call:
    """The call as pyspec runs it: prompt tokens (or a FIM prompt), the
    context check and ``max_tokens`` (None or <= 0: to the end of the
    context), the seed (llama-cpp-python's chain): its :class:`~pyspec.request.Request`."""
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise ValueError(f"logprobs must be an int >= 0 or None, got {logprobs!r}")
    if echo and logprobs is not None:
        options.refuse("echo", echo, "with logprobs: pyspec reports the log-probabilities of generated tokens, "
                       "not of the prompt's")
    target = llm.model
    fill = None
    if suffix is not None:
        if not isinstance(prompt, str):
            raise TypeError("with suffix, the prompt is the text before it: a string, not token ids")
        fill = request_.infill_prompt(target, prompt, suffix, constrained=constraint is not None)
        text = prompt
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
        text = llm.detokenize(list(prompt)).decode("utf-8", errors="ignore")
    else:
        raise TypeError(f"prompt must be a string or a non-empty list of token ids, got {prompt!r}")
    if fill is not None:
        tokens, constraint = request_.for_fill(fill, constraint)
    else:
        tokens = list(target.native.tokenize(prompt, True, True)) if isinstance(prompt, str) else list(prompt)
    n_ctx, n_prompt = llm.n_ctx(), len(tokens)
    try:
        if tokens:  # a vocabulary without BOS reads "" as no tokens: the engine's error then
            request_.check_prompt(tokens, n_ctx, target.n_vocab)
    except ContextOverflowError:  # the rule is request.py's; the wording llama-cpp-python's
        raise ContextOverflowError(f"Requested tokens ({n_prompt}) exceed context window of {n_ctx}") from None
    if max_tokens is None or max_tokens <= 0:
        max_tokens = n_ctx - n_prompt
    max_tokens = min(max_tokens, n_ctx - n_prompt)
    bos_answer = prompt == "" and suffix is None
    if bos_answer:
        max_tokens = max(max_tokens - 1, 1)
    request = Request(tuple(tokens), sampling, llm.generator.drafting(), constraint, max_tokens=max_tokens,
                      stop=request_.stops_of(stop), logprobs=logprobs, seed=llm._call_seed(seed),
                      fill=fill).with_prediction(llm.generator)
    return Call(request, n_prompt, text, len(prompt), logprobs, echo, f"cmpl-{uuid.uuid4()}",
                int(time.time()), model if model is not None else llm.model_path, bos_answer)


def run(llm: "Llama", call: Call) -> Completion:
    out = llm.generator.run(call.request)
    llm.last_stats, llm._last = out.stats, out
    return out


def pieces(llm: "Llama", call: Call) -> Iterator[Union[str, Completion]]:
    """The answer's text as it comes, then its :class:`~pyspec.Completion`.
    Closing this iterator stops the generation."""
    it = llm.generator.stream(call.request)
    try:
        while True:
            try:
                yield next(it)
            except StopIteration as done:
                llm.last_stats, llm._last = done.value.stats, done.value
                yield done.value
                return
    finally:
        it.close()


def generated(llm: "Llama", out: Completion) -> List[int]:
    """The answer's tokens as llama-cpp-python counts them: without the
    end-of-generation token that stopped it."""
    tokens = list(out.tokens)
    if out.stop_reason == "eog" and tokens and llm.model.native.is_eog(tokens[-1]):
        tokens.pop()
    return tokens


def usage(call: Call, n_completion: int) -> Dict[str, int]:
    n_completion += call.bos_answer
    return {"prompt_tokens": call.n_prompt, "completion_tokens": n_completion,
            "total_tokens": call.n_prompt + n_completion}


def logprobs_object(llm: "Llama", tokens: Sequence[int], entries, offset: int) -> Dict[str, Any]:
    """llama-cpp-python's ``logprobs`` of a completion: per token its text,
    offset, log-probability, and the most likely tokens' (the token itself
    among them, as there). The values are the target's, at temperature 1."""
    def text(token: int) -> str:
        return llm.detokenize([token]).decode("utf-8", errors="ignore")

    out: Dict[str, list] = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    for token, (lp, top) in zip(tokens, entries or []):
        s = text(token)
        best = {text(t): v for t, v in top}
        best[s] = lp
        out["tokens"].append(s)
        out["text_offset"].append(offset)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(best)
        offset += len(s)
    return out


def answer_text(call: Call, text: str) -> str:
    return text[1:] if call.bos_answer and text.startswith(" ") else text


def whole(llm: "Llama", call: Call) -> Dict[str, Any]:
    out = run(llm, call)
    tokens = generated(llm, out)
    lp = logprobs_object(llm, tokens, out.logprobs, call.text_offset) if call.logprobs is not None else None
    return {"id": call.id, "object": "text_completion", "created": call.created, "model": call.model,
            "choices": [{"text": (call.prompt_text if call.echo else "") + answer_text(call, out.text), "index": 0,
                         "logprobs": lp,
                         "finish_reason": FINISH_REASON[out.stop_reason]}],
            "usage": usage(call, len(tokens))}


def chunk(call: Call, text: str, logprobs: Any = None, finish_reason: Optional[str] = None) -> Dict[str, Any]:
    return {"id": call.id, "object": "text_completion", "created": call.created, "model": call.model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}]}


def stream(llm: "Llama", call: Call) -> Iterator[Dict[str, Any]]:
    """llama-cpp-python's chunks: text as it comes (``finish_reason`` None),
    then an empty one with the finish reason; no usage. With ``echo`` the
    prompt comes first. With ``logprobs`` each token is its own chunk with its
    log-probabilities, given once the answer is complete."""
    if call.echo and call.prompt_text:
        yield chunk(call, call.prompt_text)
    out: Optional[Completion] = None
    first = True
    for item in pieces(llm, call):
        if isinstance(item, Completion):
            out = item
        elif call.logprobs is None:
            item, first = (answer_text(call, item) if first else item), False
            if item:
                yield chunk(call, item)
    assert out is not None
    if call.logprobs is not None:
        yield from token_chunks(llm, call, out)
    yield chunk(call, "", None, FINISH_REASON[out.stop_reason])


def token_chunks(llm: "Llama", call: Call, out: Completion) -> Iterator[Dict[str, Any]]:
    """One chunk per token, each with its logprobs, cut where the answer's text ends (a stop string)."""
    tokens = generated(llm, out)
    lp = logprobs_object(llm, tokens, out.logprobs, call.text_offset)
    left = out.text
    for i in range(len(lp["tokens"])):
        if not left:
            break
        text = lp["tokens"][i][:len(left)]
        left = left[len(text):]
        yield chunk(call, text, {k: [v[i]] for k, v in lp.items()})
