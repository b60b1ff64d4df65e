"""The prompt cache (issue 34): conversations in turn prefill only their new
tokens, on the target and on the draft model.

* Slots: a context holds more sequences than run at once; a request goes to the
  slot its conversation left (``BatchSession.pick_slot``). Negative control:
  every request in the lowest free slot, as the server once chose, which cuts
  the other conversation's cache.
* Host memory (``HostCache``): a cache the context gives up is kept, both
  models' parts, and put back when its conversation returns. A restored cache
  answers exactly as a prefill does (greedy tokens), and a wrong state (another
  conversation's cells under this one's tokens) is caught by the same check.
* The law after a restore: first tokens at T = 1 with an n-gram draft verified
  on restored cells follow the target's p0 (chi-square at alpha = 0.001, N from
  the power rule); the broken residual on the same path is rejected.
* Saved prefixes (``save_prefix`` / ``load_prefix``, ``pyspec serve
  --cache-dir``): a new process resumes without a prefill; files of other
  models, of another build, or damaged ones are refused with the reason.
* The server reports cached prompt tokens as OpenAI (usage.prompt_tokens_details)
  and llama-server (timings.cache_n) do, and counts them in /metrics.
"""

from __future__ import annotations

import json

import httpx
import pytest

import pyspec
from pyspec import Sampling, _core
from pyspec import prefix as prefixes

from chisquare import assert_law, required_n
from laws import TARGET, next_row, one_hot, residual_is_p_row, support_of, target_rows
from server_helpers import ServerProcess
from pyspec.request import Request
from pyspec.testing import TestControls

# Exact laws from single-token rows: bit-exact batch rows presumed (conftest skips these on GPU builds).
pytestmark = pytest.mark.bitexact

SYSTEM_A = "You are a pirate. " + " ".join(f"Rule {i}: talk of ship {i} in one short line." for i in range(16))
SYSTEM_B = "You count in French. " + " ".join(f"Le nombre {i} suit le nombre {i - 1}." for i in range(1, 17))
GREEDY = dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0)
# Over MIN_TOKENS tokens (shorter caches are not kept), and an open next token.
LAW_PROMPT = ("Notes from the meeting: the team met on Monday to review the plan, the budget and the schedule. "
              "Everyone agreed that the next step is to write down what each person will do before Friday, "
              "and to share it with the others in one short page. After that, the meeting ended early because "
              "the room was needed for a class at noon. The weather today is")


def chat(model, system, *turns):
    return model.prompt_tokens([{"role": "system", "content": system}] +
                               [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                                for i, t in enumerate(turns)])


class Conversations:
    """A session over a target and a draft model (gemma, a separate copy), run as
    the server runs it: one request at a time, each in the slot ``choose`` names."""

    def __init__(self, decoder, cache=None, choose="engine", _test=None):
        self.decoder = decoder
        self.session = decoder.open_session(lambda *a: True, host_cache=cache, _test=_test)
        self.choose = choose

    def run(self, prompt, max_tokens=6, seed=1, logprobs=None, **settings):
        s = self.session
        slot = s.pick_slot(prompt) if self.choose == "engine" else 0
        fields = {k: settings.pop(k) for k in GREEDY if k in settings}  # sampling given by field; the rest drafts
        request = Request(tuple(prompt), Sampling(**{**GREEDY, **fields}), self.decoder.drafting(**settings),
                          max_tokens=max_tokens, logprobs=logprobs)
        setup = self.decoder.setup(request, seed=seed, slots=[slot], drafters="slots")[0]
        s.add(prompt, setup.params, drafter=setup.drafter, policy=setup.policy, slot=slot)
        while s.step():
            pass
        (_, result), = s.take_finished()
        return result

    def close(self):
        self.session.close()


@pytest.fixture
def pair(gemma_path, load_model):
    def make(n_seq):
        target = load_model(gemma_path, n_ctx=2048, n_seq_max=n_seq)
        draft = load_model(gemma_path, instance="draft", n_ctx=2048, n_seq_max=n_seq)
        return pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=3,
                                         memory=False)
    return make


def alternate(conv, model):
    """A, B, then each continued: what the second turns found cached, and what the
    draft model evaluated for them."""
    a1, b1 = chat(model, SYSTEM_A, "Hi."), chat(model, SYSTEM_B, "Hi.")
    conv.run(a1)
    conv.run(b1)
    draft = conv.decoder.draft.native
    found, draft_work = [], []
    for first in (a1, b1):
        turn = first + model.tokenize(" And a second question?", add_special=False)
        before = draft.n_decoded
        # Two tokens: the draft model catches up when it first drafts (after the first token).
        r = conv.run(turn, max_tokens=2)
        found.append((r.stats.n_cached_tokens, len(first)))
        draft_work.append(draft.n_decoded - before)
    return found, draft_work


def test_two_conversations_in_turn_keep_their_caches(pair):
    decoder = pair(3)
    conv = Conversations(decoder)
    try:
        found, draft_work = alternate(conv, decoder.target)
    finally:
        conv.close()
    print("cached of second turns:", found, "draft tokens evaluated:", draft_work)
    for cached, first in found:
        assert cached >= first - 1, f"only {cached} of the conversation's {first} tokens were found cached"
    for work, (_, first) in zip(draft_work, found):
        assert work < 64, f"the draft model evaluated {work} tokens for a turn whose {first} earlier ones it held"


def test_negative_control_lowest_free_slot_loses_the_other_conversation(pair):
    decoder = pair(3)
    conv = Conversations(decoder, choose="lowest")
    try:
        found, draft_work = alternate(conv, decoder.target)
    finally:
        conv.close()
    print("NEGATIVE CONTROL cached of second turns:", found, "draft tokens evaluated:", draft_work)
    assert all(cached < first // 4 for cached, first in found), found
    assert all(work > first // 2 for work, (_, first) in zip(draft_work, found)), draft_work


def test_host_memory_brings_a_conversation_back_to_both_models(pair):
    decoder = pair(1)  # one slot: the other conversation can only be in host memory
    cache = _core.HostCache(256 << 20)
    conv = Conversations(decoder, cache=cache)
    try:
        found, draft_work = alternate(conv, decoder.target)
    finally:
        conv.close()
    stats = cache.stats
    print("cached of second turns:", found, "draft tokens evaluated:", draft_work, stats)
    assert stats["restored"] == 2 and stats["restored_tokens"] > 0
    for cached, first in found:
        assert cached >= first - 1
    assert all(work < 64 for work in draft_work), draft_work
    assert 0 < stats["bytes"] <= stats["capacity"]

    conv = Conversations(decoder)  # the same without host memory: both turns prefill again
    try:
        found, _ = alternate(conv, decoder.target)
    finally:
        conv.close()
    print("NEGATIVE CONTROL (no host memory):", found)
    assert all(cached < first // 4 for cached, first in found), found


def test_host_memory_stays_within_its_bound(pair):
    decoder = pair(1)
    model = decoder.target
    probe = _core.HostCache(1 << 30)
    conv = Conversations(decoder, cache=probe)
    try:
        conv.run(chat(model, SYSTEM_A, "Hi."))
        conv.session.release_cache()  # into the probe: one entry's size
    finally:
        conv.close()
    one = probe.stats["bytes"]
    cache = _core.HostCache(int(2.5 * one))
    conv = Conversations(decoder, cache=cache)
    try:
        for i in range(4):
            conv.run(chat(model, SYSTEM_A, f"Question {i}?"))
            conv.session.release_cache()
    finally:
        conv.close()
    stats = cache.stats
    print(one, stats)
    assert stats["saved"] == 4 and stats["evicted"] == 2 and stats["entries"] == 2
    assert stats["restored"] == 3  # each later question found the system prompt in host memory
    assert stats["bytes"] <= stats["capacity"]


def test_a_restored_cache_answers_as_a_prefill(pair):
    """Restored cells are the computed cells: the greedy answer is the same token
    for token, and so are its rows (each token's log-probability and the five
    likeliest). Negative control: the other conversation's state under this
    conversation's tokens gives other rows, and the same check sees it. (The
    rows, not the text alone: the 270M test model answers "Name a ship." with
    the same words whatever its system prompt says.)"""
    decoder = pair(1)
    model = decoder.target
    a, b = chat(model, SYSTEM_A, "Name a ship."), chat(model, SYSTEM_B, "Count to ten.")
    conv = Conversations(decoder)
    try:
        fresh = answer(conv.run(a, max_tokens=12, logprobs=5))
        conv.session.release_cache()
    finally:
        conv.close()
    cache = _core.HostCache(256 << 20)
    conv = Conversations(decoder, cache=cache)
    try:
        conv.run(a, max_tokens=12)
        conv.run(b, max_tokens=12)  # A goes to host memory
        restored = answer(conv.run(a, max_tokens=12, logprobs=5))
        assert cache.stats["restored"] == 1
        assert restored == fresh, "a restored cache answered differently from a prefill"

        # The wrong state: B's cells (both models) labelled with A's tokens.
        conv.run(b, max_tokens=12)
        conv.session.release_cache()
        (b_parts,) = [e for e in cache.entries() if e[0][1][:len(b) - 1] == b[:len(b) - 1]]
        cache.clear()

        def labelled_a(tokens):  # A's tokens, as many as the state has cells
            return (list(a) + [a[-1]] * len(tokens))[:len(tokens)]

        assert cache.put([(m, labelled_a(toks), state) for m, toks, state in b_parts])
        before = cache.stats["restored"]
        wrong = answer(conv.run(a, max_tokens=12, logprobs=5))
        assert cache.stats["restored"] == before + 1
    finally:
        conv.close()
    print("NEGATIVE CONTROL fresh", fresh[1][:2], "wrong state", wrong[1][:2])
    assert wrong != fresh, "a wrong cache state went unnoticed"


def answer(result):
    """A result's tokens and rows (log-probabilities, as computed: compared exactly)."""
    return list(result.tokens), [(lp, list(top)) for lp, top in result.logprobs]


def test_law_after_a_restore(gemma_path, load_model):
    """First tokens at T = 1 (top-k 3), each drawn right after both models' cells
    came back from host memory, with a greedy draft from the restored draft
    cells verified on the restored target cells, follow p0; with the broken
    residual (residual = p) the same test rejects."""
    target = load_model(gemma_path, n_ctx=512, n_seq_max=1, seed=0)
    draft = load_model(gemma_path, instance="draft", n_ctx=512, n_seq_max=1)
    prompt = target.tokenize(LAW_PROMPT)
    assert len(prompt) > _core.HostCache.MIN_TOKENS
    p0, _ = target_rows(load_model(gemma_path, n_ctx=512), prompt)
    decoder = pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=1, memory=False)
    x = int(next_row(target, prompt, **GREEDY).argmax())  # the greedy draft's proposal
    support = support_of(p0)
    exact = {t: float(p0[t]) for t in support}
    wrong_row = residual_is_p_row(p0, one_hot(x, p0))
    wrong = {t: float(wrong_row[t]) for t in support}
    n = max(200, required_n(exact, wrong, len(exact) - 1))

    def sample(_test=None):
        cache = _core.HostCache(64 << 20)
        conv = Conversations(decoder, cache=cache, _test=_test)
        counts, drafted, cached = {}, 0, 0
        try:
            for i in range(n):
                conv.session.release_cache()  # both models' cells go to host memory ...
                r = conv.run(prompt, max_tokens=2, seed=50_000 + i,
                             draft_sampling=Sampling(**{**TARGET, "temperature": 0.0}), **TARGET)  # ... and back
                counts[r.tokens[0]] = counts.get(r.tokens[0], 0) + 1
                drafted += r.stats.drafted > 0
                cached += r.stats.n_cached_tokens == len(prompt) - 1
        finally:
            conv.close()
        assert cache.stats["restored"] >= n - 1 and cached >= n - 1, (cache.stats, cached)
        assert drafted == n, f"the draft fired in {drafted} of {n} samples"
        return counts, f"(restored {cache.stats['restored']}, drafted in {drafted})"

    counts, note = sample()
    assert_law(counts, exact, n, "first token after a host-memory restore", note=note)
    counts, note = sample(_test=TestControls(variant="residual_is_p"))
    assert_law(counts, exact, n, "first token after a restore, residual = p", control=True, note=note)


# ------------------------------------------------------------ saved prefixes

def test_saved_prefix_resumes_without_prefill_in_a_new_process(gemma_path, tmp_path):
    def decoder():
        target = pyspec.Model(gemma_path, n_ctx=1024)
        draft = pyspec.Model(gemma_path, n_ctx=1024)
        return pyspec.SpeculativeDecoder(target, draft, drafter="model", policy="fixed", draft_max=3, memory=False)

    path = tmp_path / "pirate.prefix"
    first = decoder()
    system = [{"role": "system", "content": SYSTEM_A}]
    n = first.save_prefix(system, path)
    prompt = chat(first.target, SYSTEM_A, "Name a ship.")
    assert prompt[:n] == first.target.tokenize(first.target.apply_chat_template(system, add_assistant=False),
                                               add_special=True, parse_special=True)
    first.clear_cache()
    fresh = first.generate(prompt, max_tokens=8, seed=3, **GREEDY)
    del first

    second = decoder()  # a new process as far as the contexts know
    assert second.load_prefix(path) == n
    before = second.draft.native.n_decoded
    out = second.generate(prompt, max_tokens=8, seed=3, **GREEDY)
    assert out.stats.n_cached_tokens >= n, out.stats.n_cached_tokens
    assert second.draft.native.n_decoded - before < len(prompt) - n + 64
    assert out.tokens == fresh.tokens

    plain = pyspec.Model(gemma_path, n_ctx=1024)  # a plain model reads the target's part alone
    assert plain.load_prefix(path) == n


def test_saved_prefix_refuses_other_models_builds_and_damage(gemma_path, tmp_path):
    import gguf_edit

    model = pyspec.Model(gemma_path, n_ctx=512)
    path = tmp_path / "p.prefix"
    model.save_prefix("A long enough document. " * 20, path)

    tiny = tmp_path / "tiny.gguf"
    gguf_edit.save(gguf_edit.tiny_llama(), tiny)
    with pytest.raises(prefixes.PrefixFileError, match="another target: file"):
        pyspec.Model(str(tiny), n_ctx=512).load_prefix(path)

    raw = path.read_bytes()
    (tmp_path / "cut.prefix").write_bytes(raw[:-100])
    with pytest.raises(prefixes.PrefixFileError, match="cut short"):
        model.load_prefix(tmp_path / "cut.prefix")

    head, rest = raw[len(prefixes.MAGIC):].split(b"\n", 1)
    header = json.loads(head)
    header["build"]["llama-cpp-python"] = "0.0.1"
    (tmp_path / "old.prefix").write_bytes(prefixes.MAGIC + json.dumps(header).encode() + b"\n" + rest)
    with pytest.raises(prefixes.PrefixFileError, match="not by this build"):
        model.load_prefix(tmp_path / "old.prefix")

    (tmp_path / "junk.prefix").write_bytes(b"not a prefix at all")
    with pytest.raises(prefixes.PrefixFileError, match="not a saved pyspec prefix"):
        model.load_prefix(tmp_path / "junk.prefix")
    assert model.load_prefix(path) > 0  # the good file still loads
    assert not list(tmp_path.glob(".p.prefix-*")), "a temporary file was left behind"


# ------------------------------------------------------------ the server

def ask(server, system, *turns):
    messages = [{"role": "system", "content": system}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == body["timings"]["cache_n"]
    assert body["timings"]["prompt_n"] == body["usage"]["prompt_tokens"] - cached
    return cached, body["usage"]["prompt_tokens"], body["choices"][0]["message"]["content"]


def in_turn(server):
    """Two chats in turn, each continued: (cached, prompt tokens) of the second turns."""
    _, _, a = ask(server, SYSTEM_A, "Hi.")
    _, _, b = ask(server, SYSTEM_B, "Hi.")
    return [ask(server, SYSTEM_A, "Hi.", a, "More?")[:2], ask(server, SYSTEM_B, "Hi.", b, "More?")[:2]]


SERVE = ("--parallel", "1", "--n-ctx", "2048", "--model-alias", "gemma")


def test_server_reports_and_keeps_conversations_in_turn(gemma_path, tmp_path):
    folder = tmp_path / "prompts"
    s = ServerProcess("--model", gemma_path, "--draft", gemma_path, "--drafter", "model", *SERVE,
                      "--cache-slots", "1", "--cache-dir", str(folder))
    try:
        turns = in_turn(s)
        metrics = httpx.get(s.url("/metrics"), timeout=10).text
        health = s.health()
    finally:
        assert s.stop() == 0
    print("second turns (cached, prompt):", turns, health)
    assert all(cached >= prompt // 2 for cached, prompt in turns), turns
    line = next(l for l in metrics.splitlines() if l.startswith("pyspec:prompt_tokens_cached_total{"))
    assert float(line.split()[-1]) >= sum(c for c, _ in turns)
    assert "pyspec:prompt_cache_ram_capacity_bytes" in metrics
    assert health["conversations_cached"] >= 1
    saved = list(folder.glob("*.prefix"))
    assert saved, "the cached conversations were not saved at shutdown"

    # A restarted server answers the first conversation's next turn from the folder
    # (named by --cache-dir's old name, which still works after a notice).
    s = ServerProcess("--model", gemma_path, "--draft", gemma_path, "--drafter", "model", *SERVE,
                      "--cache-slots", "1", "--prompt-cache", str(folder))
    try:
        _, _, a = ask(s, SYSTEM_A, "Hi.")  # answered from the loaded cache
        cached, prompt, _ = ask(s, SYSTEM_A, "Hi.", a, "More?")
        restored_cached, restored_prompt, _ = ask(s, SYSTEM_B, "Hi.", "x", "Other?")
    finally:
        assert s.stop() == 0
    assert cached >= prompt // 2
    assert restored_cached >= len(SYSTEM_B) // 8, (restored_cached, restored_prompt)


def test_server_negative_control_lowest_free_slot(gemma_path):
    s = ServerProcess("--model", gemma_path, "--no-draft", *SERVE, "--cache-slots", "1", "--cache-ram", "0",
                      "--test-controls", TestControls(slot_choice="lowest").to_json())
    try:
        turns = in_turn(s)
    finally:
        assert s.stop() == 0
    print("NEGATIVE CONTROL second turns (cached, prompt):", turns)
    assert all(cached < prompt // 4 for cached, prompt in turns), turns


def test_length_policies_follow_the_user_not_the_slot(gemma_path, load_model):
    """What the lowest-free-slot rule was for: one client's requests keep teaching
    one length policy, whichever slot its conversation is in."""
    from pyspec.server.scheduler import Scheduler
    from pyspec.server.users import POLICY_USERS

    model = load_model(gemma_path, n_ctx=512, n_seq_max=2)
    s = Scheduler(model, parallel=1, queue_size=1)
    try:
        p = s.policies
        alice, bob = p.key("alice"), p.key("bob")
        assert alice != bob and p.key("alice") == alice
        p.hold(7, alice)  # alice has a request running: her next one runs beside it, on its own policy
        assert p.key("alice") == (alice[0], 1)
        p.release(7)
        assert p.key("alice") == alice
        for i in range(2 * POLICY_USERS):
            p.key(f"user {i}")
        assert len(p.users) == POLICY_USERS and max(p.users.values()) == POLICY_USERS - 1
    finally:
        s.stop()
