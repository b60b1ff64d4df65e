"""What a generation returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _core

#: Engine stop reasons as OpenAI's (and llama-cpp-python's) finish_reason.
FINISH_REASON = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context": "length", "cancelled": "stop"}


class GenerationStats:
    """Timings and counters of one generation.

    The fields are the C++ core's (``FIELDS``; each is documented in
    ``cpp/engine/stats.h``), plus the ``seed`` the generation used (pass it back to
    reproduce it) and the rates derived here. ``decode_tok_s`` counts tokens
    after the first, over the time after the first, so prompt processing
    (``ttft_s``) does not dilute it. Drafting fields are zero for plain
    generation. Per-position fields read as tuples.
    """

    FIELDS: Tuple[str, ...] = tuple(_core.GenerationStats.FIELDS) + ("seed",)

    def __init__(self, core: "Optional[_core.GenerationStats]" = None, seed: int = 0, **fields: Any) -> None:
        self._core = core if core is not None else _core.GenerationStats(**fields)
        self.seed = seed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in _core.GenerationStats.FIELDS:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        value = getattr(self._core, name)
        return tuple(value) if isinstance(value, list) else value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GenerationStats) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"GenerationStats({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens emitted per target pass, counting the residual/bonus token."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def accepted_per_position(self) -> Tuple[float, ...]:
        """Acceptance rate of draft position 1..k (of the rounds that drafted it)."""
        return tuple(a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at))

    def to_dict(self) -> Dict[str, Any]:
        d = dict(self._core.to_dict(), seed=self.seed)
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_accepted_len"] = self.mean_accepted_len
        d["accepted_per_position"] = list(self.accepted_per_position)
        return d


class PositionCounts:
    """Draft tokens verified (``drafted``) and accepted (``accepted``) at each
    draft position (index 0: the first), summed over generations: the one
    per-position sum (the server's /metrics, the benchmarks' acceptance by
    position). ``add`` a generation's ``GenerationStats.drafted_at`` and
    ``accepted_at``; the lists grow to the longest draft added."""

    def __init__(self, n: int = 0) -> None:
        self.drafted: List[int] = [0] * n
        self.accepted: List[int] = [0] * n

    def add(self, drafted_at: Sequence[int], accepted_at: Sequence[int]) -> None:
        for i, (d, a) in enumerate(zip(drafted_at, accepted_at)):
            if i == len(self.drafted):
                self.drafted.append(0)
                self.accepted.append(0)
            self.drafted[i] += d
            self.accepted[i] += a

    def rates(self) -> List[float]:
        """The acceptance rate of each position that was drafted (the others left out)."""
        return [a / d for a, d in zip(self.accepted, self.drafted) if d]


@dataclass(frozen=True)
class Completion:
    """The result of ``Model.generate``."""

    text: str
    tokens: List[int]
    n_prompt_tokens: int
    stop_reason: str  # "eog", "max_tokens", "stop", "context" or "cancelled"
    stats: GenerationStats = field(default_factory=GenerationStats)
    #: With a ``prediction=``: its tokens that appear in the answer, and the rest
    #: (pyspec/prediction.py; OpenAI's accepted/rejected_prediction_tokens).
    accepted_prediction_tokens: Optional[int] = None
    rejected_prediction_tokens: Optional[int] = None
    #: With ``logprobs=k``: per generated token, (its log-probability, [(token,
    #: log-probability) of the k most likely]): the target's, at temperature 1.
    logprobs: Optional[List[Tuple[float, List[Tuple[int, float]]]]] = None

    @classmethod
    def of(cls, prompt: Sequence[int], out: "_core.GenerateResult", seed: int, logprobs: bool = False) -> "Completion":
        """The completion of the core's result ``out`` for ``prompt``, sampled with ``seed``."""
        return cls(text=out.text.decode("utf-8", errors="replace"), tokens=list(out.tokens),
                   n_prompt_tokens=len(prompt), stop_reason=out.stop_reason, stats=GenerationStats(out.stats, seed=seed),
                   logprobs=[(lp, list(top)) for lp, top in out.logprobs] if logprobs else None)

    @property
    def n_generated_tokens(self) -> int:
        return len(self.tokens)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "text": self.text,
            "tokens": list(self.tokens),
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_generated_tokens": self.n_generated_tokens,
            "stop_reason": self.stop_reason,
            "stats": self.stats.to_dict(),
            **({"accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens}
               if self.accepted_prediction_tokens is not None else {}),
            **({"logprobs": [[lp, [list(t) for t in top]] for lp, top in self.logprobs]}
               if self.logprobs is not None else {}),
        }


class BatchStats:
    """Figures of a batch of sequences as a whole (each sequence's own are in its
    Completion.stats): rounds (one target decode each), rows decoded,
    ``aggregate_tok_s`` (tokens after each sequence's first, per second of
    decoding) and the rest of ``cpp/engine/engine.h``'s BatchStats."""

    FIELDS: Tuple[str, ...] = tuple(_core.BatchStats.FIELDS) + ("seed", "ttft_s")

    def __init__(self, core: "_core.BatchStats", seed: int, ttft_s: Tuple[float, ...]) -> None:
        self._core = core
        self.seed = seed
        self.ttft_s = ttft_s  # per sequence

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in _core.BatchStats.FIELDS:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        return getattr(self._core, name)

    def __repr__(self) -> str:
        return f"BatchStats({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._core.to_dict(), seed=self.seed, ttft_s=list(self.ttft_s))


@dataclass(frozen=True)
class Completions:
    """The result of ``generate(..., n=k)`` and ``generate_batch``: one
    Completion per sequence, in the order asked for (OpenAI's ``choices``)."""

    choices: List[Completion]
    stats: BatchStats

    def to_dict(self) -> Dict[str, Any]:
        return {
            "choices": [dict(c.to_dict(), index=i) for i, c in enumerate(self.choices)],
            "stats": self.stats.to_dict(),
        }
