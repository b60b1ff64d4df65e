"""Helpers of the suffix-memory tests (test_suffix_store.py, test_suffix_memory.py):
a brute-force longest match, unique documents, a drafter over a store."""

from __future__ import annotations

from pyspec import _core

SEP = -1            # the store's document separator (suffix_store.h)
MIN_CAP = 64 * 1024  # the smallest cap a store accepts
N_VOCAB = 262_144   # token ids of the drafter tests stay below this

def brute_match(docs, query):
    """(match_len, next_token, count) of SuffixStore.longest_match, by brute force."""
    text = []
    for i, d in enumerate(docs):
        if i:
            text.append(SEP)
        text.extend(d)
    for n in range(len(query), 0, -1):
        s = list(query[-n:])
        ends = [i + n for i in range(len(text) - n + 1) if text[i:i + n] == s]
        if not ends:
            continue
        count, latest = {}, {}
        for j in ends:
            if j < len(text) and text[j] != SEP:
                count[text[j]] = count.get(text[j], 0) + 1
                latest[text[j]] = max(latest.get(text[j], -1), j)
        if not count:
            return n, -1, 0
        best = max(count, key=lambda t: (count[t], latest[t]))
        return n, best, count[best]
    return 0, -1, 0


def as_tuple(m: dict):
    return m["match_len"], m["next_token"], m["count"]


def unique_doc(i: int, n: int = 20):
    """Document i: n token ids no other document of the test uses."""
    return list(range(1000 + 200 * i, 1000 + 200 * i + n))


def drafter_on(store, history):
    d = _core.SuffixDrafter(N_VOCAB)
    assert d.use_memory(store)
    d.begin(history)
    return d


def touch(store, doc):
    """A draft copies from `doc` (it becomes the most recently used document)."""
    assert drafter_on(store, [7] + doc[:5]).propose([7] + doc[:5], 3) == doc[5:8]
