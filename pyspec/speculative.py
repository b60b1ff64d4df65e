"""Speculative decoding: a drafter proposes, the target verifies, the output
keeps the target's distribution exactly (SPEC: Leviathan et al., Chen et al.).

The drafters (``drafter=``) and length policies (``policy=``) are described
once, in the README ("Drafters and policies"); their names, defaults and
one-line summaries come from the C++ core (:data:`DRAFTERS`, :data:`POLICIES`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from . import _core, calibration
from .generation import Generator, sampling_params
from .model import Model

#: name -> {"needs_draft_model", "summary"}, in the core's order.
DRAFTERS: Dict[str, dict] = {d["name"]: d for d in _core.drafters()}
#: name -> {"default_draft_max", "summary"}, in the core's order (the default, "auto", last).
POLICIES: Dict[str, dict] = {p["name"]: p for p in _core.policies()}


class SpeculativeDecoder(Generator):
    """Generate with ``target``'s distribution, drafting ahead to go faster.

    Build it once and reuse it: both models keep their contexts between calls,
    and the ``auto`` policy keeps what it learned about costs. ``draft_max`` is
    the draft length (``fixed``) or its cap (other policies), by default the
    policy's own (``POLICIES[name]["default_draft_max"]``); it and the policy can
    be changed per call. The draft model samples with its own settings
    (``draft_temperature`` and friends, defaulting to the target's): any choice
    stays lossless, it only changes how often drafts are accepted.

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
        params = _core.DrafterParams(name=drafter or "", ngram_min=ngram_min, ngram_max=ngram_max)
        self.drafter = _core.drafter_name(params, draft is not None)
        # Batches of n samples draft by consensus unless the n-gram drafter was asked for by name.
        self._batch_drafter = "ngram" if drafter == "ngram" else "consensus"
        self._ngram_sizes = (ngram_min, ngram_max)
        self.target = target
        self.draft = draft if DRAFTERS[self.drafter]["needs_draft_model"] else None
        self.policy = policy
        self.draft_max = draft_max
        self._policies: Dict[Tuple, "_core.LengthPolicy"] = {}
        if draft_max != 0:  # fail now on a bad policy, not at the first call (0: plain, no policy)
            self.policy_object()
        self._core_drafter = _core.make_drafter(params, target._core, self.draft._core if self.draft else None)
        self._engine = _core.Engine(target._core, self._core_drafter)

    def __repr__(self) -> str:
        draft = f", draft={self.draft.path!r}" if self.draft is not None else ""
        return (f"SpeculativeDecoder(target={self.target.path!r}{draft}, drafter={self.drafter!r}, "
                f"policy={self.policy!r}, draft_max={self.draft_max})")

    def clear_cache(self) -> None:
        self.target.clear_cache()
        if self.draft is not None:
            self.draft.clear_cache()

    def policy_object(self, policy: Optional[str] = None, *, draft_max: Optional[int] = None, p_min: float = 0.75,
                      svip_gamma: float = 0.15, svip_h: float = 0.3, slot: int = 0) -> "_core.LengthPolicy":
        """The live length-policy object that generations with these settings use
        (one per setting, kept across calls; sequence ``slot`` of a batch has its
        own). ``auto`` returns a :class:`_core.AutoPolicy`, which exposes its cost
        model's estimates: ``verify_cost(n)``, ``draft_cost(source)``,
        ``acceptance(source, match_len)``."""
        params = self._policy_params(policy or self.policy, self.draft_max if draft_max is None else draft_max,
                                     p_min, svip_gamma, svip_h)
        # One object per setting, kept across calls: adaptive policies remember.
        # Building it is where the core validates the settings (ValueError).
        key = tuple(getattr(params, f) for f in params.FIELDS) + (slot,)
        if key not in self._policies:
            self._policies[key] = _core.make_policy(params)
        return self._policies[key]

    @staticmethod
    def _policy_params(name: str, draft_max: Optional[int], p_min: float = 0.75, gamma: float = 0.15,
                       h: float = 0.3) -> "_core.PolicyParams":
        if draft_max is not None and draft_max < 0:  # the core reads -1 as "the policy's default"
            raise ValueError(f"draft_max must be >= 0, got {draft_max}")
        return _core.PolicyParams(name=name, draft_max=-1 if draft_max is None else draft_max, p_min=p_min,
                                  gamma=gamma, h=h)

    def _draft_args(
        self,
        params: "_core.GenerateParams",
        *,
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
        _shared_stream: bool = False,
        _slots: int = 1,
    ) -> List[Optional["_core.LengthPolicy"]]:
        """Fill the drafting fields of ``params``; return the policy of each of
        the ``_slots`` sequences (None: plain decoding)."""
        s = params.sampling
        params.draft_sampling = sampling_params(
            s.temperature if draft_temperature is None else draft_temperature,
            s.top_k if draft_top_k is None else draft_top_k,
            s.top_p if draft_top_p is None else draft_top_p,
            s.min_p if draft_min_p is None else draft_min_p,
        )
        policies: List[Optional["_core.LengthPolicy"]] = [None] * _slots
        if (self.draft_max if draft_max is None else draft_max) != 0:  # 0: plain decoding
            for j in range(_slots):
                policies[j] = self.policy_object(policy, draft_max=draft_max, p_min=p_min, svip_gamma=svip_gamma,
                                                 svip_h=svip_h, slot=j)
            calibration.prepare(policies, self.target._core, self.draft._core if self.draft else None)
            params.draft_max = policies[0].draft_max
        # TEST-ONLY negative controls: a wrong acceptance rule (_variant), or a stop
        # rule that discards drawn draft tokens below a belief (_discard_below).
        params.variant = _variant
        params.test_discard_below = _discard_below
        params.test_shared_stream = _shared_stream  # a batch's samples on one stream
        # Prefill both models at once only when they do not share the CPU cores.
        on_gpu = [m._core.n_gpu_layers != 0 for m in (self.target, self.draft) if m is not None]
        params.parallel_prefill = len(on_gpu) == 2 and on_gpu[0] != on_gpu[1]
        return policies

    def _batch_drafters(self, n: int) -> List["_core.Drafter"]:
        """One drafter per sequence of a batch (drafters keep per-sequence state):
        without a draft model, consensus (or n-gram lookup when asked for by
        name); with one, each sequence drafts in its own sequence of the draft
        model's context (hybrid: beside consensus lookup)."""
        if self.draft is not None and self.draft.n_seq_max < n:
            raise ValueError(f"{n} sequences drafting with a draft model need it loaded with n_seq_max >= {n} "
                             f"(this one holds {self.draft.n_seq_max}): pyspec.Model(..., n_seq_max={n})")
        n_min, n_max = self._ngram_sizes
        name = self.drafter if self.draft is not None else self._batch_drafter
        params = _core.DrafterParams(name=name, ngram_min=n_min, ngram_max=n_max)
        return _core.make_batch_drafters(params, self.target._core, self.draft._core if self.draft else None, n)

    def _after_run(self, policy: Optional["_core.LengthPolicy"], stats) -> None:
        if policy is not None:
            calibration.keep(policy, self.target._core, stats, self.draft._core if self.draft else None)
