"""How tokens are drawn: the settings value :class:`Sampling`, and the maths
(logits to probabilities, and the lossless speculative verification rule).

:class:`Sampling` is one frozen value, built once where a request enters (the
API, the CLI, the server, a benchmark) and carried as is to the core, which
validates it. Its presets say whose defaults they are:

- :attr:`Sampling.API`: ``generate()`` and ``pyspec generate`` (llama.cpp's
  defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05);
- :attr:`Sampling.OPENAI`: the server, where a request that names nothing
  samples as OpenAI's API does (temperature 1, no truncation);
- :attr:`Sampling.GREEDY`: the benchmarks, so that every runner writes the same
  text (the API's settings at temperature 0; a bench run at another
  temperature keeps the API's truncation).

The maths is the public Python surface of the C++ sampling core (``pyspec._core.sampling``),
the same code the engine runs. Everything here is a thin wrapper: it converts Python
and numpy arguments to what the core takes, and the core validates them (settings,
shapes, probabilities), raising :class:`ValueError` with a message that says what is
wrong.

Order of the settings (documented in full in ``cpp/core/sampling.h``), following
llama.cpp's default sampler chain:

1. ``temperature == 0``: greedy, one-hot on the largest logit (lowest token id on ties).
2. top-k, then top-p, then min-p, all on the temperature-1 probabilities, each keeping a
   prefix of the tokens ordered by (probability descending, token id ascending). top-p
   works on the top-k survivors renormalised (as llama.cpp does) and keeps the smallest
   prefix whose cumulative mass is ``>= top_p``; min-p keeps ``p >= min_p * p_max``.
3. Temperature is applied to the surviving logits, which are then renormalised
   (softmax in double precision with the maximum subtracted).

Verification (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2): draft ``x_i`` is
accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``, left to right; at the first
rejection the replacement is drawn from the normalised residual ``max(0, p_i - q_i)`` and
the round stops; if every draft is accepted a bonus token is drawn from ``p[n]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Mapping, Tuple

import numpy as np

from . import _core
from .settings import check_seed

__all__ = [
    "Sampling",
    "VARIANTS",
    "distribution",
    "apply_penalties",
    "verify",
    "verify_many",
]


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn from a model's logits; the order of the steps is
    ``cpp/core/sampling.h``'s. ``temperature`` 0 is greedy; top-k 0, top-p 1
    and min-p 0 switch each truncation off. Frozen: change one field with
    :meth:`replace`, which leaves ``None`` fields as they are.

    Before those steps, as llama.cpp's chains do (``cpp/core/penalties.h``):
    ``logit_bias`` is added to the logits (token id -> bias; ``-inf``
    forbids the token), then the penalties look at the last
    ``penalty_last_n`` tokens before the row (-1: all of them, 0: none): a
    token seen there has its logit divided by ``repeat_penalty`` (multiplied
    where it is negative), lowered by ``frequency_penalty`` per occurrence and
    by ``presence_penalty`` once. The window holds the prompt's tokens when
    ``penalize_prompt`` (llama-server, llama-cli) and only the generated ones
    otherwise (llama-cpp-python). Speculation applies them to every verified
    row with the drafts before it, so they stay lossless.

    ``infill``: llama.cpp's ``infill`` sampler after the truncations, as editor
    plugins ask for it (``cpp/core/infill.h``): it ends a suggestion where
    the end is likely enough and keeps only the clearly likely tokens (those
    sharing a prefix counted as one). It needs ``top_k`` in 1..256 and a
    model's vocabulary (a generation attaches its target's)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    penalize_prompt: bool = True
    logit_bias: Tuple[Tuple[int, float], ...] = ()
    infill: bool = False

    def __post_init__(self):
        # One canonical, hashable form: sorted (token, bias) pairs, from a dict or pairs.
        bias = self.logit_bias
        items = bias.items() if isinstance(bias, Mapping) else (bias or ())
        try:
            pairs = tuple(sorted((int(t), float(b)) for t, b in items))
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
        object.__setattr__(self, "logit_bias", pairs)

    API: ClassVar["Sampling"]
    OPENAI: ClassVar["Sampling"]
    GREEDY: ClassVar["Sampling"]

    def replace(self, **changes) -> "Sampling":
        """This value with the given fields changed (a ``None`` changes nothing)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def native(self) -> "_core.SamplingParams":
        """The core's form; the core validates it (ValueError with the reason)."""
        top_k = self.top_k if self.top_k <= 2**31 - 1 else 0  # past any vocabulary: off (the core's is 32-bit)
        return _core.SamplingParams(temperature=self.temperature, top_k=top_k, top_p=self.top_p, min_p=self.min_p,
                                    infill=self.infill)

    @property
    def penalized(self) -> bool:
        """Whether any bias or penalty changes the logits."""
        return bool(self.logit_bias) or (self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0))

    def native_penalties(self) -> "_core.Penalties":
        """The core's form of the biases and penalties (it validates them)."""
        return _core.Penalties(repeat=self.repeat_penalty, frequency=self.frequency_penalty,
                               presence=self.presence_penalty, last_n=self.penalty_last_n,
                               include_prompt=self.penalize_prompt, logit_bias=list(self.logit_bias))

    def truncation(self) -> dict:
        """The settings :func:`distribution` takes (temperature and the truncations)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["logit_bias"] = {str(t): b for t, b in self.logit_bias}
        return d


Sampling.API = Sampling()
Sampling.OPENAI = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
Sampling.GREEDY = Sampling(temperature=0.0)

_core_sampling = _core.sampling

#: Verification variants accepted by :func:`verify_many` (the core's list). Only
#: ``"correct"`` is the real rule; the others are deliberately wrong (or suboptimal)
#: negative controls used by the statistical tests and ``pyspec check`` to show those
#: tests can fail:
#:
#: - ``"residual_is_p"``: on rejection sample from ``p`` instead of the residual (biased);
#: - ``"accept_all"``: accept every draft (the output follows ``q``, not ``p``);
#: - ``"sample_and_match"``: draw ``y ~ p``, accept iff ``y`` equals the draft, else emit
#:   ``y``. Its output does follow ``p``, but it accepts with probability ``sum p*q``
#:   instead of the optimal ``sum min(p, q)``, so the acceptance-rate test rejects it.
VARIANTS = tuple(_core_sampling.VARIANTS)


def _as_real_array(x, name: str, dtype) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
        or arr.dtype == np.bool_
    ):
        raise ValueError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def distribution(
    logits,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    infill=None,
) -> np.ndarray:
    """Return the distribution actually sampled from, given logits and settings.

    Args:
        logits: 1-D array of logits over the vocabulary, float32 (other real dtypes are
            converted to float32). ``-inf`` marks a forbidden token; NaN and ``+inf`` are
            errors, as is every logit being ``-inf``.
        temperature: ``>= 0``; 0 means greedy (one-hot on the argmax, lowest id on ties).
        top_k: keep the ``top_k`` most probable tokens; 0 = off. Values above the
            vocabulary size are allowed and mean "off".
        top_p: in ``(0, 1]``; keep the smallest most-probable prefix with mass ``>= top_p``
            (of the top-k survivors); 1 = off.
        min_p: in ``[0, 1]``; keep tokens with ``p >= min_p * p_max``; 0 = off.
        infill: a model (:class:`pyspec.Model` or its core) whose vocabulary the
            infill sampler reads (``cpp/core/infill.h``; needs ``top_k`` in
            1..256); None: no infill step.

    Returns:
        A float64 array of the same length, non-negative and summing to 1 (up to
        rounding), zero outside the kept support.

    Raises:
        ValueError: bad settings, logits not 1-D or empty, NaN / +inf / all -inf logits.
    """
    arr = _as_real_array(logits, "logits", np.float32)
    # The core's top_k is 32-bit: beyond any vocabulary means off, and every
    # negative value is as wrong as -1 (the core says so).
    top_k = 0 if top_k > np.iinfo(np.int32).max else max(top_k, -1)
    vocab = None if infill is None else getattr(infill, "native", infill).infill_vocab()
    return _core_sampling.distribution(arr, float(temperature), int(top_k), float(top_p),
                                       float(min_p), vocab)


def apply_penalties(logits, history, settings: Sampling, n_prompt: int = 0) -> np.ndarray:
    """The logits of the row that follows ``history`` after ``settings``'
    ``logit_bias`` and penalties (the steps before :func:`distribution`'s).

    Args:
        logits: 1-D float32 array over the vocabulary (the model's raw row).
        history: the token ids before the row, oldest first; its first
            ``n_prompt`` are the prompt (outside the window unless
            ``settings.penalize_prompt``).

    Returns:
        A float32 array of the same length.
    """
    arr = _as_real_array(logits, "logits", np.float32)
    hist = np.ascontiguousarray(np.asarray(history, dtype=np.int64).astype(np.int32))
    return _core_sampling.penalize(arr, hist, settings.native_penalties(), int(n_prompt))


def _convert_verify_inputs(p, q, draft):
    """numpy arrays of the core's dtypes; the core checks shapes and values."""
    p = _as_real_array(p, "p", np.float64)
    q = _as_real_array(q, "q", np.float64)
    if draft is not None:
        d = np.asarray(draft)
        if not (np.issubdtype(d.dtype, np.integer)):
            raise ValueError(f"draft must be an integer array, got dtype {d.dtype}")
        if d.size and (d.min() < 0 or d.max() > np.iinfo(np.int32).max):
            raise ValueError(f"draft tokens must be in [0, 2**31), got {d.tolist()}")  # before int32 wraps them
        draft = np.ascontiguousarray(d, dtype=np.int32)
    return p, q, draft


def verify(p, q, draft, seed: int, *, storage: str = "auto") -> Tuple[int, int]:
    """Run one verification round with a fresh random stream from ``seed``.

    Args:
        p: float64 array ``(n+1, V)``: the target's distributions at the n draft positions
            and the bonus position, each row summing to 1 (tolerance 1e-6).
        q: float64 array ``(n, Vq)``: the distributions the drafts were actually drawn from.
            ``Vq`` may differ from ``V`` (vocabularies that differ by padding ids): q is 0
            past its last column, p past its own, so such drafts are always rejected.
        draft: int array ``(n,)``: the proposed tokens; ``q[i, draft[i]]`` must be > 0.
        seed: integer in ``[0, 2**64)``; the same seed gives the same result, and equals
            round 0 of :func:`verify_many` with that seed.
        storage: internal representation of the rows (``"auto"``, ``"dense"``,
            ``"sparse"``); a testing knob, results are identical in distribution.

    Returns:
        ``(n_accepted, next_token)``: the number of accepted drafts (0..n) and the token
        emitted after them (residual sample on rejection, bonus sample from ``p[n]`` if
        all were accepted).

    Raises:
        ValueError: shapes, NaN or negative probabilities, rows not summing to 1, draft
            tokens out of range or with ``q(x) = 0``.
    """
    if draft is None:
        raise ValueError("draft must be given; use verify_many(draft=None) to sample drafts")
    p, q, draft = _convert_verify_inputs(p, q, draft)
    acc, nxt = _core_sampling.verify_many(p, q, draft, 1, check_seed(seed), "correct",
                                          storage, False)
    return int(acc[0]), int(nxt[0])


def verify_many(
    p,
    q,
    draft,
    n_rounds: int,
    seed: int,
    variant: str = "correct",
    *,
    storage: str = "auto",
    return_drafts: bool = False,
):
    """Run ``n_rounds`` independent verification rounds in C++ (GIL released).

    Args:
        p: float64 array ``(n+1, V)`` of target distributions (rows sum to 1).
        q: float64 array ``(n, V)`` of draft distributions (rows sum to 1).
        draft: int array ``(n,)`` used in every round, or ``None``: then each round draws
            its drafts inside C++, draft ``i`` from ``q[i]`` (rows are fixed, i.e. the
            model's conditionals do not depend on the prefix; enough to test the rule).
        n_rounds: number of rounds, ``>= 0``.
        seed: integer in ``[0, 2**64)``; one random stream for all rounds.
        variant: ``"correct"`` (the real rule) or one of the TEST-ONLY negative controls
            ``"residual_is_p"``, ``"accept_all"``, ``"sample_and_match"`` (see
            :data:`VARIANTS`). Never use those for generation.
        storage: internal row representation (``"auto"``, ``"dense"``, ``"sparse"``);
            a testing knob for the sparse and dense code paths.
        return_drafts: with ``draft=None``, also return the sampled drafts.

    Returns:
        ``(n_accepted, next_token)``, two int32 arrays of length ``n_rounds``; with
        ``return_drafts=True`` a third ``(n_rounds, n)`` int32 array of drafts.

    Raises:
        ValueError: as :func:`verify`, plus an unknown variant or negative ``n_rounds``.
    """
    p, q, draft = _convert_verify_inputs(p, q, draft)
    return _core_sampling.verify_many(p, q, draft, int(n_rounds), check_seed(seed), variant,
                                      storage, bool(return_drafts))
