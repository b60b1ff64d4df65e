"""Speculative decoding: a drafter proposes, the target verifies, the output
keeps the target's distribution exactly (SPEC: Leviathan et al., Chen et al.).

The drafters (``drafter=``) and length policies (``policy=``) are described
once, in docs/drafters.md (and auto in docs/auto-policy.md); their names, defaults and
one-line summaries come from the C++ core (:data:`DRAFTERS`, :data:`POLICIES`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple, Union

from . import _core, calibration
from . import memory as memory_
from .drafting import Drafting
from .generation import Generator
from .memory import Memory
from .model import Model

#: name -> {"needs_draft_model", "summary"}, in the core's order.
DRAFTERS: Dict[str, dict] = {d["name"]: d for d in _core.drafters()}
#: name -> {"default_draft_max", "summary"}, in the core's order (the default, "auto", last).
POLICIES: Dict[str, dict] = {p["name"]: p for p in _core.policies()}
#: The drafters' settings as the core defaults them (n-gram sizes).
DRAFTER_DEFAULTS = _core.DrafterParams()


class SpeculativeDecoder(Generator):
    """Generate with ``target``'s distribution, drafting ahead to go faster.

    Build it once and reuse it: both models keep their contexts between calls,
    and the ``auto`` policy keeps what it learned about costs. ``draft_max`` is
    the draft length (``fixed``) or its cap (other policies), by default the
    policy's own (``POLICIES[name]["default_draft_max"]``); it and the policy can
    be changed per call. The draft model samples with its own settings
    (``draft_sampling=``, a :class:`~pyspec.Sampling`; by default the target's):
    any choice stays lossless, it only changes how often drafts are accepted.

    ``memory``: the :class:`~pyspec.Memory` that lookup drafters (``suffix``,
    and ``hybrid``'s lookup) copy from and that generations are added to; True
    (default) is the target's (``target.memory``), False none. With
    ``remember=False`` generations only read it (a benchmark's fixed memory).

    ``draft_window``: the most tokens the draft model catches up on at once. A
    new conversation's prompt is not prefilled on it before the first token;
    its first draft processes the last ``draft_window`` tokens only (0: all).
    Drafts are guesses the target checks, so any window stays lossless.

    Raises :class:`~pyspec.IncompatibleModelsError` when the vocabularies differ.
    """

    speculative = True

    def __init__(
        self,
        target: Model,
        draft: Optional[Model] = None,
        *,
        drafter: Optional[str] = None,
        policy: str = "auto",
        draft_max: Optional[int] = None,
        ngram_min: int = DRAFTER_DEFAULTS.ngram_min,
        ngram_max: int = DRAFTER_DEFAULTS.ngram_max,
        draft_window: int = DRAFTER_DEFAULTS.draft_window,
        memory: Union[bool, Memory] = True,
        remember: bool = True,
    ) -> None:
        if draft_window < 0:
            raise ValueError(f"draft_window must be >= 0 (0: no window), not {draft_window}")
        self._sizes = dict(ngram_min=ngram_min, ngram_max=ngram_max, draft_window=draft_window)
        params = _core.DrafterParams(name=drafter or "", **self._sizes)
        self.drafter = _core.drafter_name(params, draft is not None)
        self.memory = memory_.choose(memory, target.memory)
        self.remember = remember
        self.target = target
        self.draft = draft if DRAFTERS[self.drafter]["needs_draft_model"] else None
        self.policy = policy
        self.draft_max = draft_max
        self._policies: Dict[Tuple, "_core.LengthPolicy"] = {}
        self._slot_pool: Dict[str, List["_core.Drafter"]] = {}  # a session's drafters, per name (_slot_drafters)
        if draft_max != 0:  # fail now on a bad policy, not at the first call (0: plain, no policy)
            self.policy_object()
        self._core_drafter = _core.make_drafter(params, target.native, self._draft_native)
        self._engine = _core.Engine(target.native, self._core_drafter)

    def __repr__(self) -> str:
        draft = f", draft={self.draft.path!r}" if self.draft is not None else ""
        return (f"SpeculativeDecoder(target={self.target.path!r}{draft}, drafter={self.drafter!r}, "
                f"policy={self.policy!r}, draft_max={self.draft_max})")

    def clear_cache(self) -> None:
        self.target.clear_cache()
        if self.draft is not None:
            self.draft.clear_cache()

    def drafting(self, drafting: Optional[Drafting] = None, **changes) -> Optional[Drafting]:
        """The :class:`~pyspec.Drafting` of a call: ``drafting`` (default: this
        decoder's policy and cap) with the fields given by name changed (None
        keeps the field). None when the cap is 0: plain decoding, which only
        the surface spells as ``draft_max=0``."""
        base = drafting if drafting is not None else Drafting(policy=self.policy, draft_max=self.draft_max)
        out = dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})
        return None if out.draft_max == 0 else out

    def policy_object(self, policy: Optional[str] = None, *, draft_max: Optional[int] = None,
                      p_min: Optional[float] = None, svip_gamma: Optional[float] = None,
                      svip_h: Optional[float] = None, key=0) -> "_core.LengthPolicy":
        """The live length-policy object that generations with these settings use
        (one per setting, kept across calls; each ``key`` has its own: sequence j
        of a batch, a server's (user, index)). ``auto`` returns a
        :class:`_core.AutoPolicy`, which exposes its cost model's estimates:
        ``verify_cost(n)``, ``draft_cost(source)``, ``acceptance(source, match_len)``."""
        drafting = self.drafting(policy=policy, draft_max=draft_max, p_min=p_min, svip_gamma=svip_gamma,
                                 svip_h=svip_h) or Drafting(policy=policy or self.policy, draft_max=0)
        return self._policy(drafting, key)

    def _policy(self, drafting: Drafting, key) -> "_core.LengthPolicy":
        # The user's cap goes in as given (None: the policy's default); the core
        # resolves and checks it, and the engine reads it from the policy.
        params = drafting.policy_params()
        # One object per setting, kept across calls: adaptive policies remember.
        # Building it is where the core validates the settings (ValueError).
        setting = tuple(getattr(params, f) for f in params.FIELDS) + (key,)
        if setting not in self._policies:
            self._policies[setting] = _core.make_policy(params)
        return self._policies[setting]

    def _drafting(self, params: "_core.SequenceParams", slots: List[int], drafters: str,
                  drafting: Optional[Drafting], policy_keys: List
                  ) -> List[Tuple[Optional["_core.Drafter"], Optional["_core.LengthPolicy"]]]:
        """Fill the drafting fields of ``params``; each slot's (drafter, policy)
        (see :meth:`~pyspec.generation.Generator.setup`). ``drafting.drafter``
        (a name) is for sessions' slots, which may draft with another drafter
        than the decoder's; a batch drafts as :meth:`_batch_drafters` says.
        ``drafting.memory`` is what the drafters look up (True: the decoder's;
        a server passes each user's)."""
        if drafting is None:
            return [(None, None)] * len(slots)  # plain: a sequence without a policy does not draft
        if drafting.draft_sampling is not None:  # else setup() gave the draft the target's settings
            params.draft_sampling = drafting.draft_sampling.native()
        policies = [self._policy(drafting, k) for k in policy_keys]
        calibration.prepare(policies, self.target.native, self._draft_native)
        if drafters == "engine":
            chosen: List[Optional["_core.Drafter"]] = [None] * len(slots)
        elif drafters == "batch":
            chosen = list(self._batch_drafters(len(slots), drafting.drafter or self.drafter))
        elif drafters == "slots":
            pool = self._slot_drafters(drafting.drafter or self.drafter)
            chosen = [pool[j] for j in slots]
        else:
            raise ValueError(f"drafters must be 'engine', 'batch' or 'slots', got {drafters!r}")
        store = self._lookup_memory(drafting)
        for d in chosen if drafters != "engine" else [self._core_drafter]:
            d.use_memory(store)
        return list(zip(chosen, policies))

    def _lookup_memory(self, drafting: Drafting) -> Optional["_core.SuffixStore"]:
        """What ``drafting``'s lookups copy from: its prediction, else its memory."""
        store = drafting.prediction_memory or memory_.choose(drafting.memory, self.memory)
        return store.native if store is not None else None

    def _use_memory(self, seq, drafting: Drafting) -> None:
        if seq.drafter is not None:
            seq.drafter.use_memory(self._lookup_memory(drafting))

    def _batch_drafters(self, n: int, name: str) -> List["_core.Drafter"]:
        """One drafter per sequence of a batch (drafters keep per-sequence state):
        lookup drafters see the siblings' texts (``suffix``, ``consensus``;
        ``ngram`` only its own); with a draft model, each sequence drafts in its
        own sequence of the draft model's context (hybrid: beside suffix lookup)."""
        if self.draft is not None and self.draft.n_seq_max < n:
            raise ValueError(f"{n} sequences drafting with a draft model need it loaded with n_seq_max >= {n} "
                             f"(this one holds {self.draft.n_seq_max}): pyspec.Model(..., n_seq_max={n})")
        return self._make_drafters(name, n)

    def _slot_drafters(self, name: str) -> List["_core.Drafter"]:
        """The drafters of a session's slots for drafter ``name``, kept across
        requests: slot j drafts in sequence j of the draft model's context."""
        if name not in self._slot_pool:
            n = min(m.n_seq_max for m in (self.target, self.draft) if m is not None)
            # Slots hold different requests (and users): none drafts from another's text.
            self._slot_pool[name] = self._make_drafters(name, n, siblings=False)
        return self._slot_pool[name]

    def _make_drafters(self, name: str, n: int, siblings: bool = True) -> List["_core.Drafter"]:
        params = _core.DrafterParams(name=name, **self._sizes)
        return _core.make_batch_drafters(params, self.target.native, self._draft_native, n, siblings)

    @property
    def _draft_native(self) -> Optional["_core.Model"]:
        return self.draft.native if self.draft is not None else None

    def _draft_models(self) -> List["_core.Model"]:
        return [self.draft.native] if self.draft is not None else []

    def record(self, setup, stats, *, defer: bool = False):
        if setup.policy is not None:
            return calibration.keep(setup.policy, self.target.native, self._draft_native, defer=defer)
        return None
