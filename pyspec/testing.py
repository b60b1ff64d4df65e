"""TEST-ONLY controls: the one value the lossless tests use to break pyspec on purpose.

Every statistical test of losslessness has a negative control, a deliberately
wrong variant the same test must reject (SPEC.md). Each wrong variant is a field
of :class:`TestControls`; a test builds one value and passes it as ``_test=`` to
whatever it drives (``generate``, ``generate_batch``, ``open_session``,
``create_app``, ``pyspec serve --test-controls``); every layer below hands the
same value on, and the C++ core reads its session's (``SessionParams.test``,
engine.h). Never set in the product: the default value changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Optional

from . import _core

#: The C++ core's names (sampling.h, AcceptVariant; engine.h, GrammarControl).
VARIANTS = tuple(_core.sampling.VARIANTS)
GRAMMAR_CONTROLS = tuple(_core.GRAMMAR_CONTROLS)
PENALTY_CONTROLS = tuple(_core.PENALTY_CONTROLS)
SLOT_CHOICES = ("engine", "lowest")


@dataclass(frozen=True)
class TestControls:
    """TEST-ONLY negative controls (and one probe), for a whole call or server.

    - ``variant``: the accept test's rule: ``"correct"``, or a wrong one
      (``"residual_is_p"``, ``"accept_all"``; ``"sample_and_match"`` is right but
      suboptimal);
    - ``discard_below`` > 0: a model draft ends by discarding a drawn token whose
      belief is below it (the biased rule drafter.h forbids);
    - ``shared_stream``: every sequence draws from its seed's one stream
      (correlated samples) instead of its own;
    - ``grammar``: under a grammar, the target's rows ``"unmasked"`` or masked
      with the ``"stale"`` mask of the round's start (``"off"``: the product);
    - ``penalties``: a verified row's repetition penalties count a wrong
      window (``cpp/core/penalties.h``): ``"stale"``, the accepted prefix only,
      none of the drafts before the row; ``"last_draft"``, only the draft just
      before it (right for rows 0 and 1, wrong from row 2); ``"off"``: the product;
    - ``pit``: a probe, not a control: record each decided token's randomized PIT
      under its target row (``stats.pit``; a server reports it in ``timings.pit``);
    - ``slot_choice``: a server's slot for each request: ``"engine"`` (the
      product: the engine's pick) or ``"lowest"`` (the lowest free slot, which
      ignores where a conversation is cached: the prompt-cache test's control);
    - ``escaped_views``: False, a server adds no JSON-escaped views of a
      constrained request's prompt to its memory (pyspec/escaped.py; the
      escaped-lookup test's control);
    - ``timing_scale`` > 0: a pin, not a control: a batch size timed between
      rounds reports this many times the fastest round instead of its clock
      (the decode still runs and is dropped), so that a test of that path does
      not hang on whether a loaded machine's clock made drafting look dear;
    - ``stale_join``: the row of a prompt's last token, decoded with its final
      chunk so that the first token costs one decode (``cpp/engine/decode.cpp``),
      carries the token before the last.
    """

    __test__ = False  # not a pytest test class

    variant: str = "correct"
    discard_below: float = 0.0
    shared_stream: bool = False
    grammar: str = "off"
    pit: bool = False
    penalties: str = "off"
    slot_choice: str = "engine"
    escaped_views: bool = True
    timing_scale: float = 0.0
    stale_join: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (("variant", self.variant, VARIANTS), ("grammar", self.grammar, GRAMMAR_CONTROLS),
                                     ("penalties", self.penalties, PENALTY_CONTROLS),
                                     ("slot_choice", self.slot_choice, SLOT_CHOICES)):
            if value not in allowed:
                raise ValueError(f"TestControls.{name} = {value!r}: one of {', '.join(allowed)}")
        if not self.timing_scale >= 0:  # NaN too
            raise ValueError(f"TestControls.timing_scale = {self.timing_scale!r}: >= 0 (0: the clock)")

    @property
    def breaks_output(self) -> bool:
        """Whether the output is no longer the target's (every field but the
        probe, the slot choice, which moves only cache hits, and the escaped
        views and timing pin, which move only drafts)."""
        return self.replace(pit=False, slot_choice="engine", escaped_views=True, timing_scale=0.0) != TestControls()

    def replace(self, **changes) -> "TestControls":
        return dataclasses.replace(self, **changes)

    def native(self) -> "_core.TestControls":
        """The core's part (a session's: engine.h, SessionParams.test)."""
        return _core.TestControls(variant=self.variant, discard_below=self.discard_below,
                                  shared_stream=self.shared_stream, grammar=self.grammar, pit=self.pit,
                                  penalties=self.penalties, timing_scale=self.timing_scale,
                                  stale_join=self.stale_join)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "TestControls":
        """The value ``pyspec serve --test-controls`` takes: JSON of the fields."""
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("test controls: a JSON object of TestControls fields")
        return cls(**fields)


#: The product's (nothing broken, nothing probed).
OFF = TestControls()


def controls(value: Optional[TestControls]) -> TestControls:
    """``_test=`` as every layer reads it: None is :data:`OFF`; anything else
    must be a :class:`TestControls` (a TypeError names what came)."""
    if value is None:
        return OFF
    if not isinstance(value, TestControls):
        kind = type(value)
        raise TypeError(f"_test takes a pyspec.testing.TestControls, not {kind.__module__}.{kind.__qualname__}")
    return value
