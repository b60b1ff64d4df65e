"""The memory of suffix drafting (issue 24): the store and its files.

* ``SuffixStore.longest_match`` against a brute force over the stored documents
  (joined by a separator no query contains): the longest suffix of the query
  found in them; among the tokens that follow it, the most frequent, ties to the
  latest occurrence; how often it follows.
* The byte cap after every add, least-recently-used eviction (added or drafted
  from), a document larger than the cap keeps its end, the epoch moves on
  eviction and clear.
* ``Memory.save``/``load``: round trip, another vocabulary or a damaged file
  is a ValueError, no temporary files left.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import pyspec
from pyspec import _core

from suffix_stores import MIN_CAP, as_tuple, brute_match, drafter_on, touch, unique_doc


# ------------------------------------------------------------------ longest_match

@pytest.mark.parametrize("alphabet", [2, 3, 5])
def test_longest_match_equals_brute_force(alphabet):
    """Random small-alphabet documents (under 256 tokens in all, so occurrence
    counts are exact: suffix_automaton.h counts up to kWalk = 256 links deep)
    and queries, some cut from the documents: 150 cases per alphabet."""
    rng = np.random.default_rng(alphabet)
    for case in range(150):
        docs = [rng.integers(0, alphabet, size=rng.integers(1, 30)).tolist() for _ in range(rng.integers(1, 6))]
        store = _core.SuffixStore(1 << 20)
        for d in docs:
            store.add(d)
        assert store.documents() == docs and store.n_documents == len(docs)
        assert store.n_tokens == sum(map(len, docs))
        for _ in range(6):
            if rng.random() < 0.5:
                src = docs[rng.integers(len(docs))]
                a = int(rng.integers(0, len(src)))
                query = src[a:a + int(rng.integers(1, 12))]
                query = rng.integers(0, alphabet + 1, size=rng.integers(0, 3)).tolist() + query
            else:
                query = rng.integers(0, alphabet + 1, size=rng.integers(1, 10)).tolist()
            got = as_tuple(store.longest_match(query))
            assert got == brute_match(docs, query), (case, docs, query, got)


def test_longest_match_after_eviction_sees_only_the_kept_documents():
    """After evictions the automaton is rebuilt over the kept documents (their
    text order is their use order when no draft touched them): the brute force
    over ``documents()`` again."""
    rng = np.random.default_rng(7)
    store = _core.SuffixStore(MIN_CAP)
    evictions = 0
    for i in range(120):
        epoch = store.epoch
        store.add(rng.integers(0, 4, size=rng.integers(5, 60)).tolist())
        evictions += store.epoch != epoch
        docs = store.documents()
        if sum(map(len, docs)) > 250:  # keep the counts exact (see above)
            continue
        for _ in range(5):
            query = rng.integers(0, 4, size=rng.integers(1, 8)).tolist()
            assert as_tuple(store.longest_match(query)) == brute_match(docs, query)
    assert evictions > 0, "the cap never evicted: the case did not test a rebuilt store"


def test_longest_match_never_spans_documents_nor_proposes_the_separator():
    store = _core.SuffixStore(MIN_CAP)
    store.add([1, 2, 3])
    store.add([4, 5])
    assert as_tuple(store.longest_match([3, 4])) == (1, 5, 1)   # "3 4" is not one document's text
    assert as_tuple(store.longest_match([2, 3])) == (2, -1, 0)  # a document's end continues with nothing
    assert as_tuple(store.longest_match([9])) == (0, -1, 0)
    assert as_tuple(store.longest_match([])) == (0, -1, 0)


def test_rejected_document_leaves_no_trace():
    """A document with a negative id is refused (ValueError); what was stored
    must be unchanged: no part of the refused document may be matched or copied."""
    store = _core.SuffixStore(MIN_CAP)
    store.add([7, 8, 9])
    with pytest.raises(ValueError, match="token ids"):
        store.add([1, 2, 3, -5])
    store.add([4, 5])
    assert store.documents() == [[7, 8, 9], [4, 5]] and store.n_tokens == 5
    assert as_tuple(store.longest_match([1, 2])) == brute_match(store.documents(), [1, 2]) == (0, -1, 0)


def test_cap_settings_are_checked():
    with pytest.raises(ValueError, match="64 KiB"):
        _core.SuffixStore(MIN_CAP - 1)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            pyspec.Memory(bad)
    assert pyspec.Memory(0.0625).cap_bytes == MIN_CAP
    store = _core.SuffixStore(MIN_CAP)
    store.add([])
    assert store.n_documents == 0 and store.epoch == 0


# ------------------------------------------------------------------ cap, LRU, epoch

@pytest.mark.parametrize("cap", [MIN_CAP, 1 << 20])
def test_bytes_stay_under_the_cap_after_every_add(cap):
    """Documents of 1..300 tokens from a large vocabulary (index-heavy: few
    shared transitions), some larger than the whole cap."""
    rng = np.random.default_rng(cap)
    store = _core.SuffixStore(cap)
    over = []
    for i in range(2500):
        n = int(rng.integers(1, 300)) if rng.random() < 0.99 else int(rng.integers(cap // 40, cap // 10))
        store.add(rng.integers(0, 50_000, size=n).tolist())
        if store.bytes > cap:
            over.append((i, store.bytes - cap, store.n_documents))
    assert store.epoch > 0, "nothing was evicted"
    assert not over, f"{len(over)} adds left bytes over the cap {cap} (add, bytes over, documents): {over[:5]}"


def test_eviction_is_least_recently_used():
    """A model of the use order, checked after every add: documents() is always
    the most recently used suffix of it (the new document last); a draft copying
    from a document (SuffixDrafter.propose) makes it the most recently used."""
    rng = np.random.default_rng(3)
    store = _core.SuffixStore(MIN_CAP)
    order = []          # documents, least recently used first (the model)
    touched = []        # the document a draft copied from just before this add
    touched_survivals = evictions = 0
    for i in range(400):
        doc = unique_doc(i)
        epoch = store.epoch
        store.add(doc)
        order.append(doc)
        docs = store.documents()
        if store.epoch == epoch:
            assert docs == order, f"add {i}: no eviction, yet the documents changed"
        else:
            evictions += 1
            assert 0 < len(docs) < len(order) and docs == order[-len(docs):], f"add {i}: not an LRU eviction"
            touched_survivals += any(d in touched for d in docs)
            order = docs
        # A draft copies from a random document (not the newest): it becomes the most recently used.
        if len(order) > 2 and rng.random() < 0.3:
            j = int(rng.integers(0, len(order) - 1))
            src = order[j]
            d = drafter_on(store, [7] + src[:5])
            epoch = store.epoch
            assert d.propose([7] + src[:5], 4) == src[5:9]
            assert store.epoch == epoch, "a draft moved the epoch"
            order.append(order.pop(j))
            touched = [src]
            assert store.documents() == order
        else:
            touched = []
    assert evictions >= 5 and touched_survivals > 0


def test_old_documents_go_and_the_touched_one_stays():
    """The plain statement of the rule: A added first, then B, C, ...; drafts
    keep copying from A while more documents arrive, until an eviction: A
    survives, B (never used since it was added) goes."""
    store = _core.SuffixStore(MIN_CAP)
    a, b = unique_doc(0), unique_doc(1)
    store.add(a)
    store.add(b)
    i = 2
    while store.epoch == 0:
        touch(store, a)
        store.add(unique_doc(i))
        i += 1
    docs = store.documents()
    assert a in docs and b not in docs and docs[-1] == unique_doc(i - 1)


def test_a_document_larger_than_the_cap_keeps_its_end():
    store = _core.SuffixStore(MIN_CAP)
    store.add(unique_doc(0))
    big = list(range(10_000, 30_000))
    store.add(big)
    docs = store.documents()
    assert len(docs) == 1, "older documents must go first"
    kept = docs[0]
    assert 0 < len(kept) < len(big) and kept == big[-len(kept):]
    assert store.bytes <= store.cap_bytes
    assert store.epoch == 1
    assert as_tuple(store.longest_match(big[-50:-40])) == (10, big[-40], 1)


def test_epoch_moves_on_eviction_and_clear_only():
    store = _core.SuffixStore(MIN_CAP)
    store.add(unique_doc(0))
    assert store.epoch == 0
    drafter_on(store, unique_doc(0)[:4]).propose(unique_doc(0)[:4], 2)  # a touch
    assert store.epoch == 0
    i = 1
    while store.epoch == 0:
        store.add(unique_doc(i))
        i += 1
    assert store.epoch == 1
    store.clear()
    assert store.epoch == 2 and store.n_documents == 0 and store.n_tokens == 0 and store.documents() == []
    assert as_tuple(store.longest_match(unique_doc(i - 1)[:3])) == (0, -1, 0)


# ------------------------------------------------------------------ files

def memory_with_documents():
    m = pyspec.Memory(1)
    for i in range(5):
        m.add(unique_doc(i, 10 + i))
    drafter_on(m.native, [7] + unique_doc(1)[:4]).propose([7] + unique_doc(1)[:4], 2)  # doc 1 most recent
    return m


def test_save_load_round_trip(tmp_path):
    m = memory_with_documents()
    docs = m.documents()
    assert docs[-1] == unique_doc(1, 11)
    path = tmp_path / "sub" / "memory.bin"
    m.save(path, "v:1")
    assert sorted(os.listdir(path.parent)) == ["memory.bin"], "save left temporary files"
    back = pyspec.Memory(1)
    assert back.load(path, "v:1") == len(docs)
    assert back.documents() == docs and back.n_tokens == m.n_tokens
    # Saved again over the old file: replaced whole, nothing left beside it.
    m.add([1, 2, 3])
    m.save(path, "v:1")
    assert sorted(os.listdir(path.parent)) == ["memory.bin"]
    again = pyspec.Memory(1)
    again.load(path, "v:1")
    assert again.documents() == m.documents()
    # An empty memory round-trips too.
    empty = tmp_path / "empty.bin"
    pyspec.Memory(1).save(empty, "v:1")
    assert pyspec.Memory(1).load(empty, "v:1") == 0


def test_failed_save_leaves_no_temporary_file(tmp_path):
    (tmp_path / "taken").mkdir()  # the target path is a directory: the final rename fails
    with pytest.raises(OSError):
        memory_with_documents().save(tmp_path / "taken", "v:1")
    assert sorted(os.listdir(tmp_path)) == ["taken"] and os.listdir(tmp_path / "taken") == []


def test_load_refuses_another_vocabulary(tmp_path):
    path = tmp_path / "memory.bin"
    memory_with_documents().save(path, "262144:aaaa")
    m = pyspec.Memory(1)
    with pytest.raises(ValueError, match="another model's vocabulary"):
        m.load(path, "151936:bbbb")
    assert m.n_documents == 0


@pytest.mark.parametrize("damage", ["garbage", "empty", "text", "truncated", "bit_flip", "lengths"])
def test_load_refuses_a_damaged_file_with_a_value_error(tmp_path, damage):
    """Whatever the damage, a clear ValueError (the CLI turns ValueError into a
    one-line error; any other exception is a traceback)."""
    good = tmp_path / "good.bin"
    memory_with_documents().save(good, "v:1")
    data = good.read_bytes()
    path = tmp_path / "bad.bin"
    if damage == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(500))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "text":
        path.write_text("not a memory file\n")
    elif damage == "truncated":  # a copy cut short
        path.write_bytes(data[: len(data) // 2])
    elif damage == "bit_flip":   # one byte of the stored arrays changed (the zip's CRC no longer matches)
        b = bytearray(data)
        b[len(b) // 3] ^= 0xFF
        path.write_bytes(bytes(b))
    else:                        # a well-formed file whose lengths do not add up
        with open(path, "wb") as f:
            np.savez(f, vocab=np.array("v:1"), lengths=np.array([3, 4]), tokens=np.arange(5, dtype=np.int32))
    m = pyspec.Memory(1)
    with pytest.raises(ValueError, match="memory file|damaged"):
        m.load(path, "v:1")
    assert m.n_documents == 0
