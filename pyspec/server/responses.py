"""The OpenAI wire format of responses: ids, ``finish_reason``, ``usage``,
llama.cpp's ``timings`` and the log-probability objects, as functions of a
request's results (answer.py puts them together, whole or streamed).

Log-probabilities are the **target's**, at temperature 1 and without truncation
(``token_logprobs`` in ``cpp/core/sampling.h``), as OpenAI reports them;
drafting does not change them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..prediction import counts
from ..results import FINISH_REASON  # noqa: F401  (the server's modules read it here)


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())


def usage(n_prompt: int, n_completion: int, n_cached: int = 0) -> Dict[str, Any]:
    """OpenAI's usage, with the prompt tokens found in the prompt cache as
    OpenAI reports them (prompt_tokens_details.cached_tokens)."""
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion,
            "prompt_tokens_details": {"cached_tokens": n_cached}}


def timings(stats: Sequence[Any], n_prompt: int, n_cached: int = 0, n_decoded: Optional[int] = None) -> Dict[str, float]:
    """llama.cpp's `timings` over a request's choices (stats: each choice's
    GenerationStats). prompt_ms: until the first token (queue wait included);
    predicted_ms: from then to the last token, the slowest choice; cache_n: the
    prompt tokens found cached, prompt_n the ones processed (llama-server's
    split; ``n_decoded``, where a request cut short never reached the rest:
    by default n_prompt - n_cached)."""
    n_decoded = n_prompt - n_cached if n_decoded is None else n_decoded
    prompt_ms = 1000 * max((s.ttft_s for s in stats), default=0.0)
    predicted_n = sum(s.n_generated for s in stats)
    predicted_ms = 1000 * max((s.decode_s for s in stats), default=0.0)
    after_first = sum(max(s.n_generated - 1, 0) for s in stats)
    return {
        "cache_n": n_cached,
        "prompt_n": n_decoded,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / n_decoded if n_decoded > 0 else 0.0,
        "prompt_per_second": 1000 * n_decoded / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / after_first if after_first else 0.0,
        "predicted_per_second": 1000 * after_first / predicted_ms if predicted_ms > 0 else 0.0,
        "draft_n": sum(s.drafted for s in stats),
        "draft_n_accepted": sum(s.accepted for s in stats),
        # pyspec's own: drafts copied from the user's memory (suffix drafter)
        "draft_memory_rounds": sum(s.memory_rounds for s in stats),
        "draft_memory_n": sum(s.memory_drafted for s in stats),
        # TEST-ONLY (TestControls.pit): each decided token's PIT under its target row
        **({"pit": [u for s in stats for u in s.pit]} if any(s.pit for s in stats) else {}),
    }


def prediction_details(prediction: Sequence[int], answers: Sequence[Sequence[int]]) -> Dict[str, int]:
    """OpenAI's completion_tokens_details of a request with a prediction: its
    accepted and rejected prediction tokens (pyspec/prediction.py), summed over
    the choices."""
    pairs = [counts(prediction, answer) for answer in answers]
    return {"reasoning_tokens": 0, "accepted_prediction_tokens": sum(a for a, _ in pairs),
            "rejected_prediction_tokens": sum(r for _, r in pairs)}


LogprobEntry = Tuple[float, List[Tuple[int, float]]]


def chat_logprobs(entries: Sequence[LogprobEntry], tokens: Sequence[int], piece) -> Dict[str, Any]:
    """Chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}.
    ``piece(token) -> bytes`` renders a token."""
    def one(tok: int, lp: float) -> Dict[str, Any]:
        b = piece(tok)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    content = []
    for tok, (lp, top) in zip(tokens, entries):
        d = one(tok, lp)
        d["top_logprobs"] = [one(t, v) for t, v in top]
        content.append(d)
    return {"content": content}


def completion_logprobs(entries: Sequence[LogprobEntry], tokens: Sequence[int], piece,
                        offset: int = 0) -> Dict[str, Any]:
    """The legacy completions' logprobs object (tokens, token_logprobs, top_logprobs,
    text_offset); ``offset`` is where the first token's text begins."""
    out: Dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, (lp, top) in zip(tokens, entries):
        text = piece(tok).decode("utf-8", errors="replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({piece(t).decode("utf-8", errors="replace"): v for t, v in top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out
