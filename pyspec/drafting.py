"""How a speculative generation drafts, as one frozen value beside
:class:`~pyspec.Sampling` (issue 49): built once where a call enters (the
keywords of ``generate``, the CLI's options, a request body) by
:meth:`SpeculativeDecoder.drafting`, and read by ``setup`` alone. Plain
decoding is no ``Drafting`` at all (None); ``draft_max=0`` means that only at
the surface, where a user writes it.

The drafters and length policies are described in docs/drafters.md; the
defaults of the policies' settings come from the core (:data:`POLICY_DEFAULTS`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _core
from .sampling import Sampling

if TYPE_CHECKING:
    from .memory import Memory

#: The policies' settings as the core defaults them (p_min, gamma, h).
POLICY_DEFAULTS = _core.PolicyParams()


@dataclass(frozen=True)
class Drafting:
    """The drafting settings of one call.

    ``policy`` and ``draft_max`` pick the length policy and its cap (None: the
    policy's default cap); ``p_min`` (confidence) and ``svip_gamma``,
    ``svip_h`` (svip) are its settings. ``draft_sampling``: how the draft model
    samples (None: as the target). ``memory``: what lookups copy from and the
    answer joins (True: the decoder's, False: none, or a
    :class:`~pyspec.Memory`). ``drafter``: a session slot's drafter by name
    (None: the decoder's own). ``prediction_memory``: the memory of a
    predicted answer (:func:`pyspec.prediction.memory_for`), which lookups
    copy from instead of ``memory`` (the answer still joins ``memory``); a
    request's ``prediction`` sets it (pyspec/request.py), no keyword does."""

    policy: str = "auto"
    draft_max: Optional[int] = None
    p_min: float = POLICY_DEFAULTS.p_min
    svip_gamma: float = POLICY_DEFAULTS.gamma
    svip_h: float = POLICY_DEFAULTS.h
    draft_sampling: Optional[Sampling] = None
    memory: Union[bool, "Memory"] = True
    drafter: Optional[str] = None
    prediction_memory: Optional["Memory"] = dataclasses.field(default=None, metadata={"keyword": False})

    def policy_params(self) -> "_core.PolicyParams":
        """The core's description of the length policy (it validates it)."""
        return _core.PolicyParams(name=self.policy, draft_max=self.draft_max, p_min=self.p_min,
                                  gamma=self.svip_gamma, h=self.svip_h)


#: The keywords that ``generate`` and ``generate_batch`` take for drafting.
FIELDS: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Drafting) if f.metadata.get("keyword", True))
