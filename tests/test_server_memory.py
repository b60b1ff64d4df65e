"""`pyspec serve` keeps one memory per user (the request field `user`; issue 24):
a user's repeated request drafts from what that user's earlier request said,
another user's does not (a draft from someone else's text would let its timing
tell whether that text was seen), `--no-memory` turns it off, and a `user` that
is not a string is refused. Drafting never changes a greedy answer: the answers
are the same in every case, up to a flip at a near tie (the runs verify in
batches of other shapes, whose CPU kernels round differently: near_ties.py's
rule on the server's own log-probabilities, logprob_flip).

Requests ask for the fixed policy (draft_max 8): auto's choices follow this
machine's clock, and whether a round drafts at all is what is checked here.
"""

from __future__ import annotations

import json

import pytest

from pyspec import models

from near_ties import assert_flips, first_difference, flip_chances, logprob_flip, logprob_gaps, row_law
from server_helpers import ServerProcess

# Its greedy answer (24 tokens) has no top-2 gap below 0.65 in probability in plain
# evaluation, so a flip has little chance: the comparisons with one reference may
# part at most as its gaps allow (assert_one_reference). ("The capital of France
# is" flips at token 11, " largest" / " capital" within 0.007, between runs
# drafting differently.)
PROMPT = "1, 2, 3, 4,"
LAW = row_law(models.TEST_MODEL)
SERVER_ARGS = ("--parallel", "2", "--n-ctx", "1024", "--model-alias", "gemma")


@pytest.fixture(scope="module")
def server(gemma_path):
    s = ServerProcess("--model", gemma_path, *SERVER_ARGS)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def server_without_memory(gemma_path):
    s = ServerProcess("--model", gemma_path, *SERVER_ARGS, "--no-memory")
    yield s
    assert s.stop() == 0


def complete(server, user=None, prompt=PROMPT, **extra) -> dict:
    body = dict(model="gemma", prompt=prompt, max_tokens=24, temperature=0, logprobs=5, policy="fixed",
                draft_max=8, **extra)
    if user is not None:
        body["user"] = user
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def memory_rounds(response) -> int:
    t = response["timings"]
    assert (t["draft_memory_rounds"] > 0) == (t["draft_memory_n"] > 0)
    return t["draft_memory_rounds"]


def assert_one_reference(ref: dict, flips: int, n: int) -> None:
    """Comparisons with one reference are one event (near_ties.assert_near):
    whether any parted, against the chance its gaps give n comparisons."""
    chance = flip_chances(LAW, [logprob_gaps(ref["choices"][0]["logprobs"]["top_logprobs"])], batched=True)[0]
    assert_flips(int(flips > 0), [min(1.0, n * chance)])


def near_tie_flip(ref: dict, other: dict, what: str) -> int:
    """0 if the two greedy answers agree; 1 if they part at a near tie of `ref`'s
    own row (near_ties.logprob_flip); anything else fails."""
    a, b = ref["choices"][0], other["choices"][0]
    if a["text"] == b["text"]:
        return 0
    ta, tb = a["logprobs"]["tokens"], b["logprobs"]["tokens"]
    i = first_difference(ta, tb)
    assert i < min(len(ta), len(tb)), f"{what}: one answer ends where the other goes on: {a['text']!r} vs {b['text']!r}"
    logprob_flip(LAW, a["logprobs"]["top_logprobs"][i], ta[i], tb[i], f"{what}, token {i}")
    return 1


def test_memory_is_kept_per_user(server):
    alice_1 = complete(server, "alice")
    alice_2 = complete(server, "alice")
    bob_1 = complete(server, "bob")
    anonymous = complete(server)
    bob_2 = complete(server, "bob")
    rounds = {k: memory_rounds(v) for k, v in
              dict(alice_1=alice_1, alice_2=alice_2, bob_1=bob_1, anonymous=anonymous, bob_2=bob_2).items()}
    print(rounds)
    assert rounds["alice_1"] == 0, "a new user's memory must be empty"
    assert rounds["alice_2"] > 0, "alice's repeated request did not draft from her memory"
    assert rounds["bob_1"] == 0, "bob's request drafted from alice's memory"
    assert rounds["anonymous"] == 0, "a request without a user drafted from alice's or bob's memory"
    assert rounds["bob_2"] > 0, "bob's own repeat did not draft from his memory"
    others = dict(alice_2=alice_2, bob_1=bob_1, anonymous=anonymous, bob_2=bob_2)
    flips = sum(near_tie_flip(alice_1, r, f"alice 1 vs {name}") for name, r in others.items())
    assert_one_reference(alice_1, flips, len(others))


def test_no_memory_server_never_drafts_from_memory(server, server_without_memory):
    reference = complete(server, "carol")  # a new user of the memory server: nothing to draft from yet
    assert memory_rounds(reference) == 0
    first = complete(server_without_memory, "alice")
    second = complete(server_without_memory, "alice")
    assert memory_rounds(first) == memory_rounds(second) == 0
    assert second["timings"]["draft_n"] > 0, "the server without memory did not draft at all (lookup in the text)"
    flips = near_tie_flip(reference, first, "memory server vs --no-memory") + \
        near_tie_flip(reference, second, "memory server vs --no-memory, repeated")
    assert_one_reference(reference, flips, 2)


@pytest.mark.parametrize("user", [123, ["alice"], {"name": "alice"}, True, False])
def test_user_must_be_a_string(server, server_without_memory, user):
    for s in (server, server_without_memory):
        r = s.post("/v1/completions", dict(model="gemma", prompt=PROMPT, max_tokens=2, user=user))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "user" and "string" in err["message"]


def test_a_null_user_is_the_anonymous_user(server):
    """Some clients send "user": null: it means no user (the shared anonymous memory), not an error."""
    r = server.post("/v1/completions", dict(model="gemma", prompt=PROMPT, max_tokens=2, user=None))
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------ copies into JSON strings

# A file with what JSON escapes: newlines, quotes, a backslash, a tab.
ESCAPED_FILE = '''import json
import sys


def load(path):
    """Read a JSON file; "-" reads standard input."""
    if path == "-":
        return json.load(sys.stdin)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(path, data):
    """Write data as indented JSON, ending with a newline."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\\n")
'''
WRITE_FILE = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
              "required": ["path", "content"]}


def test_escaped_views_are_each_long_message_once(draft_path, load_model):
    """pyspec/escaped.py: a prompt's long messages with characters JSON escapes
    give their escaped text (json.dumps's, inside the quotes), split at the chat
    template's control tokens (Qwen's <|im_start|>, <|im_end|>); short or plain
    messages give none; a memory takes each view once, however often the
    conversation is re-sent."""
    from pyspec import Memory, escaped
    model = load_model(draft_path, n_ctx=1024)  # the test model's template has no control tokens
    plain = "A plain sentence without any character that JSON escapes, long enough to count."
    prompt = model.prompt_tokens([{"role": "user", "content": ESCAPED_FILE}, {"role": "assistant", "content": "ok"},
                                  {"role": "user", "content": plain}, {"role": "user", "content": 'a "b"\n'}])
    views = [escaped.escape(text) for text in escaped.worth_a_view(model, prompt)]
    assert len(views) == 1 and json.dumps(ESCAPED_FILE)[1:-1] in views[0], views
    memory = Memory(1)
    assert escaped.remember(memory, model, prompt) == 1 and memory.n_documents == 1
    assert escaped.remember(memory, model, prompt + model.tokenize(" more", add_special=False)) == 0
    assert memory.documents()[0] == model.tokenize(views[0], add_special=False)


READ_FILE = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@pytest.fixture(scope="module")
def coder_servers(target_path):
    """Qwen2.5-Coder 1.5B (tools in its template; the 0.5B does not copy the
    file), suffix lookup with memory: the product, and the control that adds no
    escaped views (TestControls.escaped_views). The fixed policy drafts 8 tokens
    wherever a lookup finds them: auto's lengths follow the batch timings on
    record, which a test session shares (CI saw 48 of 158 tokens drafted from
    memory where a quiet run sees 76 to 103), and this test is about the lookup."""
    from pyspec.testing import TestControls
    args = ("--model", target_path, "--parallel", "1", "--n-ctx", "2048", "--policy", "fixed", "--draft-max", "8")
    both = (ServerProcess(*args), ServerProcess(*args, "--test-controls", TestControls(escaped_views=False).to_json()))
    yield both
    for s in both:
        assert s.stop() == 0


def test_a_file_copied_into_a_tool_call_drafts_from_its_escaped_view(coder_servers):
    """Issue 60: an agent writes a file it read as a tool call's argument, a JSON
    string. The server adds the escaped form of the prompt's long messages to
    the user's memory (pyspec/escaped.py), so the copy drafts through `\\n`,
    `\\"` and `\\\\`: a third or more of the call's tokens are drafted from memory.
    Control: without the views the same call drafts far less from memory (the
    copy's lookups break at every escape). Greedy, the fixed policy (coder_servers)."""
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": READ_FILE}},
             {"type": "function", "function": {"name": "write_file", "parameters": WRITE_FILE}}]
    read = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "io.py"}'}}
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools to work on files."},
                {"role": "user", "content": "Copy io.py to copy.py, unchanged."},
                {"role": "assistant", "content": None, "tool_calls": [read]},
                {"role": "tool", "tool_call_id": "c1", "content": ESCAPED_FILE}]
    body = dict(model="x", messages=messages, temperature=0, max_tokens=300, user="agent", tools=tools,
                tool_choice={"type": "function", "function": {"name": "write_file"}})
    answers = []
    for server in coder_servers:
        r = server.post("/v1/chat/completions", body, timeout=600)
        assert r.status_code == 200, r.text
        answers.append(r.json())
    views, control = answers
    for a in answers:
        content = json.loads(a["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["content"]
        assert "def save(path, data):\n" in content and '"utf-8"' in content, content  # it copied the file
    n = views["usage"]["completion_tokens"]
    with_views, without = (a["timings"]["draft_memory_n"] for a in answers)
    rates = [a["timings"]["predicted_per_second"] for a in answers]
    print(f"call of {n} tokens: drafted from memory {with_views} with the views, {without} without; "
          f"{rates[0]:.1f} vs {rates[1]:.1f} tok/s")
    # A third at least (the copy drafts wherever the view matches); the control drafts none.
    assert memory_rounds(views) > 0 and with_views >= n // 3, views["timings"]
    assert without < with_views // 2, control["timings"]
