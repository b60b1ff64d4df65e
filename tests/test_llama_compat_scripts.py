"""llama-cpp-python scripts run unchanged on pyspec: each script of
tests/fixtures/lcp_scripts/ runs as written (``from llama_cpp import Llama``)
and with that one line changed to ``from pyspec import Llama``, in this
process, and the two runs agree: the same keys and types in every answer,
the same finish reasons and usage, the same tool call, the same greedy text
where both start from an empty cache.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from lcp_shapes import same_shape

pytest.importorskip("llama_cpp")

SCRIPTS = Path(__file__).parent / "fixtures" / "lcp_scripts"
LCP_IMPORT = "from llama_cpp import Llama\n"


def run(script: str, model: str, pyspec: bool) -> dict:
    """The script's printed JSON, run as written or with its import swapped."""
    path = SCRIPTS / script
    source = path.read_text(encoding="utf-8")
    assert source.count(LCP_IMPORT) == 1
    if pyspec:
        source = source.replace(LCP_IMPORT, "from pyspec import Llama\n")
    out, argv = io.StringIO(), sys.argv
    sys.argv = [str(path), model]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, str(path), "exec"), {"__name__": "__main__", "__file__": str(path)})
    finally:
        sys.argv = argv
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def qwen_path():
    from pyspec import models

    return str(models.ensure(models.DEFAULT_DRAFT))


def test_completions_script(gemma_path):
    mine, want = run("complete.py", gemma_path, True), run("complete.py", gemma_path, False)
    same_shape(mine, want)
    for name in ("stop", "logprobs", "echo"):
        assert mine[name]["usage"] == want[name]["usage"], name
        assert mine[name]["choices"][0]["finish_reason"] == want[name]["choices"][0]["finish_reason"], name
    assert mine["stop"]["choices"][0]["text"] == want["stop"]["choices"][0]["text"]  # the first call: no cache
    assert mine["tokens"] == want["tokens"]
    assert mine["stream"][-1]["choices"][0]["finish_reason"] == want["stream"][-1]["choices"][0]["finish_reason"]
    for chunk in mine["stream"][:-1]:
        same_shape(chunk, want["stream"][0])


def test_streamed_chat_with_tools_script(qwen_path):
    mine, want = run("chat_tools_stream.py", qwen_path, True), run("chat_tools_stream.py", qwen_path, False)
    same_shape(mine, want)
    assert [c["name"] for c in mine["calls"]] == [c["name"] for c in want["calls"]] == ["get_weather"]
    assert json.loads(mine["calls"][0]["arguments"]) == json.loads(want["calls"][0]["arguments"])
    assert mine["calls"][0]["id"] and mine["finish"] == want["finish"] == "tool_calls"
    assert mine["answer"].strip() and mine["answer_finish"] in ("stop", "length")


def test_grammar_json_and_state_script(qwen_path):
    mine, want = run("structured_state.py", qwen_path, True), run("structured_state.py", qwen_path, False)
    same_shape(mine, want)
    assert mine["grammar"] == want["grammar"] == "yes"
    assert isinstance(mine["json"]["age"], int) and mine["json_finish"] == want["json_finish"] == "stop"
    assert mine["state"] == want["state"] == {"same": True, "n_tokens": want["state"]["n_tokens"]}
    assert mine["after_reset"] and want["after_reset"]
