"""Fill-in-the-middle (FIM): the prompt that asks a coder model for the text
between a prefix and a suffix, built from the model's own FIM tokens
(``llama_vocab_fim_*``: the GGUF's keys, or found by their text when llama.cpp
loaded the vocabulary), and the editor's stop rules.

Two layouts, which differ only in where the typed part of the cursor line
(``typed``, llama-server's ``prompt``) goes:

``"still"`` (pyspec's default)::

    [extra] [BOS] PRE prefix SUF suffix MID lines typed

    The typed text follows MID, where the model itself would have written it,
    after the last few lines before it (``lines``: :func:`split_middle`). A
    keystroke then only appends to the prompt, and so does moving on to the
    next line: the prefix and suffix stay put, so a cached prompt is reused up
    to the last keystroke and only the new characters are processed. The suffix's
    budget does not depend on the typed length for the same reason. The last
    typed token is healed (:func:`heal`): a half-typed word, an indentation
    or a trailing space goes on as the model would tokenize the finished
    text. Healing changes the law sampled
    (:func:`heal` says how); ``healing=False`` (a request's ``healing``
    field) keeps the typed tokens and the plain FIM law.

``"llama-server"`` (llama.cpp's ``format_prompt_infill``)::

    [extra] [BOS] PRE prefix typed SUF suffix MID

    The typed text ends the prefix, and its length is charged to the suffix's
    budget: every keystroke changes the tokens before SUF and the suffix's
    length, so the whole suffix is processed again. Kept for comparisons
    (tests/fixtures/infill: its renderings are byte-equal to llama-server's
    token layout) and for clients that want its tokens.

In both, as in llama-server: each piece is tokenized on its own (no special
tokens parsed in code), the prefix keeps its last ``3 * (n_batch // 4)``
tokens (``"still"``: from a line anchored by its content within them,
:func:`anchored`, so that the cut does not move with every new line), the suffix its first ``n_batch // 4 - 2`` (``"llama-server"``: less
the typed tokens), and the extra context (other files' chunks: REP
``myproject\\n``, then per chunk SEP ``filename\\n`` text, then SEP
``filename\\n``; without SEP each chunk follows a ``--- snippet ---`` line)
keeps its last ``n_ctx - n_batch - 2 * n_predict`` tokens.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .constraints import Constraint

LAYOUTS = ("still", "llama-server")
_SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's chunk header when the model has no file separator


class FimUnsupported(ValueError):
    """The model has no prefix, suffix or middle token: it was not trained to fill in."""


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM tokens (None where it has none)."""

    pre: Optional[int]
    suf: Optional[int]
    mid: Optional[int]
    pad: Optional[int] = None
    rep: Optional[int] = None
    sep: Optional[int] = None

    @classmethod
    def of(cls, model) -> "FimTokens":
        """The tokens of ``model`` (a :class:`pyspec.Model` or its native core model)."""
        native = getattr(model, "native", model)
        ids = native.fim_tokens
        return cls(**{k: (v if v >= 0 else None) for k, v in ids.items()})

    def missing(self) -> List[str]:
        """The names of the required tokens the vocabulary lacks."""
        return [name for name in ("prefix", "suffix", "middle") if getattr(self, name[:3]) is None]

    def check(self) -> "FimTokens":
        """Self, or :class:`FimUnsupported` naming what is missing (llama-server's wording)."""
        missing = self.missing()
        if missing:
            raise FimUnsupported("Infill is not supported by this model: "
                                 + " ".join(f"{name} token is missing." for name in missing))
        return self


@dataclass(frozen=True)
class Chunk:
    """Extra context: a piece of another file (or of this one, far from the cursor)."""

    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class InfillPrompt:
    """A FIM prompt's tokens. ``heal``: text the answer must begin with (the
    healed last typed token, :func:`heal`; "" for none), not shown to the user:
    :meth:`visible` strips it. ``cut``: tokens the budgets dropped."""

    tokens: List[int]
    layout: str
    heal: str = ""
    cut: int = 0
    n_extra: int = 0  # extra-context tokens kept at the front

    def constraint(self) -> Optional[Constraint]:
        """What healing asks of the answer: that it begin with :attr:`heal`."""
        if not self.heal:
            return None
        return Constraint.regex(re.escape(self.heal) + r"(?s:.*)")

    def visible(self, text: str) -> str:
        """An answer's text after the cursor: the healed characters dropped, as
        a stream drops them (:class:`Unheal`), also from an answer that ends
        inside them."""
        return Unheal(self.heal)(text)


def extra_tokens(model, fim: FimTokens, chunks: Sequence[Chunk]) -> List[int]:
    """The extra context's tokens, as llama-server lays them out."""
    out: List[int] = []
    if fim.rep is not None:
        out += [fim.rep] + model.tokenize("myproject\n", add_special=False)
    for chunk in chunks:
        if fim.sep is not None:
            out += [fim.sep] + model.tokenize(chunk.filename + "\n", add_special=False)
        else:
            out += model.tokenize(_SNIPPET, add_special=False)
        out += model.tokenize(chunk.text, add_special=False)
    if fim.sep is not None:
        out += [fim.sep] + model.tokenize("filename\n", add_special=False)
    return out


def anchored(model, prefix: str, budget: int) -> str:
    """The part of ``prefix`` a ``"still"`` prompt keeps: from the earliest
    anchor line within ``budget`` tokens of the end. Anchors are lines chosen
    by their content (a hash of the line: about four per budget), not by
    their distance from the cursor, so the kept text starts at the same
    line while the user adds lines below (or a plugin's window of lines above
    slides), and the prompt stays cached; it moves, to a later anchor, only when
    the budget forces it. Cutting the last ``budget`` tokens instead (as
    llama-server does) moves the start with every new line, and every token
    after it is processed again."""
    lines = prefix.splitlines(keepends=True)
    sizes = [len(model.tokenize(line, add_special=False)) for line in lines]
    if sum(sizes) <= budget:
        return prefix
    fits, kept = len(lines), 0
    while fits > 0 and kept + sizes[fits - 1] <= budget:
        fits -= 1
        kept += sizes[fits]
    # About four anchors per budget (~10 tokens a line); sparser ones first, so that
    # a denser kind only decides where the sparser has none in reach.
    every = max(1, budget // 40)
    while every >= 1:
        for i in range(fits, len(lines)):
            if _is_anchor(lines[i], every):
                return "".join(lines[i:])
        every //= 2
    return "".join(lines[fits:])


def _is_anchor(line: str, every: int) -> bool:
    # Blank lines all hash alike: none is an anchor, or every one would be.
    return bool(line.strip()) and zlib.crc32(line.encode("utf-8", errors="replace")) % every == 0


#: Most lines before the cursor's that a "still" prompt puts after MID (split_middle).
MIDDLE_LINES = 16


def split_middle(prefix: str) -> Tuple[str, str]:
    """``prefix`` as (what goes before SUF, what goes after MID): the last few
    lines move behind MID, with the typed part of the cursor line, from an
    anchor line (by content, as :func:`anchored` picks, about one line in
    eight) among the last :data:`MIDDLE_LINES`. So accepting a suggestion and
    going on to the next line (an editor's prefetch) appends to the prompt
    too, instead of changing the prefix and with it every token of the suffix;
    the split moves, and the suffix is processed again, about once every eight
    lines. The earliest such anchor is taken, so that a new line below does not
    move it."""
    lines = prefix.splitlines(keepends=True)
    if not lines or not lines[-1].endswith("\n"):
        return prefix, ""  # not whole lines: a caller's own split, kept
    first = max(0, len(lines) - MIDDLE_LINES)
    every = 8
    while every >= 1:
        for i in range(first, len(lines)):
            if _is_anchor(lines[i], every):
                return "".join(lines[:i]), "".join(lines[i:])
        every //= 2
    return prefix, ""


#: What healing takes back (:func:`heal`): the typed text's last piece as the
#: tokenizer would cut the finished text: trailing blanks, else a word with the
#: character before it (" retur", ".app", "(sel"), else a run of punctuation
#: with a space before it (" =", "():"). Never a line break.
_TAIL = re.compile(r"(?:[^\S\n]+|[^\w\n]?\w+|[^\S\n]?[^\w\s]+)\Z")
#: Most tokens healing takes back (a long identifier is written again under the mask).
MAX_HEALED_TOKENS = 8


def heal(model, typed_tokens: List[int]) -> Tuple[List[int], str]:
    """Token healing at the cursor: the tokens of the typed text's last piece
    (:data:`_TAIL`) are taken back and the answer must begin with their text.
    A prompt should end where the model's tokenizer would cut the finished
    text, and a cursor rarely is there: "retur" is " ret" + "ur", and after
    " ret" the model does not write "urn" (" return" is one token); an
    indentation before a word is "   " + " return", never "    " + "return" (a
    prompt ending in the four-space token is text the model never saw go on,
    and it answers with nothing or an extra space); "foo(" goes on as
    "(self". Taking back the whole piece ends the prompt at such a cut.
    Returns the tokens kept and the text taken (up to
    :data:`MAX_HEALED_TOKENS` tokens, never one holding a line break).

    What is then sampled: the target's rows after the healed prompt (the typed
    text without those tokens), each masked to the tokens that keep the
    answer on the taken text (``InfillPrompt.constraint``) and renormalised,
    until the answer has written it. That is masking, not conditioning: it is
    not the target's law given that the answer begins with the text (which
    would weigh each first token by how likely its continuations are to match),
    and the prompt lacks its last typed tokens. Under speculation it is kept
    exactly, as every constraint is. The answer shown leaves the taken text
    out (:class:`Unheal`, :meth:`InfillPrompt.visible`). ``healing=False`` keeps
    the typed tokens and samples the plain FIM law (``pyspec.request.heals``)."""
    if not typed_tokens:
        return typed_tokens, ""
    tail = _TAIL.search(model.detokenize(typed_tokens))
    need = len(tail.group(0)) if tail else 0
    native = getattr(model, "native", model)
    taken, text, raw = 0, "", b""
    while need > len(text) and taken < min(MAX_HEALED_TOKENS, len(typed_tokens)):
        # The tokens' own bytes: detokenizing a tail would drop a SentencePiece
        # vocabulary's leading space, which the answer must write again.
        raw = native.token_to_piece(typed_tokens[len(typed_tokens) - taken - 1]) + raw
        more = raw.decode("utf-8", errors="replace")
        if "\n" in more or "\ufffd" in more:  # a line break, or part of a character's bytes
            break
        taken, text = taken + 1, more
    if taken == 0:
        return typed_tokens, ""
    return typed_tokens[:len(typed_tokens) - taken], text


def build(model, prefix: str, suffix: str, *, typed: str = "", extra: Sequence[Chunk] = (),
          n_batch: int = 1024, n_predict: int = -1, layout: str = "still",
          healing: bool = True) -> InfillPrompt:
    """The FIM prompt of ``model`` for the text between ``prefix`` and
    ``suffix``, the cursor line's typed part being ``typed`` (module
    docstring). ``healing`` heals the last typed token in the still layout
    (whether a request heals is pyspec/request.py's ``heals``). Raises
    :class:`FimUnsupported` for a model without FIM tokens."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    fim = FimTokens.of(model).check()
    n_batch = max(int(n_batch), 8)
    if layout == "still":
        prefix, lines = split_middle(prefix)
        typed = lines + typed
        prefix = anchored(model, prefix, 3 * (n_batch // 4) - 16)  # room: a whole text may take more
    pre = model.tokenize(prefix, add_special=False)
    suf = model.tokenize(suffix, add_special=False)
    typed_ids = model.tokenize(typed, add_special=False, parse_special=layout == "llama-server") if typed else []
    healed = ""
    if layout == "still" and healing:
        typed_ids, healed = heal(model, typed_ids)
    take_pre = min(len(pre), 3 * (n_batch // 4))
    room = n_batch // 4 - 2 - (len(typed_ids) if layout == "llama-server" else 0)
    take_suf = min(len(suf), max(0, room))
    cut = len(pre) - take_pre + len(suf) - take_suf
    pre, suf = pre[len(pre) - take_pre:], suf[:take_suf]
    ex = extra_tokens(model, fim, extra)  # its header even without chunks, as llama-server
    n_ctx = model.n_ctx
    budget = max(0, n_ctx - n_batch - 2 * n_predict) if n_predict >= 0 else max(0, n_ctx - n_batch + 2)
    if len(ex) > budget:
        cut += len(ex) - budget
        ex = ex[len(ex) - budget:]
    bos = [model.native.bos] if model.native.add_bos and model.native.bos >= 0 else []
    if layout == "still":
        tokens = ex + bos + [fim.pre] + pre + [fim.suf] + suf + [fim.mid] + typed_ids
    else:
        tokens = ex + bos + [fim.pre] + pre + typed_ids + [fim.suf] + suf + [fim.mid]
    return InfillPrompt(tokens, layout, healed, cut, len(ex))


@dataclass
class EditorStops:
    """llama-server's editor stop rules, judged on the answer's text as it grows
    (:meth:`feed` each piece; False: stop now). Both cut only at a line's end,
    never inside a line the user would see half of:

    ``n_indent``: once the answer has a newline, a later line whose first
    non-blank character comes before column ``n_indent`` (a tab counts one)
    ends the answer, and that line's text is dropped (:meth:`final`): the
    completion stays inside the block the cursor is in.
    ``t_max_predict_ms``: a piece holding a newline, that many milliseconds or
    more after the first piece, ends the answer (the newline kept)."""

    n_indent: int = 0
    t_max_predict_ms: float = -1
    skip: int = 0  # characters at the front that the user does not see (InfillPrompt.heal)
    text: str = ""
    cut_at: Optional[int] = None  # where the n_indent rule cut the text
    stopped: bool = False
    _t0: Optional[float] = None
    _line: int = field(default=-1)  # start of the line being judged (-1: none yet)

    def feed(self, piece: str, now: Optional[float] = None) -> bool:
        if self.stopped:
            return False
        now = time.monotonic() if now is None else now
        if self._t0 is None:
            self._t0 = now
        if self.skip > 0:
            taken = min(self.skip, len(piece))
            self.skip -= taken
            piece = piece[taken:]
        start = len(self.text)
        self.text += piece
        if self._line < 0 and "\n" in piece:
            self._line = self.text.index("\n", start) + 1
        if self.n_indent > 0 and self._indent_cut():
            self.stopped = True
            return False
        if "\n" in piece and self.t_max_predict_ms > 0 and (now - self._t0) * 1000 >= self.t_max_predict_ms:
            self.stopped = True
            return False
        return True

    def _indent_cut(self) -> bool:
        """Judge every complete-enough line after the first newline."""
        while 0 <= self._line <= len(self.text):
            line_end = self.text.find("\n", self._line)
            body = self.text[self._line:] if line_end < 0 else self.text[self._line:line_end]
            stripped = body.lstrip(" \t")
            if not stripped:  # blank so far: judged when a character arrives
                if line_end < 0:
                    return False
                self._line = line_end + 1
                continue
            if len(body) - len(stripped) < self.n_indent:
                self.cut_at = self._line + len(body) - len(stripped)
                return True
            if line_end < 0:
                return False
            self._line = line_end + 1
        return False

    def final(self, text: str) -> str:
        """The answer's text with the n_indent cut applied."""
        return text[:self.cut_at] if self.cut_at is not None else text


class Unheal:
    """Drops the healed text (:attr:`InfillPrompt.heal`) from the front of a
    streamed answer: call it with each piece, it returns what to show. The
    answer begins with that text (or is cut inside it): its first len(heal)
    characters are the typed ones."""

    def __init__(self, heal: str) -> None:
        self.heal = heal
        self._left = len(heal)

    def __call__(self, piece: str) -> str:
        if self._left <= 0:
            return piece
        taken = min(self._left, len(piece))
        self._left -= taken
        return piece[taken:]
