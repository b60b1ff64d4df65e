"""Batch rounding: the measured row law, and the near-tie rule of every greedy comparison.

A row (the target's logits at one position) takes other CPU kernels inside a
batch than alone: the weights are repacked for multi-row products (and the
activations quantised for them another way), and flash attention sums over
the cells in the order they lie in. So the same row differs between a lone
decode and a batch, and so do runs whose rows were batched differently
(another draft length, other sequences beside them, a prefix computed in
another split). tests/test_row_law.py measures how far, in every batch shape
the engine makes, and asserts the bounds below (:data:`ROW_LAW`, per model);
its negative controls (a row one position off, another sequence's cell
visible, a stale mask) exceed them by a clear margin, so a bug that moves rows
more than rounding does is not excused here.

The rule (:func:`near_tie_flips`): two greedy runs may part only where the
*lone row* (:func:`lone_row`: the engine's own lone split, recomputed) has
both tokens they chose within ``2 * logit`` of its most likely token
(:meth:`RowLaw.near_tie`): each run's row is within ``logit`` of the lone row
on every likely token, so the token one run preferred can lie at most twice
that below any other there. Judged on one run's own row instead (a
server's reported log-probabilities, itself up to the bound away) the gap may
be twice as wide again (:meth:`RowLaw.near_tie_batched`). How many sequences
may flip is bounded too (:func:`max_flips`): from the measured rate at which
the rounding changed a row's most likely token, at significance FLIP_ALPHA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

#: Likely tokens: those a lone row gives at least this probability (T = 1). The
#: logit bound holds on them; rounding moves the logits of unlikely tokens more
#: (up to ~3.8 on the test model), and a near tie is between likely tokens.
LIKELY = 1e-3


@dataclass(frozen=True)
class RowLaw:
    """How far this build's kernels move a model's rows between a lone decode
    and a batch (tests/test_row_law.py asserts these bounds; measured figures in
    ``measured``, and the bounds leave a quarter or more of room for other CPUs)."""

    logit: float      # max |d log p| over the lone row's likely tokens: logits up to the row's normalising shift
    prob: float       # max |d p| over the vocabulary, at T = 1
    flip_rate: float  # share of rows whose most likely token the rounding changed
    measured: str

    def near_tie(self) -> float:
        """Largest lone top-two gap (logits) at which two runs may choose differently."""
        return 2 * self.logit

    def near_tie_batched(self) -> float:
        """The same gap judged on one of the runs' own rows."""
        return 4 * self.logit


#: The one home of the row law, by GGUF file name (the catalog's models).
#: Measured on an AMD EPYC (Zen 4), 2 cores, over tests/test_row_law.py's 16
#: texts x 16 greedy rows in 11 batch shapes, flash attention on and off.
ROW_LAW = {
    "gemma-3-270m-q4_k_m": RowLaw(
        logit=1.45, prob=0.22, flip_rate=0.06,
        measured="max |d log p| 1.14 (verify 2, flash off), max |d p| 0.171 (cache hit, flash on); the most "
                 "likely token changed in up to 12 of 256 rows (seqs 16, flash off)"),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": RowLaw(
        logit=0.85, prob=0.095, flip_rate=0.04,
        measured="max |d log p| 0.67 (verify 8, flash on), max |d p| 0.074 (verify 8, flash off); the most "
                 "likely token changed in up to 7 of 256 rows (seqs 4, flash off)"),
}


def row_law(model) -> RowLaw:
    """The law of ``model`` (a pyspec.Model, its core, or a GGUF path); a model
    not measured gets the widest bounds measured (conservative)."""
    path = model if isinstance(model, (str, os.PathLike)) else getattr(getattr(model, "native", model), "path")
    name = os.path.basename(str(path))
    name = name[:-5] if name.endswith(".gguf") else name
    if name in ROW_LAW:
        return ROW_LAW[name]
    widest = lambda f: max(getattr(law, f) for law in ROW_LAW.values())  # noqa: E731
    return RowLaw(widest("logit"), widest("prob"), widest("flip_rate"), f"not measured for {name}: the widest")


#: Significance of the flip-count bound: a correct build flips more sequences
#: than max_flips allows with probability below this.
FLIP_ALPHA = 1e-3


def lone_rows(model, prompt: Sequence[int], continuation: Sequence[int] = (), n: Optional[int] = None):
    """The lone rows after ``prompt``: the prompt but its last token as one
    batch, then one token a decode, as the engine decodes a lone sequence.
    Teacher-forced along ``continuation`` and then greedy, ``n`` rows in all
    (default: one per continuation token, plus the next). Returns
    ``(tokens, rows)``: the n tokens the rows chose or were given, and the
    float32 logits [n, n_vocab]; row i predicts tokens[i]. ``model`` is a
    pyspec.Model or its native core; its sequence 0 is left empty."""
    core = getattr(model, "native", model)
    prompt, continuation = list(prompt), list(continuation)
    n = len(continuation) + 1 if n is None else n
    core.truncate(0)
    if len(prompt) > 1:
        core.decode(prompt[:-1], 0, 0)
    tokens, rows, last = [], [], prompt[-1]
    for i in range(n):
        core.decode([last], len(prompt) - 1 + i, 1)
        row = np.array(core.logits(0), dtype=np.float32)
        last = continuation[i] if i < len(continuation) else int(np.argmax(row))
        rows.append(row)
        tokens.append(last)
    core.truncate(0)
    return tokens, np.stack(rows)


def lone_row(model, prompt: Sequence[int], continuation: Sequence[int] = ()) -> np.ndarray:
    """The lone row after ``prompt + continuation`` (:func:`lone_rows`'s last), float64."""
    _, rows = lone_rows(model, prompt, continuation)
    return rows[-1].astype(np.float64)


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Where two token lists part (the shorter's length when one is the other's
    prefix), None when equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def near_tie_flips(model, prompt_tokens: Sequence[int], got: Sequence[int], want: Sequence[int]) -> int:
    """0 when the greedy token lists are equal; 1 when they part at a near tie
    of the lone row: both chosen tokens within the model's RowLaw.near_tie of
    its most likely token (so the one a run did not prefer there is a runner-up
    of it, the second where only two are that close); fails otherwise. A list
    that ends where the other goes on chose an end of generation there."""
    t = first_difference(got, want)
    if t is None:
        return 0
    row = lone_row(model, prompt_tokens, list(want[:t]))
    core = getattr(model, "native", model)
    tie = row_law(model).near_tie()
    close = {int(x): float(row.max() - row[x]) for x in np.flatnonzero(row >= row.max() - tie)}
    chosen = [seq[t] if t < len(seq) else None for seq in (got, want)]
    for c in chosen:
        ok = c in close if c is not None else any(core.is_eog(x) for x in close)
        what = "an end of generation" if c is None else c
        assert ok, (f"the runs part at token {t} ({chosen[0]} vs {chosen[1]}), and {what} is not within "
                    f"{tie:.2f} logits of the lone row's most likely token (those are {close}): not a near tie "
                    f"(near_ties.ROW_LAW)")
    print(f"near-tie flip at token {t}: lone gaps to the most likely token {[close.get(c) for c in chosen]}")
    return 1


def logprob_flip(law: RowLaw, ref_top: dict, ref_token: str, other_token: str, where: str) -> None:
    """The rule on one run's own row (``ref_top``: its top log-probabilities
    as {piece: logprob}, at least two): both chosen pieces among its top two,
    within ``law.near_tie_batched()`` (log-probability gaps are logit gaps)."""
    top = sorted(ref_top.items(), key=lambda kv: -kv[1])[:2]
    pieces = [p for p, _ in top]
    gap, tie = top[0][1] - top[1][1], law.near_tie_batched()
    assert ref_token in pieces and other_token in pieces and gap <= tie, (
        f"{where}: {ref_token!r} vs {other_token!r}, the reference row's top two {pieces} are {gap:.3f} logits "
        f"apart: not a near tie (both must be its top two within {tie:.2f}, near_ties.ROW_LAW)")
    print(f"{where}: near-tie flip ({ref_token!r} / {other_token!r}, gap {gap:.3f} logits)")


def max_flips(law: RowLaw, n_seq: int, n_tokens: int, *, batched: bool = False) -> int:
    """How many of ``n_seq`` greedy sequences of ``n_tokens`` tokens may part
    from their reference: the smallest k that a build whose rows flip at the
    measured rate exceeds with probability below FLIP_ALPHA. A token flips with
    probability law.flip_rate against a lone run, twice that between two
    batched runs (either may); a sequence within n_tokens with
    1 - (1 - rate)^n_tokens."""
    from scipy import stats

    rate = min(1.0, law.flip_rate * (2 if batched else 1))
    p = 1.0 - (1.0 - rate) ** n_tokens
    k = 0
    while k < n_seq and stats.binom.sf(k, n_seq, p) >= FLIP_ALPHA:
        k += 1
    return k


def assert_flips(law: RowLaw, flips: int, n_seq: int, n_tokens: int, *, batched: bool = False,
                 what: str = "") -> None:
    """The flip-count bound of :func:`max_flips`."""
    bound = max_flips(law, n_seq, n_tokens, batched=batched)
    print(f"{what}near-tie flips: {flips} of {n_seq} sequences (bound {bound} at alpha {FLIP_ALPHA})")
    assert flips <= bound, (f"{what}{flips} of {n_seq} greedy sequences flipped at near ties; the measured flip "
                            f"rate allows {bound} (alpha {FLIP_ALPHA}, near_ties.max_flips)")


def row_deviation(row, lone) -> tuple:
    """(max |d log p| over the lone row's likely tokens, max |d p| over the
    vocabulary, whether the most likely token changed) of a row against the
    lone one (logits; ``lone`` may be its log_softmax already)."""
    lp, lone_lp = log_softmax(row), log_softmax(lone)
    p, p_lone = np.exp(lp), np.exp(lone_lp)
    likely = p_lone >= LIKELY
    return (float(np.abs(lp[likely] - lone_lp[likely]).max()), float(np.abs(p - p_lone).max()),
            int(np.argmax(lp)) != int(np.argmax(lone_lp)))


def log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float32)
    z = x - x.max()
    return z - np.log(np.exp(z).sum())
