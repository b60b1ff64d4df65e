"""The speculation view of an agreement: what drafting with the candidate for
the reference would yield, predicted from the per-position acceptance alone.

For a stream whose row t accepts a drafted token with probability alpha[t]
(alpha: [n_rows]), a round that starts at row i and drafts k tokens keeps j of
them with probability
    P_i(j) = alpha[i] ... alpha[i+j-1] * (1 - alpha[i+j])     (j < k)
    P_i(k) = alpha[i] ... alpha[i+k-1],
emits j + 1 tokens (the accepted ones, then the target's own), and the next
round starts at row i + j + 1. The expected number of rounds R(0) over the stream
follows by dynamic programming, R(i) = 1 + sum_j P_i(j) R(i + j + 1) (rows past
the stream's end count as rejected: a round ends there), so the prediction keeps
the stream's runs of easy and hard text (a mean alpha fed to the geometric
formula would not). At T = 0, alpha[t] is 0 or 1 (top-1 agreement); on the
reference's own greedy continuations (`pyspec agree --prompts -t 0`) teacher
forcing is exactly what speculative decoding sees, so the count is exact there.

Cost, as the auto policy models it (cpp/policies/auto_policy.h): a round of k drafted
tokens takes k * c + V(k + 1), c the candidate's single-token step, V(n) the
reference's decode of n tokens; plain decoding takes V(1) per token. Predicted
speed-up = n_rows * V(1) / (R(0) * (k * c + V(k + 1))).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np


def expected_rounds(alpha: np.ndarray, k: int) -> float:
    """R(0) above for one stream (alpha: [n_rows]), k >= 1."""
    n = len(alpha)
    rounds = np.zeros(n + k + 2)
    for i in range(n - 1, -1, -1):
        run, total = 1.0, 1.0
        for j in range(k):
            a = alpha[i + j] if i + j < n else 0.0
            total += run * (1 - a) * rounds[min(i + j + 1, n)]
            run *= a
        rounds[i] = total + run * rounds[min(i + k + 1, n)]
    return float(rounds[0])


def tokens_per_pass(streams: Sequence[np.ndarray], k: int) -> float:
    """Expected tokens per reference decode over all streams (each [n_rows])."""
    rows = sum(len(a) for a in streams)
    return rows / sum(expected_rounds(a, k) for a in streams)


def acceptance_by_position(streams: Sequence[np.ndarray], k: int) -> List[Optional[float]]:
    """Acceptance of the j-th drafted token given the earlier ones were accepted
    (j = 1..k), over rounds started at every row that leaves room for j drafts;
    None where no stream is long enough."""
    reached = np.zeros(k + 1)
    accepted = np.zeros(k + 1)
    for a in streams:
        n = len(a)
        run = np.ones(n)  # run[i]: P(the first j - 1 drafts of a round at row i were accepted)
        for j in range(1, k + 1):
            m = max(n - j + 1, 0)  # rounds whose j-th draft falls inside the stream
            run = run[:m]
            reached[j] += run.sum()
            run = run * a[j - 1:j - 1 + m]
            accepted[j] += run.sum()
    return [float(accepted[j] / reached[j]) if reached[j] else None for j in range(1, k + 1)]


def predict(streams: Sequence[np.ndarray], ks: Sequence[int], costs: Optional[Dict[int, float]] = None,
            step: float = 0.0) -> List[dict]:
    """Per k: expected tokens per reference pass and, given costs (the
    reference's V(n) in seconds for n = 1..max(ks) + 1, and the candidate's
    single-token step), the predicted speed-up over plain decoding."""
    rows = sum(len(a) for a in streams)
    out = []
    for k in ks:
        rounds = sum(expected_rounds(a, k) for a in streams)
        p = {"k": k, "tokens_per_pass": rows / rounds}
        if costs is not None:
            p["speedup"] = rows * costs[1] / (rounds * (k * step + costs[k + 1]))
        out.append(p)
    return out
