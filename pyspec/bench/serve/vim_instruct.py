"""The instruction edit of `pyspec bench vim --instruct N` (issue 61): the
newer llama.vim's ``:LlamaInstruct``, replayed in its request shape, since
the plugin the pinned llama.cpp ships has no such command.

A user selects a block and types an instruction. While they type, the
plugin sends the chat request without the instruction and ``n_predict: 0``,
so that the server caches the prompt (the context, the ring's chunks, the
block); once they press Enter it sends the whole request, streamed. What the
user waits for is its first token: with the warm-up cached, only the
instruction's tokens are new (llama-server: 12 tokens, 0.62 s; pyspec before
it cached warm-ups: 1,282 tokens, 13.4 s).

Per selection and backend (ABBA across selections): the warm-up, answered;
the instruction typed (a key every ``pace`` seconds); the request; the time
from Enter to its first streamed token (TTFT) and to its end.
"""

from __future__ import annotations

import time
from typing import Dict, List, Sequence

from .concurrent import percentile
from .editor import bootstrap, paired_p50_ratio
from .process import request, stream_completion

INSTRUCTIONS = ("Add a short docstring.", "Add type hints.", "Rename the variables to clearer names.",
                "Add comments explaining each step.", "Make this more concise.")
SYSTEM = "You are a code-editing assistant. Return ONLY the new content for the requested block."
BLOCK = 8       # lines selected
AROUND = 40     # lines of context before and after the block
MAX_TOKENS = 48


def user_text(lines: Sequence[str], start: int, ring: str, instruction: str) -> str:
    """The user message: context, ring, the block (lines ``start``..+BLOCK,
    1-based), and last the instruction, so that a warm-up (instruction empty)
    holds everything before it."""
    end = min(len(lines), start + BLOCK - 1)

    def numbered(a: int, b: int) -> str:
        return "\n".join(f"{k}: {lines[k - 1]}" for k in range(max(a, 1), min(b, len(lines)) + 1))

    return (f"--- surrounding context ---\nbefore:\n{numbered(start - AROUND, start - 1)}\n"
            f"after:\n{numbered(end + 1, end + AROUND)}\n--- extra context ---\n{ring}\n"
            f"--- range ---\nstart_line: {start}\nend_line: {end}\n--- selected block ---\n"
            f"{numbered(start, end)}\n--- instruction ---\n{instruction}")


def edit(port: int, lines: Sequence[str], start: int, ring: str, instruction: str, pace: float) -> Dict[str, float]:
    """One instruction edit against the server on ``port`` (module docstring)."""
    def messages(text: str) -> List[dict]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]

    t0 = time.perf_counter()
    status, answer = request(port, "POST", "/v1/chat/completions",
                             {"messages": messages(user_text(lines, start, ring, "")), "n_predict": 0,
                              "cache_prompt": True})
    if status != 200:
        raise RuntimeError(f"the warm-up failed: HTTP {status}: {str(answer)[:300]}")
    warm_s = time.perf_counter() - t0
    time.sleep(pace * len(instruction))  # typing it
    r = stream_completion(port, {"messages": messages(user_text(lines, start, ring, instruction)),
                                 "max_tokens": MAX_TOKENS, "temperature": 0, "cache_prompt": True},
                          path="/v1/chat/completions")
    t = r["timings"] or {}
    return {"warm_up_s": warm_s, "ttft_s": (r["t_first"] or r["t_end"]) - r["t_send"],
            "wall_s": r["t_end"] - r["t_send"], "prompt_n": t.get("prompt_n")}


def figures(edits: Sequence[dict], backend: str, seed: int = 0) -> dict:
    mine = [e for e in edits if e["backend"] == backend and "error" not in e]
    ttft = [e["ttft_s"] for e in mine]
    failed = sum(e["backend"] == backend and "error" in e for e in edits)
    return {"backend": backend, "edits": len(mine), "failed": failed, "ttft_p50_s": percentile(ttft, 50),
            "ttft_p50_interval": bootstrap([[x] for x in ttft], lambda xs: percentile(xs, 50), seed=seed),
            "warm_up_p50_s": percentile([e["warm_up_s"] for e in mine], 50),
            "prompt_n_p50": percentile([e["prompt_n"] for e in mine if e["prompt_n"] is not None], 50)}


def ttft_ratio(edits: Sequence[dict], numerator: str, denominator: str, seed: int = 0) -> dict:
    """p50 TTFT of ``numerator`` over ``denominator``'s, paired by selection."""
    done = [e for e in edits if "error" not in e]
    theirs = {e["selection"]: e["ttft_s"] for e in done if e["backend"] == denominator}
    pairs = [[(e["ttft_s"], theirs[e["selection"]])] for e in done
             if e["backend"] == numerator and e["selection"] in theirs]
    return {"numerator": numerator, "denominator": denominator, **paired_p50_ratio(pairs, seed)}
