"""Memory for suffix drafting (issue 24): the drafter on token lists, its
memory bound, and end to end with the small model. (The store and its files:
test_suffix_store.py.)

* ``SuffixDrafter``: proposes from memory (and not without it), its copy cursor
  follows across rounds, re-anchors near where the copy diverged, and memory
  wins over the local lookup only on more evidence.
* RSS: 10^4 requests' worth of documents into a 4 MiB memory.
* Greedy generation with memory equals generation without (the memory path
  firing), and ``pyspec generate --memory FILE`` end to end.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import pyspec
from pyspec import _core
from pyspec.memory import vocab_fingerprint

from cli_helpers import pyspec_cmd
from near_ties import assert_near, near_tie_flips
from suffix_stores import MIN_CAP, N_VOCAB, drafter_on, touch, unique_doc

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact


# ------------------------------------------------------------------ the drafter on token lists

D = list(range(100, 140))  # a stored document of 40 distinct tokens


def test_drafts_from_memory_only_with_memory():
    store = _core.SuffixStore(MIN_CAP)
    store.add(D)
    history = [1, 2, 3] + D[:5]
    d = drafter_on(store, history)
    plan = d.plan(history)
    assert plan["from_memory"] and plan["next_guess"] == D[5] and plan["match_len"] == 5 and plan["fresh"]
    assert d.propose(history, 4) == D[5:9] and d.memory_drafts == 1
    d.begin(history)
    assert d.memory_drafts == 0, "begin() starts a new count"
    # Without memory: the local lookup alone, which finds nothing in this text.
    assert d.use_memory(None)
    d.begin(history)
    assert d.plan(history)["from_memory"] is False and d.propose(history, 4) == [] and d.memory_drafts == 0
    # Other drafters use no memory.
    assert _core.NgramDrafter(N_VOCAB).use_memory(store) is False


def test_a_copy_stops_at_its_documents_end():
    store = _core.SuffixStore(MIN_CAP)
    store.add(D)
    store.add([500, 501])
    history = [1] + D[-4:]
    assert drafter_on(store, history).propose(history, 8) == []  # the match ends the document: nothing follows
    history = [1] + D[-6:-2]
    assert drafter_on(store, history).propose(history, 8) == D[-2:]


def test_the_copy_cursor_follows_across_rounds():
    """Round after round the drafter continues its copy (fresh False, its
    evidence growing) and counts memory drafts; the cursor stays on its
    document even where a longer match appears elsewhere: here a document
    added between rounds, which a fresh drafter would follow instead."""
    store = _core.SuffixStore(MIN_CAP)
    src = [5, 6, 20, 21, 22, 23, 24, 25]
    store.add(src)
    history = [1, 2, 3, 4, 5, 6]
    d = drafter_on(store, history)
    assert d.propose(history, 2) == [20, 21]
    store.add([1, 2, 3, 4, 5, 6, 20, 21, 30, 31])  # arrives mid-generation (another request finished)
    history += [20, 21]
    plan = d.plan(history)
    assert plan["from_memory"] and not plan["fresh"] and plan["next_guess"] == 22 and plan["match_len"] == 4
    assert d.propose(history, 2) == [22, 23] and d.memory_drafts == 2
    assert drafter_on(store, history).propose(history, 2) == [30, 31], "a fresh lookup follows the longest match"
    # Longer runs over a stored document: the evidence is the length followed.
    store2 = _core.SuffixStore(MIN_CAP)
    store2.add(D)
    history = [1, 2, 3] + D[:5]
    d = drafter_on(store2, history)
    for k in range(4):
        plan = d.plan(history)
        assert plan["from_memory"] and plan["match_len"] == 5 + 4 * k and plan["fresh"] == (k == 0)
        draft = d.propose(history, 4)
        assert draft == D[5 + 4 * k: 9 + 4 * k]
        history += draft
    assert d.memory_drafts == 4


def test_after_an_edit_it_reanchors_near_the_copy():
    """The output leaves its source at an edit and resumes it: the drafter
    re-anchors near where the copy diverged (near_copy), although the same
    two tokens occur later in the document too, followed by something else
    (the latest occurrence, which a fresh lookup picks)."""
    doc = list(range(100, 120)) + [7, 8, 50, 51, 52] + list(range(120, 200)) + [7, 8, 60, 61]
    store = _core.SuffixStore(MIN_CAP)
    store.add(doc)
    history = [1] + doc[:10]
    d = drafter_on(store, history)
    assert d.propose(history, 10) == doc[10:20]
    history += doc[10:20] + [999, 7, 8]  # an inserted token, then the source again
    plan = d.plan(history)
    assert plan["from_memory"] and plan["near_copy"] and plan["next_guess"] == 50
    assert d.propose(history, 3) == [50, 51, 52]
    fresh = drafter_on(store, history)
    assert fresh.plan(history)["near_copy"] is False and fresh.propose(history, 3) == [60, 61]
    # A replaced token (not an insertion): the copy resumes right after it.
    history = [1, 2, 3] + D[:9]
    d = drafter_on(store_of(D), history)
    assert d.propose(history, 4) == D[9:13]
    history += [999] + D[10:12]
    plan = d.plan(history)
    assert plan["from_memory"] and plan["near_copy"] and plan["next_guess"] == D[12]


def test_a_copy_resumed_near_its_anchor_keeps_half_its_evidence():
    """Memory's copy, re-anchored after an edit, carries half its run
    (copy_cursor.h); control: a fresh drafter on the same history has only the
    match behind it."""
    doc = list(range(200, 300))
    history = [1, 2, 3] + doc[:5]
    d = drafter_on(store_of(doc), history)
    while len(history) < 3 + 45:
        history += d.propose(history, 4)
    assert d.plan(history)["match_len"] >= 40
    history += [999, doc[46]]  # doc[45] replaced, then the copy again
    plan = d.plan(history)
    assert plan["from_memory"] and plan["near_copy"] and plan["fresh"] and plan["next_guess"] == doc[47]
    history += d.propose(history, 1)
    resumed = d.plan(history)
    assert resumed["near_copy"] and not resumed["fresh"] and resumed["match_len"] >= 20, resumed
    fresh = drafter_on(store_of(doc), history)
    assert not fresh.plan(history)["near_copy"] and fresh.plan(history)["match_len"] <= 4


def store_of(*docs):
    store = _core.SuffixStore(MIN_CAP)
    for doc in docs:
        store.add(doc)
    return store


# The local text: its last five (h5) or six (h6) tokens occurred before, followed by 40.
H5 = [20, 21] + [8, 7, 1, 2, 3] + [40] + [9, 8, 7, 1, 2, 3]
H6 = [20, 21] + [9, 8, 7, 1, 2, 3] + [40] + [9, 8, 7, 1, 2, 3]


@pytest.mark.parametrize("copies, history, source, evidence", [
    (1, H5, "local", 5),     # memory: match 3, one occurrence: evidence 3 < 5
    (3, H5, "local", 5),     # 3 + 2 agreeing occurrences = 5, not more than 5
    (4, H5, "memory", 6),    # 3 + 3 = 6 > 5
    (10, H5, "memory", 6),   # agreement at most doubles the match: still 6
    (10, H6, "local", 6),    # 6 is not more than the local 6
])
def test_memory_wins_only_on_more_evidence(copies, history, source, evidence):
    """Evidence of a memory match: its length plus the other occurrences that
    agree on the next token, at most doubled; it must exceed the local match."""
    local = _core.NgramDrafter(N_VOCAB)
    local.begin(history)
    assert local.plan(history)["match_len"] == (6 if history is H6 else 5)
    store = store_of(*([[1, 2, 3, 77, 78]] * copies))
    d = drafter_on(store, history)
    plan = d.plan(history)
    assert plan["from_memory"] == (source == "memory") and plan["match_len"] == evidence
    assert d.propose(history, 3) == ([77, 78] if source == "memory" else [40, 9, 8])


def test_memory_with_the_longer_match_wins():
    """A long stored match against a short local one, and the reverse."""
    p = list(range(300, 312))
    store = store_of(p + [555, 556])
    history = p[8:] + [9] + p  # local: p's last 4 tokens occurred at the start, followed by 9
    d = drafter_on(store, history)
    plan = d.plan(history)
    assert plan["from_memory"] and plan["match_len"] == 12 and d.propose(history, 2) == [555, 556]
    store = store_of(p[9:] + [555, 556])  # memory: 3 tokens against the local 4
    d = drafter_on(store, history)
    assert not d.plan(history)["from_memory"] and d.propose(history, 2) == [9] + p[:1]


def test_the_cursor_survives_a_rebuild():
    """Eviction rebuilds the store and moves every position (epoch): a drafter
    in the middle of a copy must find its place again, not copy from where its
    old position now points."""
    old = unique_doc(0, 30)
    store = store_of(old, D)  # D's text starts after `old`'s
    history = [1, 2, 3] + D[:5]
    d = drafter_on(store, history)
    assert d.propose(history, 4) == D[5:9]
    epoch, i = store.epoch, 1
    while store.epoch == epoch:
        touch(store, D)  # another drafter keeps D in use: `old` is the least recently used
        store.add(unique_doc(i, 30))
        i += 1
    docs = store.documents()
    assert old not in docs and D in docs
    assert store.longest_match(D[:9])["match_len"] == 9
    history += D[5:9]
    plan = d.plan(history)
    assert plan["from_memory"] and plan["next_guess"] == D[9]
    assert d.propose(history, 4) == D[9:13]


# ------------------------------------------------------------------ RSS

RSS_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import pyspec

    def status(field):  # bytes; VmHWM: this process image's peak RSS (getrusage's counts the parent's too)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    def rss():
        return status("VmRSS")

    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 30_000, size=rng.integers(5, 40)).tolist() for _ in range(300)]
    def document():  # 200 tokens: half stock phrases, half fresh text
        out = []
        while len(out) < 200:
            if rng.random() < 0.5:
                out += phrases[rng.integers(len(phrases))]
            else:
                out += rng.integers(0, 30_000, size=rng.integers(3, 20)).tolist()
        return out[:200]

    memory = pyspec.Memory(float(sys.argv[1]))
    document()
    base = rss()
    peak_sampled, worst, over = base, 0, 0
    for _ in range(int(sys.argv[2])):
        memory.add(document())
        worst = max(worst, memory.bytes)
        over += memory.bytes > memory.cap_bytes
        peak_sampled = max(peak_sampled, rss())
    print(json.dumps(dict(base=base, peak=max(status("VmHWM"), peak_sampled), final=rss(), worst=worst, over=over,
                          cap=memory.cap_bytes, epoch=memory.native.epoch, documents=memory.n_documents)))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.skipif(bool(os.environ.get("PYSPEC_SANITIZE")), reason="a sanitizer's allocator holds freed memory back")
def test_rss_stays_bounded_over_ten_thousand_requests():
    """10^4 documents of 200 tokens (2 million tokens: their automaton alone
    would take ~350 MB) into a memory of 4 MiB, in a fresh process so that the
    peak RSS (VmHWM) is this workload's. Bound on the peak's growth over the
    baseline: the cap (the store's own accounting of its heap), plus one more
    cap for the allocator (an eviction frees the old automaton and builds the
    new one in its place; freed pages may stay mapped, and vectors grow by
    doubling), plus 2 MiB for the interpreter's own objects. A leak of the
    evicted texts alone (8 MB of token ids) would pass the bound; an evicted
    automaton not freed (~4 MiB per eviction, hundreds of evictions) is far over."""
    cap_mb, n_docs = 4.0, 10_000
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(cap_mb), str(n_docs)], capture_output=True,
                         text=True, timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    cap = r["cap"]
    growth = r["peak"] - r["base"]
    print(f"RSS: base {r['base'] / 2**20:.1f} MiB, peak growth {growth / 2**20:.2f} MiB, final growth "
          f"{(r['final'] - r['base']) / 2**20:.2f} MiB; store at most {r['worst'] / 2**20:.3f} of "
          f"{cap / 2**20:.0f} MiB, {r['epoch']} evictions, {r['documents']} documents kept")
    assert r["epoch"] > 100, "the cap did not evict as expected"
    assert growth <= 2 * cap + 2 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB for a memory of {cap_mb} MiB"
    assert r["over"] == 0 and r["worst"] <= cap, f"bytes exceeded the cap after {r['over']} adds (max {r['worst']})"


# ------------------------------------------------------------------ with the small model

# Prompts whose greedy answers (24 tokens, plain evaluation) have no top-2 gap below
# 0.088 in probability (0.099, 0.088, 0.65): few near ties for batch rounding to flip.
GREEDY_PROMPTS = ["def fibonacci(n):", "January, February, March,", "1, 2, 3, 4,"]


def greedy(decoder, prompt, n=24):
    return decoder.generate(prompt, max_tokens=n, temperature=0.0, chat=False, seed=0)


def edited(tokens, every=5, offset=3):
    """A copy with every `every`-th token replaced: drafts from it are rejected at the edits."""
    return [t if (i + offset) % every else (t + 1) % 262_144 for i, t in enumerate(tokens)]


def test_greedy_output_is_the_same_with_memory_and_without(gemma):
    """Memory holding this prompt's answer (exact, or with every fifth token
    edited, so that memory drafts are rejected there and the copy re-anchors):
    the greedy tokens equal those of a decoder without memory."""
    off_dec = pyspec.SpeculativeDecoder(gemma, memory=False, policy="fixed", draft_max=8)
    cases = []
    totals = dict(memory_rounds=0, memory_drafted=0, memory_accepted=0)
    for prompt in GREEDY_PROMPTS:
        ptoks = gemma.tokenize(prompt)
        off = greedy(off_dec, prompt)
        assert off.stats.memory_rounds == 0
        for kind, answer in (("exact", off.tokens), ("edited", edited(off.tokens))):
            memory = pyspec.Memory(1)
            memory.add(ptoks + answer)
            on = greedy(pyspec.SpeculativeDecoder(gemma, memory=memory, policy="fixed", draft_max=8), prompt)
            s = on.stats
            print(f"{prompt!r} {kind}: memory rounds {s.memory_rounds}, drafted {s.memory_drafted}, "
                  f"accepted {s.memory_accepted}")
            assert s.memory_rounds > 0, f"{prompt!r} ({kind}): the memory path did not fire"
            if kind == "exact" and on.tokens == off.tokens:
                assert s.memory_accepted > 0
            for k in totals:
                totals[k] += getattr(s, k)
            cases.append((ptoks, on.tokens, off.tokens))
            assert memory.n_documents == 2, "the finished generation joins the memory"
    assert totals["memory_drafted"] > totals["memory_accepted"] > 0, f"no memory draft was rejected: {totals}"
    assert_near(gemma, cases, batched=True)  # both decoders verify drafts in batches


def test_models_memory_collects_its_generations(gemma_path, load_model):
    """A Model keeps a memory (memory_mb) that its decoders' generations join; a
    repeat of a request then drafts from it. memory_mb=0: none."""
    model = load_model(gemma_path, "memory", n_ctx=512, memory_mb=1)
    model.memory.clear()
    dec = pyspec.SpeculativeDecoder(model, policy="fixed", draft_max=8)  # drafter "suffix", memory=True
    assert dec.drafter == "suffix" and dec.memory is model.memory
    first = greedy(dec, GREEDY_PROMPTS[0], n=16)
    assert model.memory.n_documents == 1 and first.stats.memory_rounds == 0
    second = greedy(dec, GREEDY_PROMPTS[0], n=16)
    assert second.stats.memory_rounds > 0 and second.tokens == first.tokens
    assert model.memory.n_documents == 2
    none = load_model(gemma_path, "memory", n_ctx=512, memory_mb=0)
    assert none.memory is None and pyspec.SpeculativeDecoder(none).memory is None
    with pytest.raises(TypeError):
        pyspec.SpeculativeDecoder(model, memory="yes")


def test_vocab_fingerprint_names_the_vocabulary(gemma):
    fp = vocab_fingerprint(gemma)
    assert fp == vocab_fingerprint(gemma) and fp.startswith(f"{gemma.n_vocab}:")


def test_cli_generate_with_a_memory_file(gemma_path, gemma, tmp_path):
    """`pyspec generate --memory FILE` twice: the first run creates the file;
    the second drafts from it (the JSON stats) and says the same, up to a
    near-tie flip (near_ties.py: with "The capital of France is" one
    was seen at " capital" / " largest", 0.17 each, the first run drafting by
    lookup, the second from memory). The fixed
    policy: auto's choices follow this machine's clock, and on a loaded machine
    with a fresh calibration it may decide that plain rounds pay."""
    mem = tmp_path / "memory.npz"
    args = ["generate", "-m", gemma_path, "--raw", "-n", "16", "-t", "0", "--policy", "fixed", "--json",
            "--memory", str(mem), GREEDY_PROMPTS[0]]
    runs = []
    for k in range(2):
        out = pyspec_cmd(*args)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout))
        assert mem.exists() and sorted(os.listdir(tmp_path)) == ["memory.npz"]
        assert pyspec.Memory(1).load(mem, vocab_fingerprint(gemma)) == k + 1  # this run's text joined it
    first, second = runs
    assert first["stats"]["memory_rounds"] == 0
    assert second["stats"]["memory_rounds"] > 0 and second["stats"]["memory_accepted"] > 0, second["stats"]
    # The same answer, or a flip at a near tie (the runs verify in batches of other shapes).
    ptoks = gemma.tokenize(args[-1])
    assert first["n_prompt_tokens"] == len(ptoks)
    if not near_tie_flips(gemma, ptoks, second["tokens"], first["tokens"]):
        assert second["text"] == first["text"]
    # A damaged file is one line of error, not a traceback.
    mem.write_bytes(mem.read_bytes()[:100])
    out = pyspec_cmd(*args)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "Error:" in out.stderr, out.stderr[-2000:]



@pytest.mark.parametrize("siblings", [True, False])
def test_a_servers_slots_never_draft_from_each_others_text(gemma, siblings):
    """A batch's samples draft from each other (consensus); a server's slots hold
    other requests, other users: their drafters (siblings=False) see their own
    text only. Slot 0 writes A B C D; slot 1, having written A B, would copy C D
    from a sibling. Control: the batch's drafters (siblings=True) do."""
    a, b, c, d = 1000, 1001, 1002, 1003
    params = _core.DrafterParams(name="suffix")
    d0, d1 = _core.make_batch_drafters(params, gemma.native, None, 2, siblings)
    d0.begin([7, 8])
    d1.begin([9, 10])
    d0.plan([7, 8, a, b, c, d])  # slot 0 commits its text (the pool learns it)
    proposal = d1.propose([9, 10, a, b], 2)
    assert (proposal == [c, d]) is siblings, proposal
