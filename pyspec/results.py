"""What a generation returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List


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

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
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
