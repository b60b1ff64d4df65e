"""What n-gram drafting under the ``auto`` policy can gain on a known output,
next to a myopic oracle that knows, each round, how many drafts would be kept.

Greedy only (T = 0): the output is fixed, so a draft's accepted length is the
number of its leading tokens that match the output, and every round emits that
many plus one. Costs: V(n), the target's seconds for an n-token batch, timed
here for every n up to the cap; n-gram drafting is free. Both runs use the real
drafter (``_core.NgramDrafter``, copy cursor included) and the policy runs the
real ``AutoPolicy``; the oracle picks, per round, the draft length with the
best tokens per second given the drafter's proposal. The gap between the two is
what a better *when* (policy) could still win; the oracle's own figure is what
a better *what* (drafter) would have to raise.
"""

from __future__ import annotations

import time
from typing import Dict, List, Sequence, Union

from ... import _core
from ...model import Model


def batch_costs(model: Model, max_batch: Union[int, Sequence[int]], reps: int = 3) -> Dict[int, float]:
    """V(n) for n = 1..max_batch (or for the batch sizes given): the fastest of
    `reps` timed decodes at the end of a short context (the model's cache is
    cleared before and after)."""
    core = model.native
    model.clear_cache()
    filler = model.tokenize("The quick brown fox jumps over the lazy dog.", add_special=True)
    core.decode(filler, 0, 0)
    pos = len(filler)
    out = {}
    for n in (range(1, max_batch + 1) if isinstance(max_batch, int) else max_batch):
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            core.decode([filler[-1]] * n, pos, n)
            best = min(best, time.perf_counter() - t0)
            core.truncate(pos)
        out[n] = best
    model.clear_cache()
    return out


def _accepted(drafts: Sequence[int], output: Sequence[int], pos: int) -> int:
    n = 0
    while n < len(drafts) and pos + n < len(output) and drafts[n] == output[pos + n]:
        n += 1
    return n


def simulate(prompt: List[int], output: List[int], costs: Dict[int, float], n_vocab: int,
             draft_max: int = 16) -> Dict[str, float]:
    """Speed-ups over plain decoding of `output` (greedy) for auto and the oracle."""
    plain = len(output) * costs[1]
    sizes = sorted(n for n in costs if n <= draft_max + 1)

    def run(choose, observer=None) -> float:
        """`observer`: a policy that sees every round, as the engine reports them."""
        drafter = _core.NgramDrafter(n_vocab, 1, 16)
        drafter.begin(prompt)
        pos, seconds = 0, 0.0
        while pos < len(output):
            history = prompt + output[:pos]
            round_max = min(draft_max, len(output) - pos - 1)
            plan = drafter.plan(history)
            k = choose(drafter, history, plan, round_max, pos) if plan["match_len"] > 0 and round_max > 0 else 0
            drafts = drafter.propose(history, k) if k > 0 else []
            acc = _accepted(drafts, output, pos)
            cost = costs[len(drafts) + 1]
            if observer is not None:  # a plain round's checked guess included
                guess_hit = int(output[pos] == plan["next_guess"]) if not drafts and plan["next_guess"] >= 0 else -1
                # The simulated round's wall time is its batch's cost: the clock judges it too.
                observer.observe(len(drafts), acc, 0.0, cost, "ngram", plan["match_len"], 0, plan["near_copy"],
                                 plan["next_guess"], guess_hit, round_s=cost, length=k)
            seconds += cost
            pos += acc + 1
        return plain / seconds

    policy = _core.make_policy(_core.PolicyParams(name="auto", draft_max=draft_max))
    policy.calibrated(sizes, [costs[n] for n in sizes])
    auto = run(lambda d, h, plan, round_max, pos: policy.next_length(round_max, "ngram", plan["match_len"], 0,
                                                                     plan["near_copy"], plan["next_guess"],
                                                                     plan["fresh"]),
               observer=policy)

    def oracle(drafter, history, plan, round_max, pos):
        # What the drafter would propose at full length decides how much any length keeps;
        # re-planning after the look restores the drafter's state for the real proposal.
        keep = _accepted(drafter.propose(history, round_max), output, pos)
        drafter.plan(history)
        return max(range(round_max + 1), key=lambda k: (min(k, keep) + 1) / costs[k + 1])

    return {"plain_s": plain, "auto": auto, "oracle": run(oracle)}
