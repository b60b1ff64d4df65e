"""Speculative decoding: a draft proposes, the target verifies, the output
keeps the target's distribution exactly (SPEC: Leviathan et al., Chen et al.)."""

from __future__ import annotations

import threading
from typing import Optional

from . import _core
from .generation import Generator
from .model import Model


class SpeculativeDecoder(Generator):
    """Generate with ``target``'s distribution, drafting with ``draft``.

    Build it once and reuse it: both models keep their contexts between calls.
    ``draft_max`` (k) is the number of drafted tokens per target pass; it can be
    changed per call. The draft samples with its own settings (``draft_temperature``
    and friends, defaulting to the target's): any choice stays lossless, it only
    changes how often drafts are accepted.

    Raises :class:`~pyspec.IncompatibleModelsError` when the vocabularies differ.
    """

    def __init__(self, target: Model, draft: Model, *, draft_max: int = 4) -> None:
        if draft_max < 0:
            raise ValueError(f"draft_max must be >= 0, got {draft_max}")
        _core.check_compatible(target._core, draft._core)
        self.target = target
        self.draft = draft
        self.draft_max = draft_max
        self._drafter = _core.ModelDrafter(draft._core)
        self._engine = _core.Engine(target._core, self._drafter)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SpeculativeDecoder(target={self.target.path!r}, draft={self.draft.path!r}, draft_max={self.draft_max})"

    def _text_model(self) -> Model:
        return self.target

    def _draft_args(
        self,
        *,
        sampling,
        draft_max: Optional[int] = None,
        draft_temperature: Optional[float] = None,
        draft_top_k: Optional[int] = None,
        draft_top_p: Optional[float] = None,
        draft_min_p: Optional[float] = None,
        _variant: str = "correct",
    ) -> dict:
        k = self.draft_max if draft_max is None else draft_max
        if k < 0:
            raise ValueError(f"draft_max must be >= 0, got {k}")
        draft_sampling = _core.SamplingParams(
            temperature=sampling.temperature if draft_temperature is None else draft_temperature,
            top_k=sampling.top_k if draft_top_k is None else draft_top_k,
            top_p=sampling.top_p if draft_top_p is None else draft_top_p,
            min_p=sampling.min_p if draft_min_p is None else draft_min_p,
        )
        # _variant selects a deliberately wrong acceptance rule: test-only negative controls.
        return {"draft_max": k, "draft_sampling": draft_sampling, "variant": _variant}
