"""The settings every entry point shares, each defined once.

How a token is drawn is one frozen value, :class:`Sampling`, built once where
a request enters (the API, the CLI, the server, a benchmark) and carried as is
to the core, which validates it. Its presets say whose defaults they are:

- :attr:`Sampling.API`: ``generate()`` and ``pyspec generate`` (llama.cpp's
  defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05);
- :attr:`Sampling.OPENAI`: the server, where a request that names nothing
  samples as OpenAI's API does (temperature 1, no truncation);
- :attr:`Sampling.GREEDY`: the benchmarks, so that every runner writes the same
  text (the API's settings at temperature 0; a bench run at another
  temperature keeps the API's truncation).

The other defaults of a generation, a model and a server live here too, so
that the API, the CLI's options and the server read one number.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import ClassVar, Optional

from . import _core

__all__ = ["MAX_DRAFT", "MAX_SEQUENCES", "MAX_TOKENS", "N_CTX", "N_CTX_BENCH", "N_CTX_MIN", "N_CTX_SERVER", "PARALLEL",
           "PREFILL_CHUNK", "SEED_BITS", "SEED_MAX", "Sampling", "check_seed"]


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn from a model's logits; the order of the steps is
    ``cpp/core/sampling.h``'s. ``temperature`` 0 is greedy; top-k 0, top-p 1
    and min-p 0 switch each truncation off. Frozen: change one field with
    :meth:`replace`, which leaves ``None`` fields as they are."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    API: ClassVar["Sampling"]
    OPENAI: ClassVar["Sampling"]
    GREEDY: ClassVar["Sampling"]

    def replace(self, **changes) -> "Sampling":
        """This value with the given fields changed (a ``None`` changes nothing)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def native(self) -> "_core.SamplingParams":
        """The core's form; the core validates it (ValueError with the reason)."""
        top_k = self.top_k if self.top_k <= 2**31 - 1 else 0  # past any vocabulary: off (the core's is 32-bit)
        return _core.SamplingParams(temperature=self.temperature, top_k=top_k, top_p=self.top_p, min_p=self.min_p)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


Sampling.API = Sampling()
Sampling.OPENAI = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
Sampling.GREEDY = Sampling(temperature=0.0)

#: Tokens an answer may have when the caller does not say (API and CLI).
MAX_TOKENS = 256
#: The longest draft any policy makes (the core's bound; policies' tables cover it).
MAX_DRAFT: int = _core.MAX_DRAFT
#: The most sequences one context holds (llama.cpp's limit): samples of one
#: prompt, prompts of one batch, a server's slots.
MAX_SEQUENCES: int = _core.MAX_SEQUENCES
#: A seed is any 64-bit integer (the core's); the ones pyspec draws are below
#: 2**63, so that they survive JSON and every language's integers.
SEED_MAX = 2**64 - 1
SEED_BITS = 63
#: Context cells of a model when the caller does not say, and the fewest a
#: context may have (the core's defaults and check).
N_CTX: int = _core.ModelParams().n_ctx
N_CTX_MIN = 16
#: A server's slots (sequences generated together), the context they share
#: (1024 cells each), and the most prompt tokens a round prefills beside
#: running sequences (bounds how long a new prompt holds up the others).
PARALLEL = 8
N_CTX_SERVER = 8192
#: The in-process benchmarks' context: the suite's prompts and answers fit it.
N_CTX_BENCH = 2048
PREFILL_CHUNK = 256


def check_seed(seed: int) -> int:
    """``seed`` if it is a seed the core takes, else ValueError."""
    try:
        value = operator.index(seed)  # ints and numpy's integers, not floats
    except TypeError:
        value = None
    if isinstance(seed, bool) or value is None or not 0 <= value <= SEED_MAX:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return value
