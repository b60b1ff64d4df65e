"""Speculative decoding: a drafter proposes, the target verifies, the output
keeps the target's distribution exactly (SPEC: Leviathan et al., Chen et al.).

Drafters (``drafter=``):
  * ``"model"``  - a smaller model with the same vocabulary (needs ``draft``);
  * ``"ngram"``  - prompt lookup: the continuation of the longest recent n-gram
    match (up to 16 tokens) in the prompt and the generated text; nearly free,
    deterministic (the default without a draft model);
  * ``"hybrid"`` - n-gram when it has a match of at least 2 tokens, else the model
    (the default with a draft model; under ``auto``, a declined n-gram draft
    falls back to the model).

Length policies (``policy=``), all lossless (they only choose how much to draft):
  * ``"fixed"``      - always ``draft_max`` tokens (default 4);
  * ``"heuristic"``  - +2 after a fully accepted round, -1 otherwise (Hugging Face);
  * ``"confidence"`` - stop before a position where the draft's top token has probability
    < ``p_min`` (llama.cpp's rule, decided before the draw so it stays lossless);
  * ``"svip"``       - stop after a token when sqrt(gamma * H) > h, H the draft entropy (SVIP);
  * ``"auto"``       - the default. Cost-aware: each round picks the length, 0 (plain
    decoding) included, that maximises expected tokens per second from running
    estimates of acceptance per draft token (by source), draft cost per token and
    verify cost per batch size (timed on first use). The model it optimises is
    documented in ``cpp/auto_policy.h``.
A greedy draft model's q is one-hot, so the stop rules (confidence, svip, auto)
judge its T = 1 distribution instead.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from . import _core, calibration
from .generation import Generator, sampling_params
from .model import Model

DRAFTERS = ("model", "ngram", "hybrid")
POLICIES = ("fixed", "heuristic", "confidence", "svip", "auto")
#: draft_max when none is given: the fixed length, or the cap of the adaptive policies
#: (SVIP's paper caps drafts at 40).
DEFAULT_DRAFT_MAX = {"fixed": 4, "heuristic": 16, "confidence": 16, "svip": 40, "auto": 16}


class SpeculativeDecoder(Generator):
    """Generate with ``target``'s distribution, drafting ahead to go faster.

    Build it once and reuse it: both models keep their contexts between calls,
    and the ``auto`` policy keeps what it learned about costs. ``draft_max`` is
    the draft length (``fixed``) or its cap (other policies), by default
    ``DEFAULT_DRAFT_MAX[policy]``; it and the policy can be changed per call.
    The draft model samples with its own settings (``draft_temperature`` and
    friends, defaulting to the target's): any choice stays lossless, it only
    changes how often drafts are accepted.

    Raises :class:`~pyspec.IncompatibleModelsError` when the vocabularies differ.
    """

    def __init__(
        self,
        target: Model,
        draft: Optional[Model] = None,
        *,
        drafter: Optional[str] = None,
        policy: str = "auto",
        draft_max: Optional[int] = None,
        ngram_min: int = 1,
        ngram_max: int = 16,
    ) -> None:
        drafter = drafter or ("hybrid" if draft is not None else "ngram")
        if drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS)}")
        if drafter in ("model", "hybrid") and draft is None:
            raise ValueError(f"the {drafter!r} drafter needs a draft model")
        _check_policy(policy, draft_max)
        self.target = target
        self.draft = draft if drafter != "ngram" else None
        self.drafter = drafter
        self.policy = policy
        self.draft_max = draft_max
        parts = []
        if self.draft is not None:
            _core.check_compatible(target._core, self.draft._core)
            parts.append(_core.ModelDrafter(self.draft._core))
        if drafter in ("ngram", "hybrid"):
            parts.append(_core.NgramDrafter(target.n_vocab, ngram_min, ngram_max))
        self._drafters = parts  # keep the parts alive
        core_drafter = _core.HybridDrafter(*parts) if drafter == "hybrid" else parts[0]
        self._core_drafter = core_drafter
        self._engine = _core.Engine(target._core, core_drafter)
        self._policies: Dict[Tuple, "_core.LengthPolicy"] = {}

    def __repr__(self) -> str:
        draft = f", draft={self.draft.path!r}" if self.draft is not None else ""
        return (f"SpeculativeDecoder(target={self.target.path!r}{draft}, drafter={self.drafter!r}, "
                f"policy={self.policy!r}, draft_max={self.draft_max})")

    def _text_model(self) -> Model:
        return self.target

    def policy_object(self, policy: Optional[str] = None, *, draft_max: Optional[int] = None, p_min: float = 0.75,
                      svip_gamma: float = 0.15, svip_h: float = 0.3) -> "_core.LengthPolicy":
        """The live length-policy object that generations with these settings use
        (one per setting, kept across calls). For ``auto`` it exposes the cost
        model's estimates: ``verify_cost(n)``, ``draft_cost(source)``,
        ``acceptance(source, match_len)``."""
        name, k = self._resolve(policy, draft_max)
        return self._policy(name, k, p_min, svip_gamma, svip_h)

    def _resolve(self, policy: Optional[str], draft_max: Optional[int]) -> Tuple[str, int]:
        """(policy, draft length or cap) of a call: its own, else the decoder's, else the policy's default."""
        name = policy or self.policy
        k = draft_max if draft_max is not None else self.draft_max
        k = DEFAULT_DRAFT_MAX[name] if k is None and name in DEFAULT_DRAFT_MAX else k
        _check_policy(name, k)
        return name, k

    def _policy(self, name: str, k: int, p_min: float, svip_gamma: float, svip_h: float) -> "_core.LengthPolicy":
        # One object per setting, kept across calls: adaptive policies remember.
        key = (name, k, p_min, svip_gamma, svip_h)
        if key not in self._policies:
            self._policies[key] = _core.LengthPolicy(name, k=k, p_min=p_min, gamma=svip_gamma, h=svip_h, cap=k)
        return self._policies[key]

    def _draft_args(
        self,
        *,
        sampling,
        draft_max: Optional[int] = None,
        policy: Optional[str] = None,
        p_min: float = 0.75,
        svip_gamma: float = 0.15,
        svip_h: float = 0.3,
        draft_temperature: Optional[float] = None,
        draft_top_k: Optional[int] = None,
        draft_top_p: Optional[float] = None,
        draft_min_p: Optional[float] = None,
        _variant: str = "correct",
        _discard_below: float = 0.0,
    ) -> dict:
        """Per-call drafting arguments (see the class and module docstrings)."""
        name, k = self._resolve(policy, draft_max)
        draft_sampling = sampling_params(
            sampling.temperature if draft_temperature is None else draft_temperature,
            sampling.top_k if draft_top_k is None else draft_top_k,
            sampling.top_p if draft_top_p is None else draft_top_p,
            sampling.min_p if draft_min_p is None else draft_min_p,
        )
        on_gpu = [m._core.n_gpu_layers != 0 for m in (self.target, self.draft) if m is not None]
        policy_obj = self._policy(name, k, p_min, svip_gamma, svip_h) if k > 0 else None
        return {
            "draft_max": k,
            "draft_sampling": draft_sampling,
            "policy": policy_obj,
            # Batch timings recorded on this machine before, read only while the policy
            # still wants some (its first call): then it need not time them again.
            "known_batch_costs": (calibration.load(self.target._core)
                                  if policy_obj is not None and policy_obj.calibration_sizes(k + 1) else {}),
            # TEST-ONLY negative controls: a wrong acceptance rule (_variant), or a stop
            # rule that discards drawn draft tokens below a belief (_discard_below).
            "variant": _variant,
            "test_discard_below": _discard_below,
            # Prefill both models at once only when they do not share the CPU cores.
            "parallel_prefill": len(on_gpu) == 2 and on_gpu[0] != on_gpu[1],
        }

    def _after_run(self, calibrated: dict) -> None:
        if calibrated:
            calibration.save(self.target._core, calibrated)


def _check_policy(name: str, k: Optional[int]) -> None:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    if k is not None and k < 0:
        raise ValueError(f"draft_max must be >= 0, got {k}")
