"""`pyspec bench multiturn`: the conversations are well-formed data, a turn's
prompt holds what it should, and the command runs end to end on the small
test model (speed itself is never asserted in tests)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from pyspec.bench.conversations import CONVERSATIONS, KINDS, WHOLE_FILE, conversations, transcript


def test_conversations_are_well_formed():
    assert len(CONVERSATIONS) == 6
    assert len({c.id for c in CONVERSATIONS}) == len(CONVERSATIONS)
    assert {c.kind for c in CONVERSATIONS} == set(KINDS)
    assert {c.kind for c in conversations(4)} == set(KINDS), "any four (the serving bench's) hold both kinds"
    for c in CONVERSATIONS:
        assert 4 <= len(c.turns) <= 6, c.id
        for i, text in enumerate(c.turns):
            assert WHOLE_FILE.lower() in text.lower(), f"{c.id} turn {i + 1} does not ask for the whole file"
        # The file comes in the first request (every request of a repeated task), in one fenced block of 15-40 lines.
        for text in c.turns if c.kind == "repeat" else c.turns[:1]:
            assert text.count("```") == 2, c.id
            body = text.split("```")[1]
            assert 15 <= len(body.splitlines()) <= 41, (c.id, len(body.splitlines()))
        if c.kind == "edit":
            assert all("```" not in t for t in c.turns[1:]), f"{c.id}: later turns only ask for a change"
    repeats = [c for c in CONVERSATIONS if c.kind == "repeat"]
    for c in repeats:  # the same instruction on different inputs
        assert len({t.rsplit("```", 1)[1] for t in c.turns}) == 1, c.id
        assert len(set(c.turns)) == len(c.turns), c.id


def test_a_turn_holds_the_conversation_so_far():
    edit = next(c for c in CONVERSATIONS if c.kind == "edit")
    msgs = edit.messages(2, ["A1", "A2"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [msgs[2]["content"], msgs[4]["content"]] == ["A1", "A2"] and msgs[-1]["content"] == edit.turns[2]
    with pytest.raises(ValueError):
        edit.messages(2, ["A1"])
    repeat = next(c for c in CONVERSATIONS if c.kind == "repeat")
    assert [m["role"] for m in repeat.messages(3, ["x"] * 3)] == ["system", "user"]
    assert transcript(msgs).endswith("User: " + edit.turns[2] + "\n\nAssistant:")
    with pytest.raises(ValueError):
        conversations(len(CONVERSATIONS) + 1)


def test_bench_multiturn_end_to_end(gemma_path, tmp_path):
    """One conversation of the test model (no chat template: --raw), 24 tokens an
    answer: every turn paired on all three sides, finite ratios, the summary."""
    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    out = tmp_path / "mt.json"
    run = subprocess.run([*cmd, "bench", "multiturn", "-m", gemma_path, "--raw", "--conversations", "1",
                          "--max-tokens", "24", "--n-ctx", "2048", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    conv = CONVERSATIONS[0]
    assert result["conversations"] == [conv.id]
    assert result["sides"] == ["plain", "default", "memory off"]
    turns = result["turns"]
    assert [t["turn"] for t in turns] == list(range(1, len(conv.turns) + 1))
    for t in turns:
        assert sorted(t["order"]) == sorted(result["sides"])
        assert set(t["equal"]) == {"plain", "memory off"}
        for s in t["sides"].values():
            assert s["n_generated"] <= 24
        assert set(t["ratios"]) == set(result["summary"])
        assert all(math.isfinite(x) and x > 0 for x in t["ratios"].values()), t["ratios"]
    assert turns[0]["order"] != turns[1]["order"], "the order of the sides rotates from turn to turn"
    assert [t["n_prompt"] for t in turns] == sorted(t["n_prompt"] for t in turns), "history grows"
    summary = result["summary"]
    assert set(summary) == {"default / plain", "memory off / plain", "default / memory off"}
    for pair, s in summary.items():
        head = s["turns 2+"]
        assert head["n_conversations"] == 1 and head["n_turns"] == len(conv.turns) - 1, pair
        assert math.isfinite(head["ratio"]) and head["ratio"] > 0, pair
        assert head["low"] <= head["ratio"] <= head["high"], pair
        assert set(s["per_turn"]) == {str(t) for t in range(1, len(conv.turns) + 1)}
        assert all(math.isfinite(r["ratio"]) for r in s["per_turn"].values()), pair
        assert set(s["per_conversation"]) == {conv.id}
    assert result["sides_turns_2plus"]["plain"]["drafted"] == 0
    assert "default / plain" in result["table"] and "answers equal" in result["table"]
