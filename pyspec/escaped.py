"""JSON-escaped views of a prompt's text, so that lookup drafts follow a copy
into a JSON string.

An agent that read a file gets it back as plain text (a tool result) and
writes it, or an edit of it, as a tool call's argument: a JSON string, where
each newline is ``\\n``, each quote ``\\"`` and each backslash ``\\\\``. Lookup
drafters match token ids, so a copy of the plain text breaks at every escape.
For a request under a constraint (a tool call's grammar, a JSON schema) each
long message of the prompt that holds such characters is added to the user's
memory in its escaped form too (``json.dumps``'s escapes, non-ASCII text kept
as it is), tokenized as an answer is: the suffix lookup then follows the copy
through the escapes. A draft is only a proposal the target verifies, so this
changes speed, never the output (the memory lookup's proofs:
tests/test_suffix_memory.py).
"""

from __future__ import annotations

import json
import weakref
from typing import Iterator, List, Sequence

#: Messages shorter than this are not worth a document.
MIN_CHARS = 64
#: Characters json.dumps escapes that text commonly holds, and how many a message
#: needs (a chat template's role header alone has a newline).
ESCAPED = ("\n", '"', "\\", "\t")
MIN_ESCAPES = 3
#: llama.h's LLAMA_TOKEN_ATTR_CONTROL: the chat template's markers, which split messages.
CONTROL = 1 << 3
#: Views a memory is known to hold (hashes), so that a conversation re-sent each turn adds each once.
SEEN_MAX = 4096

_control_ids: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_seen: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def control_ids(model) -> frozenset:
    """The model's control tokens (once per model)."""
    ids = _control_ids.get(model)
    if ids is None:
        native = model.native
        ids = frozenset(t for t in range(model.n_vocab) if native.token_attr(t) & CONTROL)
        _control_ids[model] = ids
    return ids


def messages(model, prompt: Sequence[int]) -> Iterator[str]:
    """The texts between the prompt's control tokens (its messages' contents)."""
    control = control_ids(model)
    start = 0
    for i, t in enumerate(list(prompt) + [-1]):
        if t == -1 or t in control:
            if i > start:
                yield model.detokenize(prompt[start:i])
            start = i + 1


def worth_a_view(model, prompt: Sequence[int]) -> List[str]:
    """The long messages with characters JSON escapes."""
    return [text for text in messages(model, prompt)
            if len(text) >= MIN_CHARS and sum(text.count(c) for c in ESCAPED) >= MIN_ESCAPES]


def escape(text: str) -> str:
    """A text's escaped form, inside the quotes."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def remember(memory, model, prompt: Sequence[int]) -> int:
    """Add the prompt's escaped views that ``memory`` does not hold yet; returns how many."""
    seen = _seen.setdefault(memory, {})
    added = 0
    for text in worth_a_view(model, prompt):  # a message seen before is not escaped nor tokenized again
        key = hash(text)
        if key in seen:
            continue
        memory.add(model.tokenize(escape(text), add_special=False))
        seen[key] = True
        added += 1
        while len(seen) > SEEN_MAX:
            seen.pop(next(iter(seen)))
    return added
