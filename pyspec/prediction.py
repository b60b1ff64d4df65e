"""Predicted Outputs: text the caller expects the answer to mostly be (OpenAI's
``prediction: {"type": "content", "content": ...}``; an editor's file before a
small edit), used as a draft source.

The prediction becomes the one document of a memory of its own, behind an
anchor (the prompt's last :data:`ANCHOR` tokens): the lookup drafters
(``suffix``, and ``hybrid``'s lookup; cpp/drafters/suffix_drafter.h) match the
text so far in it. At the answer's first position the anchor matches, so the
prediction is drafted at once and in long runs (the ``auto`` policy trusts a
match of >= 32 tokens as copied text); after the answer diverges, the lookup
re-anchors wherever the answer's latest tokens occur in the prediction again.
A draft is only a proposal: every token is the target's, verified as any other
draft, so a prediction changes speed, never the output's law.

Counts (``usage.completion_tokens_details``): ``accepted_prediction_tokens``
is the number of prediction tokens that appear in the answer, in order (the
matching blocks of a diff of the two token lists), and
``rejected_prediction_tokens`` the rest of the prediction, as OpenAI defines
them ("tokens in the prediction that appeared / did not appear in the
completion").
"""

from __future__ import annotations

import difflib
from typing import Any, List, Optional, Sequence, Tuple, Union

from .memory import Memory

#: Prompt tokens put before the prediction, so that the first position matches it.
ANCHOR = 32
#: Drafters that read a memory (the others would ignore a prediction).
READS_MEMORY = ("suffix", "hybrid")

Prediction = Union[str, Sequence[int]]


def tokens_of(model, prediction: Optional[Prediction]) -> List[int]:
    """A prediction's token ids: text is tokenized as the answer would be (no
    BOS, special tokens as text); ids are taken as they are."""
    if prediction is None:
        return []
    if isinstance(prediction, str):
        return model.tokenize(prediction, add_special=False) if prediction else []
    ids = list(prediction)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TypeError("prediction must be text or a list of token ids")
    bad = [t for t in ids if not 0 <= t < model.n_vocab]
    if bad:
        raise ValueError(f"prediction token id {bad[0]} is outside the vocabulary (0..{model.n_vocab - 1})")
    return ids


def memory_for(prompt: Sequence[int], prediction: Sequence[int]) -> Memory:
    """The memory a generation with this prediction drafts from: one document,
    the prompt's tail followed by the prediction (module docstring). Its size
    is the document's (a prediction is at most a file)."""
    doc = list(prompt[-ANCHOR:]) + list(prediction)
    memory = Memory(max(1.0, 64 * len(doc) / 2**20 + 0.5))
    memory.add(doc)
    return memory


def drafter_for(current: str, has_draft_model: bool) -> str:
    """The drafter a predicted generation uses: the decoder's own when it reads
    memory, else the one that does (hybrid beside a draft model, else suffix)."""
    if current in READS_MEMORY:
        return current
    return "hybrid" if has_draft_model else "suffix"


def counts(prediction: Sequence[int], answer: Sequence[int]) -> Tuple[int, int]:
    """(accepted, rejected) prediction tokens of ``answer`` (module docstring)."""
    if not prediction:
        return 0, 0
    matcher = difflib.SequenceMatcher(None, list(prediction), list(answer), autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(prediction) - accepted


def from_body(value: Any) -> Optional[str]:
    """OpenAI's ``prediction`` field as text (None: none): ``{"type":
    "content", "content": str | [{"type": "text", "text": str}, ...]}``.
    Raises ValueError saying what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "content" or "content" not in value \
            or set(value) - {"type", "content"}:
        raise ValueError("'prediction' must be {\"type\": \"content\", \"content\": text or text parts}")
    content = value["content"]
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ValueError("'prediction.content' parts must be {\"type\": \"text\", \"text\": string}")
        return "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ValueError("'prediction.content' must be a string or text parts")
    return content
