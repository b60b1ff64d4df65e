"""Constrained output: what an answer must match (a JSON schema, a grammar or
a regular expression), and its compiled form for one model.

The grammar engine is llguidance: it compiles the constraint against the
model's vocabulary, and the C++ core calls its native code for the token masks
and forced text of every position (cpp/constraint/grammar.h, which also
defines what sampling under a constraint means and why speculation stays
lossless under it). Python only describes the constraint and caches the
compiled form.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from . import _core
from .errors import ConstraintError

#: How JSON is written under a schema, unless the schema's own ``x-guidance``
#: says otherwise: on one line, with the separators models write by habit
#: (``{"a": 1, "b": 2}``). Fixed whitespace makes the frame of an object (its
#: keys, quotes, colons and commas) text the grammar forces, which the engine
#: drafts for free; llguidance's default (any whitespace) forces nothing.
JSON_WHITESPACE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

Schema = Union[Mapping[str, Any], bool, str]


@dataclass(frozen=True)
class Constraint:
    """A constraint on the output: ``kind`` is ``"json_schema"``, ``"lark"`` or
    ``"regex"`` (llguidance's formats) and ``text`` its source. Build one with
    :meth:`json_schema`, :meth:`grammar`, :meth:`regex` or :func:`from_keywords`."""

    kind: str
    text: str

    @classmethod
    def json_schema(cls, schema: Schema) -> "Constraint":
        """Answers that are JSON matching ``schema`` (a dict, or its JSON text),
        written on one line (:data:`JSON_WHITESPACE`)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"json_schema is not valid JSON: {e}") from None
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, Mapping):
            raise ConstraintError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        schema = dict(schema)
        schema["x-guidance"] = {**JSON_WHITESPACE, **dict(schema.get("x-guidance") or {})}
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> "Constraint":
        """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        """Answers in the language of a grammar: llguidance's Lark dialect, or
        llama.cpp's GBNF (recognised by its ``::=`` rules and converted)."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError("grammar must be non-empty Lark or GBNF text")
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            return cls("lark", any_to_lark(text))
        except Exception as e:  # the converter's own errors name the rule
            raise ConstraintError(f"grammar: {e}") from None

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        """Answers that match ``pattern`` in full (Rust regex syntax)."""
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError("regex must be a non-empty pattern")
        return cls("regex", pattern)


def from_keywords(constraint: Optional[Constraint] = None, *, json_schema: Optional[Schema] = None,
                  grammar: Optional[str] = None, regex: Optional[str] = None) -> Optional[Constraint]:
    """The one constraint of a call, from whichever of the arguments is given
    (None: unconstrained); more than one is an error."""
    given = {name: value for name, value in (("constraint", constraint), ("json_schema", json_schema),
                                             ("grammar", grammar), ("regex", regex)) if value is not None}
    if len(given) > 1:
        raise ConstraintError(f"give one constraint, not {' and '.join(sorted(given))}")
    if constraint is not None:
        if not isinstance(constraint, Constraint):
            raise TypeError(f"constraint must be a pyspec.Constraint, got {type(constraint).__name__}")
        return constraint
    if json_schema is not None:
        return Constraint.json_schema(json_schema)
    if grammar is not None:
        return Constraint.grammar(grammar)
    if regex is not None:
        return Constraint.regex(regex)
    return None


def library_path() -> str:
    """The file of llguidance's native module, whose C functions the core calls."""
    from llguidance import _lib

    return _lib.__file__


class Grammars:
    """One model's compiled constraints: the vocabulary as llguidance sees it
    (built on first use, about a second at 152k tokens) and the most recently
    used grammars (compiling a schema takes milliseconds; a server sees the
    same few again and again)."""

    KEEP = 64

    def __init__(self, model: "_core.Model") -> None:
        self._model = model
        self._vocab: Optional["_core.GrammarVocab"] = None
        self._compiled: "OrderedDict[Constraint, _core.Grammar]" = OrderedDict()
        self._lock = threading.Lock()

    @property
    def vocab(self) -> "_core.GrammarVocab":
        with self._lock:
            if self._vocab is None:
                self._vocab = _core.GrammarVocab(self._model, library_path())
            return self._vocab

    def compile(self, constraint: Constraint) -> "_core.Grammar":
        """The compiled grammar of ``constraint``; ConstraintError (llguidance's
        reason) when it does not compile."""
        with self._lock:
            hit = self._compiled.get(constraint)
            if hit is not None:
                self._compiled.move_to_end(constraint)
                return hit
        grammar = _core.Grammar(self.vocab, constraint.kind, constraint.text)
        with self._lock:
            self._compiled[constraint] = grammar
            while len(self._compiled) > self.KEEP:
                self._compiled.popitem(last=False)
        return grammar
