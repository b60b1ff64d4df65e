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
visible, a stale mask) move rows beyond them.

The rule (:func:`near_tie_flips`): two greedy runs may part only where the
*lone row* (:func:`lone_row`: the engine's own lone split, recomputed) has
both tokens they chose within ``2 * logit`` of its most likely token
(:meth:`RowLaw.near_tie`): each run's row is within ``logit`` of the lone row
on every likely token, so the token one run preferred can lie at most twice
that below any other there; the token a run did not prefer is then one of the
lone row's runners-up. Judged on one run's own row instead (a server's
reported log-probabilities, itself up to the bound away) the gap may be twice
as wide again (:func:`logprob_flip`).

How many sequences may flip is bounded too (:func:`assert_flips`): a position
whose lone top two lie g logits apart flips with at most the measured chance
that rounding moves a row's gaps by more than g (``RowLaw.gap_tail``); along
each reference path that gives each sequence's chance of a flip, and the
count a correct build exceeds with probability below FLIP_ALPHA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

#: Likely tokens: those a lone row gives at least this probability (T = 1). The
#: logit bound holds on them; rounding moves the logits of unlikely tokens more
#: (up to ~3.8 on the test model), and a near tie is between likely tokens.
LIKELY = 1e-3
#: A row's gaps: those between its most likely token and each of its TOP_K most
#: likely (the tokens a flip could bring up), in logits.
TOP_K = 8


@dataclass(frozen=True)
class RowLaw:
    """How far this build's kernels move a model's rows between a lone decode
    and a batch (tests/test_row_law.py asserts these bounds; measured figures in
    ``measured``, and the bounds leave room for other CPUs)."""

    logit: float   # max |d log p| over the lone row's likely tokens: logits up to the row's normalising shift
    prob: float    # max |d p| over the vocabulary, at T = 1
    # (g, P): at most a share P of rows have a gap (TOP_K) that moved by more than g logits
    gap_tail: Tuple[Tuple[float, float], ...]
    measured: str

    def near_tie(self) -> float:
        """Largest lone gap (logits) between two tokens that two runs may choose between."""
        return 2 * self.logit

    def near_tie_batched(self) -> float:
        """The same gap judged on one of the runs' own rows."""
        return 4 * self.logit

    def moved_beyond(self, g: float) -> float:
        """The share of rows whose gaps rounding moved by more than g (gap_tail, as a step)."""
        return next((share for at, share in reversed(self.gap_tail) if g >= at), 1.0)

    def flip_chance(self, gap: float, *, batched: bool = False) -> float:
        """The chance that a position whose reference top two lie ``gap``
        logits apart flips: against a lone run, the chance that the batched
        row's gaps moved by more than that; between two batched runs (or judged
        on a batched row), that either moved by more than half of it."""
        return min(1.0, 2 * self.moved_beyond(gap / 2)) if batched else self.moved_beyond(gap)


#: The one home of the row law, by GGUF file name (the catalog's models).
#: Measured on an AMD EPYC (Zen 4), 2 cores, over tests/test_row_law.py's 16
#: texts x 16 greedy rows in 11 batch shapes, flash attention on and off.
ROW_LAW = {
    "gemma-3-270m-q4_k_m": RowLaw(
        logit=1.45, prob=0.22,
        gap_tail=((0.1, 1.0), (0.2, 0.7), (0.3, 0.35), (0.5, 0.12), (0.75, 0.04), (1.0, 0.015), (1.5, 0.005),
                  (2.9, 0.0)),
        measured="max |d log p| 1.14 (verify 2, flash off), max |d p| 0.171 (cache hit, flash on); gaps moved "
                 "beyond 0.2 / 0.3 / 0.5 / 0.75 / 1.0 in up to 54 / 25 / 7.4 / 2.3 / 0.8 % of a shape's rows, "
                 "never beyond 1.2"),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": RowLaw(
        logit=0.85, prob=0.095,
        gap_tail=((0.1, 0.9), (0.2, 0.4), (0.3, 0.1), (0.5, 0.02), (0.75, 0.005), (1.7, 0.0)),
        measured="max |d log p| 0.67 (verify 8, flash on), max |d p| 0.074 (verify 8, flash off); gaps moved "
                 "beyond 0.1 / 0.2 / 0.3 / 0.5 in up to 69 / 29 / 6.3 / 0.5 % of a shape's rows, never beyond 0.52"),
}


def row_law(model) -> RowLaw:
    """The law of ``model`` (a pyspec.Model, its core, or a GGUF path); a model
    not measured gets the widest bounds measured (conservative)."""
    path = model if isinstance(model, (str, os.PathLike)) else getattr(getattr(model, "native", model), "path")
    name = os.path.basename(str(path))
    name = name[:-5] if name.endswith(".gguf") else name
    if name in ROW_LAW:
        return ROW_LAW[name]
    laws = list(ROW_LAW.values())
    grid = sorted({g for law in laws for g, _ in law.gap_tail})
    tail = tuple((g, max(law.moved_beyond(g) for law in laws)) for g in grid)
    return RowLaw(max(law.logit for law in laws), max(law.prob for law in laws), tail,
                  f"not measured for {name}: the widest")


#: Significance of the flip-count bound: a correct build flips more sequences
#: than max_flips allows with probability below this.
FLIP_ALPHA = 1e-3


def lone_rows(model, prompt: Sequence[int], continuation: Sequence[int] = (), n: Optional[int] = None, *,
              batched: Optional[int] = None):
    """The lone rows after ``prompt``: its first ``batched`` tokens as one batch
    (default: all but the last, as the engine decodes a lone sequence's prompt;
    all of them: as a draft model catches up), then one token a decode.
    Teacher-forced along ``continuation`` and then greedy, ``n`` rows in all
    (default: one per continuation token, plus the next). Returns
    ``(tokens, rows)``: the n tokens the rows chose or were given, and the
    float32 logits [n, n_vocab]; row i predicts tokens[i]. ``model`` is a
    pyspec.Model or its native core; its sequence 0 is left empty."""
    core = getattr(model, "native", model)
    prompt, continuation = list(prompt), list(continuation)
    n = len(continuation) + 1 if n is None else n
    batched = len(prompt) - 1 if batched is None else batched
    core.truncate(0)
    if batched:
        core.decode(prompt[:batched], 0, int(batched == len(prompt)))
    for pos in range(batched, len(prompt)):
        core.decode([prompt[pos]], pos, 1)
    rows = [np.array(core.logits(0), dtype=np.float32)]
    chosen = lambda k: continuation[k] if k < len(continuation) else int(np.argmax(rows[k]))  # noqa: E731
    while len(rows) < n:
        core.decode([chosen(len(rows) - 1)], len(prompt) + len(rows) - 1, 1)
        rows.append(np.array(core.logits(0), dtype=np.float32))
    core.truncate(0)
    return [chosen(k) for k in range(n)], np.stack(rows)


def lone_row(model, prompt: Sequence[int], continuation: Sequence[int] = (), *,
             batched: Optional[int] = None) -> np.ndarray:
    """The lone row after ``prompt + continuation`` (:func:`lone_rows`'s last), float64."""
    _, rows = lone_rows(model, prompt, continuation, batched=batched)
    return rows[-1].astype(np.float64)


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Where two token lists part (the shorter's length when one is the other's
    prefix), None when equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def near_tie_flips(model, prompt_tokens: Sequence[int], got: Sequence[int], want: Sequence[int]) -> int:
    """0 when the greedy token lists are equal; 1 when they part at a near tie
    of the lone row (:func:`check_near_tie`); fails otherwise. A list that ends
    where the other goes on chose an end of generation there."""
    t = first_difference(got, want)
    if t is None:
        return 0
    row = lone_row(model, prompt_tokens, list(want[:t]))
    core = getattr(model, "native", model)
    chosen = [seq[t] if t < len(seq) else None for seq in (got, want)]
    check_near_tie(row, chosen, row_law(model).near_tie(), f"the runs part at token {t}", is_eog=core.is_eog)
    return 1


def check_near_tie(row, chosen, tie: float, where: str, is_eog=None) -> None:
    """Both ``chosen`` tokens within ``tie`` logits of ``row``'s most likely
    (the one a run did not prefer is then a runner-up of the row: its second
    where only two are that close); None stands for an end of generation."""
    row = np.asarray(row, dtype=np.float64)
    close = {int(x): float(row.max() - row[x]) for x in np.flatnonzero(row >= row.max() - tie)}
    for c in chosen:
        ok = c in close if c is not None else any(is_eog(x) for x in close)
        what = "an end of generation" if c is None else c
        assert ok, (f"{where} ({chosen[0]} vs {chosen[1]}), and {what} is not within {tie:.2f} logits of the row's "
                    f"most likely token (those are {close}): not a near tie (near_ties.ROW_LAW)")
    print(f"{where}: a near tie, gaps to the most likely token {[close.get(c) for c in chosen]}")


def logprob_flip(law: RowLaw, ref_top: dict, ref_token: str, other_token: str, where: str) -> None:
    """The rule on one run's own row (``ref_top``: its top log-probabilities
    as {piece: logprob}, a few): both chosen pieces among them, within
    ``law.near_tie_batched()`` of its most likely (log-probability gaps are
    logit gaps)."""
    best, tie = max(ref_top.values()), law.near_tie_batched()
    gaps = {p: best - v for p, v in ref_top.items()}
    assert all(t in gaps and gaps[t] <= tie for t in (ref_token, other_token)), (
        f"{where}: {ref_token!r} vs {other_token!r}, the reference row's top tokens lie {gaps} below its most likely: "
        f"not a near tie (both must be within {tie:.2f}, near_ties.ROW_LAW)")
    print(f"{where}: near-tie flip ({ref_token!r} / {other_token!r}, gaps {gaps[ref_token]:.3f} / "
          f"{gaps[other_token]:.3f} logits)")


def top_gap(row) -> float:
    """A row's top two logits' gap."""
    a, b = np.sort(np.asarray(row, dtype=np.float64))[-2:]
    return float(b - a)


def lone_gaps(model, prompt: Sequence[int], tokens: Sequence[int]) -> List[float]:
    """The top-two gaps of the lone rows that chose ``tokens`` after ``prompt``."""
    _, rows = lone_rows(model, prompt, list(tokens)[:-1], n=len(tokens))
    return [top_gap(r) for r in rows]


def logprob_gaps(top_logprobs: Sequence[dict]) -> List[float]:
    """The top-two gaps of a run's rows from its reported top log-probabilities."""
    return [float(np.subtract(*sorted(t.values(), reverse=True)[:2])) for t in top_logprobs]


def flip_chances(law: RowLaw, paths: Sequence[Sequence[float]], *, batched: bool = False) -> List[float]:
    """Each sequence's chance of a flip somewhere along its reference path: one
    less the chance that no position flips (``law.flip_chance`` of each top-two
    gap; the rounding of different rows taken as independent)."""
    return [1.0 - float(np.prod([1.0 - law.flip_chance(g, batched=batched) for g in gaps])) for gaps in paths]


def max_flips(chances: Sequence[float]) -> int:
    """The smallest k that the number of flipping sequences exceeds with
    probability below FLIP_ALPHA, each sequence flipping on its own with its
    chance (the Poisson-binomial law)."""
    law = np.zeros(len(chances) + 1)
    law[0] = 1.0
    for c in chances:
        law[1:] = law[1:] * (1 - c) + law[:-1] * c
        law[0] *= 1 - c
    tail = 1.0 - np.cumsum(law)  # P(more than k)
    return int(next(k for k in range(len(chances) + 1) if tail[k] < FLIP_ALPHA))


def assert_flips(flips: int, chances: Sequence[float], what: str = "") -> None:
    """The flip-count bound of :func:`max_flips`."""
    bound = max_flips(chances)
    print(f"{what}near-tie flips: {flips} of {len(chances)} sequences (chances {[round(c, 3) for c in chances]}, "
          f"bound {bound} at alpha {FLIP_ALPHA})")
    assert flips <= bound, (f"{what}{flips} of {len(chances)} greedy sequences flipped at near ties; the row law "
                            f"allows {bound} (alpha {FLIP_ALPHA}, near_ties.max_flips)")


def assert_near(model, cases, *, batched: bool = False, what: str = "") -> int:
    """Greedy token lists ``cases`` ((prompt tokens, got, want), ``want`` the
    reference) each equal or parting at a near tie (:func:`near_tie_flips`),
    and no more of them parting than the row law allows along the references'
    lone paths (:func:`assert_flips`; ``batched``: the references' rows were
    batched too, not lone). Comparisons with one reference are one event (a
    reference that itself parted from the lone path parts from all of them):
    it counts once, with their chances summed. Returns how many parted."""
    law, events = row_law(model), {}
    for prompt, got, want in cases:
        flipped, n = events.get((tuple(prompt), tuple(want)), (0, 0))
        events[(tuple(prompt), tuple(want))] = (max(flipped, near_tie_flips(model, prompt, got, want)), n + 1)
    chances = [min(1.0, n * flip_chances(law, [lone_gaps(model, list(prompt), list(want))], batched=batched)[0])
               for (prompt, want), (_, n) in events.items()]
    flips = sum(flipped for flipped, _ in events.values())
    assert_flips(flips, chances, what)
    return flips


def row_deviation(row, lone) -> tuple:
    """(max |d log p| over the lone row's likely tokens, max |d p| over the
    vocabulary, how far its gaps moved: max over the lone row's TOP_K most
    likely tokens x that are likely of |d (logit x - logit of its most
    likely)|, whether the most likely token changed) of a row against the
    lone one (logits; ``lone`` may be its log_softmax already)."""
    lp, lone_lp = log_softmax(row), log_softmax(lone)
    p, p_lone = np.exp(lp), np.exp(lone_lp)
    likely = p_lone >= LIKELY
    top = [x for x in np.argpartition(lone_lp, -TOP_K)[-TOP_K:] if likely[x]]
    t = int(np.argmax(lone_lp))
    gaps = np.abs((lp[top] - lp[t]) - (lone_lp[top] - lone_lp[t])).max()
    return (float(np.abs(lp[likely] - lone_lp[likely]).max()), float(np.abs(p - p_lone).max()), float(gaps),
            int(np.argmax(lp)) != t)


def log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float32)
    z = x - x.max()
    return z - np.log(np.exp(z).sum())
