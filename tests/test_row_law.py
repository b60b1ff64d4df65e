"""The row law (issue 57): how far this build's kernels move a row between a
lone decode and the same row inside a batch, measured in every batch shape
the engine makes, and the bounds that every near-tie rule of the suite takes
from it (near_ties.ROW_LAW, per model).

A row is the model's logits at one position of one sequence. The lone row
is the engine's lone split (near_ties.lone_rows: the prompt but its last
token as one batch, then one token a decode) in a context of its own. The
same rows, teacher-forced along each text's lone greedy path, are decoded
here with the other texts' cells in the cache (16 sequences), in each shape:

- ``verify k``: k consecutive rows of one sequence in one decode (a draft of
  k - 1 tokens and its bonus row), k = 2, 4, 8, 16;
- ``seqs n``: one row of each of n sequences a decode (continuous batching),
  n = 2, 4, 8, 16; ``mixed``: 4 sequences x 4 rows (drafts of several);
- ``cache hit``: the prompt and the first CACHED_ROWS generated tokens
  computed as one batch (an earlier request's cells, kept by the prompt
  cache), the later rows one at a time over them; ``copied``: the prompt's
  cells shared from another sequence (copy_prefix: n samples of one prompt).

Each row against its lone row (near_ties.row_deviation): max |d log p| over
the lone row's likely tokens (p >= 1e-3: logits up to the row's normalising
shift, where near ties are), max |d p| over the vocabulary, how far its gaps
moved (between its most likely token and each likely one of its top 8), and
whether the most likely token changed. The bounds hold for the test model
(flash attention on and off) and the default target; the share of rows whose
gaps moved beyond each g is tested against the law's gap_tail (one-sided
binomial at FLIP_ALPHA): it is what near_ties.assert_flips bounds flips by.

Negative controls, decoded on the same rows and compared the same way: a
row ``one position off`` (a verification reading its neighbour's row),
``another sequence's cell`` visible to the row (Model.test_share_cell), a
``stale mask`` hiding one cell of the row's own past (Model.test_hide_cell).
Each must exceed the logit bound CONTROL_MARGIN times over at its largest
(the rules judge near ties in logits), and the probability bound too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Tuple

import numpy as np
import pytest

from pyspec import _core

from near_ties import FLIP_ALPHA, RowLaw, log_softmax, lone_rows, row_deviation, row_law

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n <",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "import numpy as np\nimport matplotlib.pyplot as",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Water boils at 100 degrees Celsius, and it freezes at",
    "Monday, Tuesday, Wednesday,",
    "<html>\n<head>\n<title>",
    "SELECT name, email FROM users WHERE",
    "Dear Sir or Madam,\nI am writing to",
    "for (int i = 0; i < n; ++i) {",
    "The mitochondria is the powerhouse of",
    '{"name": "Alice", "age": 30, "city":',
    "To be, or not to be, that is the",
    "In 1969, the first humans landed on",
]
N_ROWS = 16
CACHED_ROWS = 4          # generated tokens an earlier request computed with the prompt (cache hit)
CONTROL_ROWS = 8         # rows decoded after each control's fault (fewer would weaken the controls)
CONTROL_MARGIN = 2.0     # each control's largest |d log p| must be this many times the bound
GRID = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)  # gap moves the report counts
ALL_SHAPES = ("verify 2", "verify 4", "verify 8", "verify 16", "seqs 2", "seqs 4", "seqs 8", "seqs 16", "mixed",
              "cache hit", "copied")


@dataclass
class Lone:
    """Each text's prompt, its lone greedy continuation and their lone rows."""

    prompts: List[List[int]]
    tokens: List[List[int]]
    rows: List[np.ndarray]  # log-probabilities [n_rows, n_vocab] each (T = 1); row i predicts tokens[i]

    def full(self, s: int) -> List[int]:
        return self.prompts[s] + self.tokens[s]

    def at(self, s: int, i: int) -> Tuple[int, int]:
        """(position, token) of row i of text s: the token decoded to produce it."""
        pos = len(self.prompts[s]) - 1 + i
        return pos, self.full(s)[pos]


@dataclass
class Deviation:
    """The largest deviations of one shape's rows from the lone ones, and how far each row's gaps moved."""

    rows: int = 0
    logit: float = 0.0
    prob: float = 0.0
    flips: int = 0
    moves: List[float] = field(default_factory=list)

    def add(self, row: np.ndarray, lone: np.ndarray) -> None:
        dl, dp, moved, flipped = row_deviation(row, lone)
        self.rows += 1
        self.logit, self.prob = max(self.logit, dl), max(self.prob, dp)
        self.moves.append(moved)
        self.flips += flipped

    def beyond(self, g: float) -> int:
        return sum(m > g for m in self.moves)


def lone_texts(path: str, flash_attn: int, texts, n_rows: int) -> Lone:
    lone = _core.Model(path, n_ctx=512, flash_attn=flash_attn)
    prompts = [lone.tokenize(t) for t in texts]
    out = Lone(prompts, [], [])
    for p in prompts:
        tokens, rows = lone_rows(lone, p, n=n_rows)
        out.tokens.append(tokens)
        out.rows.append(np.stack([log_softmax(r) for r in rows]))
    return out


def prefill(model, lone: Lone, s: int) -> None:
    """Sequence s holds its prompt but the last token (one batch, as the lone run)."""
    model.truncate(0, s)
    model.decode(lone.prompts[s][:-1], 0, 0, seq=s)


def reset(model, lone: Lone, seqs) -> None:
    for s in seqs:
        model.truncate(len(lone.prompts[s]) - 1, s)


def batched(model, lone: Lone, seqs, rows: range) -> Iterator[Tuple[int, int, np.ndarray]]:
    """Rows `rows` of each sequence in `seqs`, all in one decode: (s, i, logits)."""
    batch = [(s, *lone.at(s, i), True) for s in seqs for i in rows]
    model.decode_rows(batch)
    for k, (s, i) in enumerate((s, i) for s in seqs for i in rows):
        yield s, i, np.array(model.logits(k))


def groups(n_seq: int, size: int) -> List[range]:
    return [range(g, min(g + size, n_seq)) for g in range(0, n_seq, size)]


def shape_rows(model, lone: Lone, shape: str) -> Iterator[Tuple[int, int, np.ndarray]]:
    """The rows of `shape` (module docstring), every sequence prefilled before and after."""
    n_seq, n_rows = len(lone.prompts), len(lone.rows[0])
    kind, _, arg = shape.partition(" ")
    if kind == "verify":
        for s in range(n_seq):
            for block in groups(n_rows, int(arg)):
                yield from batched(model, lone, [s], block)
            reset(model, lone, [s])
    elif kind in ("seqs", "mixed"):
        size, per = (int(arg), 1) if kind == "seqs" else (4, 4)
        for g in groups(n_seq, size):
            for block in groups(n_rows, per):
                yield from batched(model, lone, list(g), block)
            reset(model, lone, g)
    elif shape == "cache hit":
        for s in range(n_seq):
            n = len(lone.prompts[s]) - 1 + CACHED_ROWS
            model.truncate(0, s)
            model.decode(lone.full(s)[:n], 0, 0, seq=s)
            for i in range(CACHED_ROWS, n_rows):
                yield from batched(model, lone, [s], range(i, i + 1))
            prefill(model, lone, s)
    elif shape == "copied":
        for s in range(n_seq):
            dst = (s + 1) % n_seq
            model.copy_prefix(s, dst, len(lone.prompts[s]) - 1)
            for i in range(n_rows):
                pos, token = lone.at(s, i)
                model.decode_rows([(dst, pos, token, True)])
                yield s, i, np.array(model.logits(0))
            prefill(model, lone, dst)
    else:
        raise ValueError(shape)


def control_rows(model, lone: Lone, control: str) -> Iterator[Tuple[int, int, np.ndarray]]:
    """Rows under a deliberate fault (module docstring): (s, i, logits) to compare with lone row i."""
    n_seq, n_rows = len(lone.prompts), min(CONTROL_ROWS, len(lone.rows[0]) - 1)
    for s in range(n_seq):
        last = len(lone.prompts[s]) - 2  # the sequence's last cell
        if control == "one position off":
            rows = list(batched(model, lone, [s], range(n_rows + 1)))
            for (_, i, _), (_, _, next_row) in zip(rows, rows[1:]):
                yield s, i, next_row
        else:
            if control == "another sequence's cell":
                sibling = (s + 1) % n_seq
                model.test_share_cell(sibling, s, min(last, len(lone.prompts[sibling]) - 2))
            elif control == "stale mask":
                model.test_hide_cell(s, last - 1)
            else:
                raise ValueError(control)
            for i in range(n_rows):
                yield from batched(model, lone, [s], range(i, i + 1))
        model.truncate(0, s)
        prefill(model, lone, s)


CONTROLS = ("one position off", "another sequence's cell", "stale mask")


def measure(path: str, flash_attn: int, texts, n_rows: int, shapes, controls) -> Dict[str, Deviation]:
    """Each shape's and each control's deviations from the lone rows."""
    lone = lone_texts(path, flash_attn, texts, n_rows)
    model = _core.Model(path, n_ctx=2048, n_seq_max=len(texts), n_batch=512, flash_attn=flash_attn)
    for s in range(len(texts)):
        prefill(model, lone, s)
    out: Dict[str, Deviation] = {}
    for name, rows in [(sh, shape_rows(model, lone, sh)) for sh in shapes] + \
                      [(c, control_rows(model, lone, c)) for c in controls]:
        dev = out.setdefault(name, Deviation())
        for s, i, row in rows:
            dev.add(row, lone.rows[s][i])
    del model
    return out


def report(label: str, law: RowLaw, table: Dict[str, Deviation]) -> None:
    print(f"\nrow law, {label} (bounds: |d log p| {law.logit}, |d p| {law.prob}; gaps moved beyond g in at most "
          f"{dict(law.gap_tail)} of the rows):")
    print(f"  {'shape':24s} rows  max|d log p|  max|d p|  changed  gaps moved beyond {GRID}")
    for name, d in table.items():
        print(f"  {name:24s} {d.rows:4d} {d.logit:12.4f} {d.prob:9.4f} {d.flips:8d}  {[d.beyond(g) for g in GRID]}")


def check(law: RowLaw, table: Dict[str, Deviation]) -> None:
    from scipy import stats

    for name, d in table.items():
        if name in CONTROLS:
            continue
        assert d.rows > 0, name
        assert d.logit <= law.logit and d.prob <= law.prob, (
            f"{name}: rows moved by up to {d.logit:.4f} in log-probability / {d.prob:.4f} in probability, beyond "
            f"the row law ({law.logit}, {law.prob}; near_ties.ROW_LAW)")
        for g, share in law.gap_tail:  # one-sided binomial: more rows moved beyond g than the law says?
            p = stats.binom.sf(d.beyond(g) - 1, d.rows, share)
            assert p >= FLIP_ALPHA, (f"{name}: {d.beyond(g)} of {d.rows} rows had gaps move by more than {g}, "
                                     f"more than the row law's share {share} allows (p={p:.2g})")
    for name in CONTROLS:
        if name in table:
            d = table[name]
            print(f"NEGATIVE CONTROL {name}: {d.logit / law.logit:.1f}x the logit bound, "
                  f"{d.prob / law.prob:.1f}x the probability bound")
            assert d.logit >= CONTROL_MARGIN * law.logit and d.prob > law.prob, (
                f"NEGATIVE CONTROL {name}: it moved rows by at most {d.logit:.4f} in log-probability / "
                f"{d.prob:.4f}: not beyond the bound by the margin, so the near-tie rules could excuse it")


# The default tier measures half the rows (8 a text) in the shapes whose rows
# differ on this CPU (a batch of 4 or more rows gives each row the same numbers
# whatever the batch holds: verify 8 and 16, seqs 8 and 16 and mixed measured
# alike), and the batches of 2 rows (exact with flash attention, moved without);
# the slow tier every shape and control at 16 rows a text, as the bounds were set.
FLASH_SHAPES = ("verify 2", "verify 4", "seqs 2", "seqs 16", "cache hit", "copied")
FLASH_OFF_SHAPES = ("verify 2", "seqs 4", "seqs 16", "cache hit")


@pytest.mark.parametrize("flash_attn, n_rows, shapes, controls", [
    pytest.param(1, 8, FLASH_SHAPES, CONTROLS, id="flash"),
    pytest.param(0, 8, FLASH_OFF_SHAPES, (), id="no-flash"),
    pytest.param(1, N_ROWS, ALL_SHAPES, CONTROLS, id="flash-all-rows", marks=pytest.mark.slow),
    pytest.param(0, N_ROWS, ALL_SHAPES, CONTROLS, id="no-flash-all-rows", marks=pytest.mark.slow),
])
def test_row_law_of_the_test_model(gemma_path, flash_attn, n_rows, shapes, controls):
    law = row_law(gemma_path)
    table = measure(gemma_path, flash_attn, TEXTS, n_rows, shapes, controls)
    report(f"test model, flash attention {'on' if flash_attn else 'off'}, {n_rows} rows a text", law, table)
    check(law, table)


# The default target in the default tier: half the texts, half the rows, a draft's
# rows (8 in one batch), a cache hit, and the controls; every shape with flash
# attention on and off in the slow tier.
@pytest.mark.parametrize("flash_attn, texts, n_rows, shapes", [
    pytest.param(1, TEXTS[:8], 8, ("verify 8", "cache hit"), id="default-tier"),
    pytest.param(1, TEXTS, N_ROWS, ALL_SHAPES, id="flash", marks=pytest.mark.slow),
    pytest.param(0, TEXTS, N_ROWS, ALL_SHAPES, id="no-flash", marks=pytest.mark.slow),
])
def test_row_law_of_the_default_target(target_path, flash_attn, texts, n_rows, shapes):
    law = row_law(target_path)
    table = measure(target_path, flash_attn, texts, n_rows, shapes, CONTROLS)
    report(f"default target, flash attention {'on' if flash_attn else 'off'}", law, table)
    check(law, table)
