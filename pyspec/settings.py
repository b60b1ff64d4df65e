"""The defaults every entry point shares, each defined once: of a
generation, a model and a server, so that the API, the CLI's options and the
server read one number. (How a token is drawn, :class:`~pyspec.Sampling`, is
pyspec/sampling.py's; how drafts are made, :class:`~pyspec.Drafting`,
pyspec/drafting.py's.)
"""

from __future__ import annotations

import operator

from . import _core

__all__ = ["MAX_DRAFT", "MAX_SEQUENCES", "MAX_TOKENS", "N_CTX", "N_CTX_BENCH", "N_CTX_MIN", "N_CTX_SERVER", "PARALLEL",
           "PREFILL_CHUNK", "SEED_BITS", "SEED_MAX", "check_seed"]


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
PREFILL_CHUNK = 128


def check_seed(seed: int) -> int:
    """``seed`` if it is a seed the core takes, else ValueError."""
    try:
        value = operator.index(seed)  # ints and numpy's integers, not floats
    except TypeError:
        value = None
    if isinstance(seed, bool) or value is None or not 0 <= value <= SEED_MAX:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return value
