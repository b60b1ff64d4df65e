"""What a generation returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Tuple


@dataclass(frozen=True)
class GenerationStats:
    """Timings and counters of one generation.

    ``decode_tok_s`` counts tokens after the first, over the time after the
    first, so prompt processing (``ttft_s``) does not dilute it. Drafting
    fields are zero for plain generation.
    """

    n_prompt_tokens: int = 0
    n_generated: int = 0
    prompt_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tok_s: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    overhead_s: float = 0.0
    calibrate_s: float = 0.0           # the auto policy timing batch sizes (its first generation only)
    drafted_at: Tuple[int, ...] = ()   # per draft position 1..k: rounds that drafted it
    accepted_at: Tuple[int, ...] = ()  # ... and accepted it
    length_hist: Tuple[int, ...] = ()  # rounds by drafted length (index 0: plain steps)
    policy_plain: int = 0              # rounds where the length policy chose plain decoding
    ngram_rounds: int = 0              # rounds drafted by n-gram lookup
    ngram_drafted: int = 0             # ... their drafted tokens
    ngram_accepted: int = 0            # ... and accepted ones
    stops_before: int = 0              # drafts the policy ended before drawing a token
    stops_after: int = 0               # ... and right after a token it kept
    seed: int = 0                      # the seed this generation used (pass it back to reproduce it)

    @classmethod
    def from_core(cls, d: Dict[str, Any], seed: int = 0) -> "GenerationStats":
        d = dict(d, seed=seed)
        d["drafted_at"] = tuple(d.get("drafted_at", ()))
        d["accepted_at"] = tuple(d.get("accepted_at", ()))
        d["length_hist"] = tuple(d.get("length_hist", ()))
        return cls(**d)

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
        d = asdict(self)
        d["drafted_at"] = list(self.drafted_at)
        d["accepted_at"] = list(self.accepted_at)
        d["length_hist"] = list(self.length_hist)
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_accepted_len"] = self.mean_accepted_len
        d["accepted_per_position"] = list(self.accepted_per_position)
        return d


@dataclass(frozen=True)
class Completion:
    """The result of ``Model.generate``."""

    text: str
    tokens: List[int]
    n_prompt_tokens: int
    stop_reason: str  # "eog", "max_tokens", "stop", "context" or "cancelled"
    stats: GenerationStats = field(default_factory=GenerationStats)

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
        }
