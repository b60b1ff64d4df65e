"""`pyspec bench serve --llama-server`: the summaries, paired ratios and answer
comparisons on synthetic waves (no server), the orchestration on fake servers,
option checks, an end-to-end run of pyspec's own two server backends (real
`pyspec serve` processes, in CI), and one of the whole CLI with llama.cpp's
llama-server on the test model when a build is at hand (PYSPEC_LLAMA_SERVER or
/tmp/llama-build/bin/llama-server; skipped otherwise, as in CI)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from pyspec.bench.serve import llama_server as bs
from pyspec.bench.serve.process import Backend

PY, PLAIN, LS, NG = bs.PYSPEC, bs.PYSPEC_PLAIN, "llama-server", "llama-server ngram-mod"
LLAMA_SERVER_BIN = os.environ.get("PYSPEC_LLAMA_SERVER", "/tmp/llama-build/bin/llama-server")


def row(backend, rep, clients, wave, agg, ttft=(1.0,), answers=None):
    answers = list(answers) if answers is not None else [f"answer {rep}.{clients}.{i}" for i in range(clients)]
    return {"backend": backend, "rep": rep, "clients": clients, "wave": wave, "aggregate_tok_s": agg,
            "ttft_s": list(ttft), "ttft_max_s": max(ttft), "answers": answers}


def test_figures_keep_backends_clients_and_waves_apart():
    rows = [row(PY, r, c, w, agg=(100 if w == "first" else 300) * c + r, ttft=(0.1 * c, 0.2 * c + (w == "first")))
            for r in range(3) for c in (1, 4) for w in bs.WAVES]
    rows += [row(LS, r, c, w, agg=10 * c + r) for r in range(3) for c in (1, 4) for w in bs.WAVES]
    figs = {(f["backend"], f["clients"], f["wave"]): f for f in bs.comparison_figures(rows)}
    assert len(figs) == 8
    assert figs[(PY, 4, "first")]["aggregate_tok_s"] == 401  # the median of 400, 401, 402
    assert figs[(PY, 4, "cached")]["aggregate_tok_s"] == 1201
    assert figs[(PY, 4, "first")]["ttft_max_s"] == pytest.approx(1.8)
    assert figs[(PY, 4, "cached")]["ttft_max_s"] == pytest.approx(0.8)
    assert figs[(PY, 1, "cached")]["ttft_p50_s"] == pytest.approx(0.1)  # nearest rank over 6 pooled requests
    assert figs[(LS, 1, "first")]["runs"] == 3


def test_percentile_is_nearest_rank():
    assert bs.percentile([6, 1, 5, 2, 4, 3], 50) == 3 and bs.percentile([1, 2, 3, 4, 5], 50) == 3
    assert bs.percentile(range(1, 21), 95) == 19 and bs.percentile(range(1, 101), 95) == 95
    assert bs.percentile([7], 95) == 7 and math.isnan(bs.percentile([], 50))


def test_ratios_pair_by_repetition_clients_and_wave():
    # Ours is exactly twice theirs in each repetition, though repetitions differ a lot:
    # only the right pairing gives 2.00 with no spread.
    ours, theirs = [10.0, 40.0, 20.0], [5.0, 20.0, 10.0]
    rows = [row(PY, r, 8, "first", agg=ours[r]) for r in range(3)]
    rows += [row(LS, r, 8, "first", agg=theirs[r]) for r in range(3)]
    # Distractors: another clients count and the other wave, with other values.
    rows += [row(PY, r, 8, "cached", agg=90.0) for r in range(3)]
    rows += [row(LS, r, 8, "cached", agg=30.0) for r in range(3)]
    rows += [row(PY, r, 4, "first", agg=1.0) for r in range(3)] + [row(LS, r, 4, "first", agg=4.0) for r in range(3)]
    r = bs.paired_ratio(rows, PY, LS, 8, "first")
    assert r["n_reps"] == 3 and r["ratio"] == pytest.approx(2.0)
    assert r["low"] == pytest.approx(2.0) and r["high"] == pytest.approx(2.0)
    assert r["per_rep"] == pytest.approx([2.0, 2.0, 2.0])
    assert bs.paired_ratio(rows, PY, LS, 8, "cached")["ratio"] == pytest.approx(3.0)
    assert bs.paired_ratio(rows, PY, LS, 4, "first")["ratio"] == pytest.approx(0.25)
    # A repetition one side lacks is left out, not paired with another.
    r = bs.paired_ratio([x for x in rows if not (x["backend"] == LS and x["rep"] == 1)], PY, LS, 8, "first")
    assert r["n_reps"] == 2 and r["ratio"] == pytest.approx(2.0)
    # Spread across repetitions gives an interval around the geometric mean.
    noisy = [row(PY, r, 1, "first", agg=a) for r, a in enumerate([2.0, 3.0, 1.5, 2.5])]
    noisy += [row(LS, r, 1, "first", agg=1.0) for r in range(4)]
    r = bs.paired_ratio(noisy, PY, LS, 1, "first")
    assert r["ratio"] == pytest.approx(math.exp(sum(map(math.log, [2.0, 3.0, 1.5, 2.5])) / 4))
    assert 1.5 <= r["low"] < r["ratio"] < r["high"] <= 3.0
    t = bs.paired_ratio(rows, PY, LS, 8, "first", metric="ttft_max_s")
    assert t["ratio"] == pytest.approx(1.0) and t["metric"] == "ttft_max_s"


def test_identical_answers_compare_the_same_request():
    def answers(rep, clients, wave):
        return [f"r{rep} c{clients} {wave} #{i}: the answer" for i in range(clients)]

    rows = [row(b, r, c, w, agg=1.0, answers=answers(r, c, w)) for b in (LS, PY, PLAIN)
            for r in range(2) for c in (1, 2) for w in bs.WAVES]
    # pyspec's second client of rep 1, 2 clients, cached wave parts from llama-server's after "r1 c2 cached #1: the ".
    for x in rows:
        if (x["backend"], x["rep"], x["clients"], x["wave"]) == (PY, 1, 2, "cached"):
            x["answers"][1] = "r1 c2 cached #1: the other answer"
    d = bs.compare_answers(rows, PY, LS, count=lambda text: len(text.split()))
    assert (d["same"], d["compared"]) == (11, 12)
    assert d["differences"] == [{"rep": 1, "clients": 2, "wave": "cached", "client": 1,
                                 "char": len("r1 c2 cached #1: the "), "token": 5, "tie": None}]
    assert bs.compare_answers(rows, PLAIN, LS)["same"] == 12
    # Swapping the waves of one backend must show (the cached answers are not the first wave's).
    swapped = [dict(x, wave="cached" if x["wave"] == "first" else "first") if x["backend"] == PLAIN else x
               for x in rows]
    assert bs.compare_answers(swapped, PLAIN, LS)["same"] == 0

    s = bs.summarize_comparison(rows + [row(NG, r, c, w, agg=1.0, answers=answers(r, c, w)) for r in range(2)
                                        for c in (1, 2) for w in bs.WAVES])
    assert s["backends"] == [LS, PY, PLAIN, NG]
    pairs = [(d["backend"], d["reference"], d["same"], d["compared"]) for d in s["identical"]]
    assert pairs == [(PY, LS, 11, 12), (PLAIN, LS, 12, 12), (NG, LS, 12, 12), (PY, PLAIN, 11, 12)]
    # Every pyspec backend over every llama-server backend, per clients, wave and metric.
    assert len(s["ratios"]) == 2 * 2 * 2 * len(bs.WAVES) * 2
    assert {(r["numerator"], r["denominator"]) for r in s["ratios"]} == {(PY, LS), (PY, NG), (PLAIN, LS), (PLAIN, NG)}
    table = bs.format_comparison(s)
    assert "11/12 identical" in table and "12/12 identical" in table
    assert "2 clients at once" in table and f"{PY} / {NG}" in table


def test_where_answers_part_is_explained_by_the_targets_probabilities(gemma_path):
    """tie_explainer on the test model: an answer that parts from the model's own
    greedy continuation onto an unlikely token is NOT a near tie; one answer
    that is the other's start is a stop, not a choice; the table says which."""
    import pyspec

    messages = [{"role": "user", "content": "Count: one, two, three,"}]
    model = pyspec.Model(gemma_path, n_ctx=512, memory_mb=0)
    greedy = model.generate(messages, max_tokens=6, temperature=0).text
    explain = bs.tie_explainer(gemma_path, n_ctx=512)
    odd = " zebra" if not greedy.startswith(" zebra") else " apple"
    t = explain(messages, greedy, odd)
    assert t["token"] == 0 and t["near_tie"] is False and t["p_a"] > t["p_b"] + bs.NEAR_TIE and not t["top_two"]
    assert explain(messages, greedy, greedy + " and more")["near_tie"] is None

    rows = [row(LS, 0, 1, "first", 1.0, answers=[greedy]), row(PY, 0, 1, "first", 1.0, answers=[odd]),
            row(LS, 0, 1, "cached", 1.0, answers=[greedy]), row(PY, 0, 1, "cached", 1.0, answers=[greedy + "!"])]
    for r in rows:
        r["messages"] = [messages]
    table = bs.format_comparison(bs.summarize_comparison(rows, explain=explain))
    assert "0/2 identical" in table and "1 a prefix of the other" in table
    assert "1 NOT ties (0 between the two most likely tokens)" in table


def test_waves_messages_users_context_and_commands():
    prompts = [f"prompt {i}" for i in range(25)]
    first = bs.wave_messages(prompts, 0, 16)
    assert first == bs.wave_messages(prompts, 0, 16), "every backend is sent the same messages"
    texts = [m[0]["content"] for m in first]
    assert len({t.split(") ", 1)[1] for t in texts}) == 16, "different prompts within a wave"
    assert texts[0].startswith("(request 1.16.1) ")
    tags = {m[0]["content"].split(")")[0] for r in range(3) for c in (1, 4, 8, 16)
            for m in bs.wave_messages(prompts, r, c)}
    assert len(tags) == 3 * (1 + 4 + 8 + 16), "no two waves share a tag"
    assert bs.wave_users(0, 2, "first", False) != bs.wave_users(0, 2, "cached", False)
    assert bs.wave_users(0, 2, "first", True) == bs.wave_users(0, 2, "cached", True)
    assert len(set(bs.wave_users(0, 4, "first", False))) == 4
    assert bs.wave_users(0, 3, "cached", False, local_user=True) == [None] * 3, "one local user sends no `user`"

    assert bs.slot_ctx(100, 128) == 512 and bs.slot_ctx(300, 128) == 768 and bs.slot_ctx(0, 1000) == 1280
    backs = bs.comparison_backends("m.gguf", "d.gguf", parallel=16, n_ctx=16 * 768, threads=4, llama_server="ls",
                                   llama_specs=["none", "ngram-mod"], llama_args=["-kvu"])
    assert [b.name for b in backs] == [PY, PLAIN, LS, NG]
    py, plain, ls, ng = (b.command for b in backs)
    assert py[py.index("--draft") + 1] == "d.gguf" and "--no-draft" not in py
    assert "--no-draft" in plain and "--draft" not in plain
    for cmd in (py, plain):
        assert cmd[cmd.index("--parallel") + 1] == "16" and cmd[cmd.index("--n-ctx") + 1] == str(16 * 768)
        assert cmd[cmd.index("--threads") + 1] == "4"
    for cmd in (ls, ng):
        assert cmd[0] == "ls" and cmd[cmd.index("-np") + 1] == "16" and cmd[cmd.index("-c") + 1] == str(16 * 768)
        assert cmd[cmd.index("-t") + 1] == "4" and cmd[-1] == "-kvu"
    assert "--spec-type" not in ls and ng[ng.index("--spec-type") + 1] == "ngram-mod"
    assert "--draft" not in bs.comparison_backends("m", "", parallel=1, n_ctx=512, threads=1, llama_server="ls",
                                                   llama_specs=["none"])[0].command

    fig = bs.wave_figures([{"text": "a b c", "t_send": 0.0, "t_first": 0.5, "t_end": 2.0,
                            "usage": {"completion_tokens": 4}},
                           {"text": "", "t_send": 0.0, "t_first": None, "t_end": 1.5, "usage": None}],
                          2.0, lambda t: len(t.split()))
    assert fig["tokens"] == 3 and fig["aggregate_tok_s"] == 1.5
    assert fig["ttft_s"] == [0.5, 1.5] and fig["ttft_max_s"] == 1.5 and fig["reported_tokens"] == [4, None]


class FakeServer:
    def __init__(self, log, name):
        self.port, self.log, self.name = len(log), log, name
        log.append(("start", name))

    def stop(self):
        self.log.append(("stop", self.name))


def test_run_comparison_on_fake_servers(monkeypatch):
    """A fresh server per (repetition, clients, backend), both waves on it, the
    order changing; the cached wave sends the first wave's messages."""
    log, sent = [], []

    class FakeBackend(Backend):
        def start(self):
            return FakeServer(log, self.name)

    def fake_request(port, messages, *, max_tokens, user, raw, usage=False):
        sent.append((log[port][1], messages[0]["content"], user))
        return {"text": "x " * max_tokens, "t_send": 0.0, "t_first": 0.01, "t_end": 0.02, "usage": None}

    monkeypatch.setattr(bs, "chat_request", fake_request)
    backends = [FakeBackend(n, []) for n in (PY, PLAIN, LS)]
    rows = bs.run_comparison(backends, [f"p{i}" for i in range(25)], [1, 2], max_tokens=3, reps=2,
                             count=lambda t: len(t.split()))
    assert len(rows) == 2 * 2 * 3 * 2
    assert [e[0] for e in log] == ["start", "stop"] * 12
    orders = [tuple(r["backend"] for r in rows if r["rep"] == rep and r["clients"] == c and r["wave"] == "first")
              for rep in range(2) for c in (1, 2)]
    assert len(set(orders)) > 1, "the order of the backends changes"
    for r in rows:
        assert r["tokens"] == 3 * r["clients"] and len(r["answers"]) == r["clients"]
    for name in (PY, LS):
        mine = [(m, u) for b, m, u in sent if b == name and u != "warm-up"]
        assert len(mine) == 2 * (1 + 2) * 2
        first = [m for m, u in mine if not u.endswith("/cached")]
        cached = [m for m, u in mine if u.endswith("/cached")]
        assert sorted(first) == sorted(cached) and len(set(first)) == len(first)
    assert sorted(m for b, m, _ in sent if b == PY) == sorted(m for b, m, _ in sent if b == LS)


def test_plot_comparison(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [row(b, 0, c, w, agg=c * 10.0) for b in (PY, LS) for c in (1, 2) for w in bs.WAVES]
    out = tmp_path / "cmp.png"
    bs.plot_comparison({"summary": bs.summarize_comparison(rows), "max_tokens": 8, "threads": 2}, str(out))
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["--llama-spec", "none"], "--llama-spec does not apply without --llama-server"),
    (["--cached-same-user"], "--cached-same-user does not apply without --llama-server"),
    (["--llama-server", "{bin}", "--no-generate"], "--generate does not apply with --llama-server"),
    (["--llama-server", "{bin}", "--llama-spec", ","], "at least one --spec-type"),
    (["--multiturn", "--llama-server", "{bin}", "--clients", "2"], "--clients does not apply to --multiturn"),
    (["--conversations", "2"], "--conversations does not apply without --multiturn"),
    (["--system-tokens", "100"], "--system-tokens does not apply without --turns"),
    (["--local-user"], "--local-user does not apply without --llama-server"),
    (["--turns", "2", "--clients", "2"], "--clients does not apply to --turns"),
])
def test_bench_serve_option_errors(tmp_path, args, message):
    from click.testing import CliRunner

    from pyspec.cli import main

    fake = tmp_path / "llama-server"
    fake.write_text("")
    out = CliRunner().invoke(main, ["bench", "serve", *[a.replace("{bin}", str(fake)) for a in args]])
    assert out.exit_code == 2, out.output
    assert message in out.output


def check_waves(waves, names, clients):
    """Every backend's two waves at ``clients``: an answer per client of at most
    the 6 tokens asked (+1: a token may split), figures that are numbers."""
    assert sorted((w["backend"], w["clients"], w["wave"]) for w in waves) == sorted(
        (n, clients, w) for n in names for w in bs.WAVES)
    for w in waves:
        assert len(w["answers"]) == w["clients"] and w["aggregate_tok_s"] >= 0 and w["ttft_max_s"] > 0
        assert all(n <= 7 for n in w["answer_tokens"]), w["answer_tokens"]
        assert len(w["ttft_s"]) == w["clients"] and all(t > 0 for t in w["ttft_s"])
    assert sum(w["tokens"] for w in waves) > 0


def test_bench_serve_pyspec_backends_end_to_end(gemma_path):
    """What needs no llama-server, in CI: real `pyspec serve` processes (with
    lookup drafting, and --no-draft) on the test model, 2 clients, 6 raw tokens,
    one repetition: a fresh server per backend, both waves, figures, and the two
    backends' answers identical (greedy: the draft changes no token). The
    llama-server backends and the CLI are the test below, where a build exists."""
    from pyspec.bench.serve.process import token_counter

    count = token_counter(gemma_path)
    prompts = ["Count: one, two, three,", "The capital of France is", "def add(a, b):"]
    backends = bs.comparison_backends(gemma_path, "", parallel=2, n_ctx=2 * bs.slot_ctx(16, 6), threads=1,
                                      llama_server="unused", llama_specs=["none"])[:2]
    assert [b.name for b in backends] == [PY, PLAIN]
    waves = bs.run_comparison(backends, prompts, [2], max_tokens=6, reps=1, count=count, raw=True)
    check_waves(waves, [PY, PLAIN], 2)
    assert {w["backend"]: w["position"] for w in waves} in ({PY: 0, PLAIN: 1}, {PY: 1, PLAIN: 0})
    summary = bs.summarize_comparison(waves, count=count)
    assert summary["backends"] == [w["backend"] for w in waves][::2] and len(summary["figures"]) == 2 * 2
    assert summary["ratios"] == []  # ratios are over llama-server backends only
    (lossless,) = summary["identical"]
    assert (lossless["backend"], lossless["reference"]) == (PY, PLAIN)
    assert lossless["same"] == lossless["compared"] == 4, lossless["differences"]
    table = bs.format_comparison(summary)
    assert "4/4 identical" in table, table


@pytest.mark.skipif(not os.path.isfile(LLAMA_SERVER_BIN), reason="no llama-server (set PYSPEC_LLAMA_SERVER); "
                    "test_bench_serve_pyspec_backends_end_to_end runs the pyspec half in CI")
def test_bench_serve_llama_server_end_to_end(gemma_path, tmp_path):
    """The test model (no chat template: --raw), 2 clients, 6 tokens: every
    backend's waves (4 fresh servers), figures, ratios and answer counts in the
    JSON (more numbers of clients and repetitions only repeat this; the loops
    are tested on fake servers above)."""
    exe = shutil.which("pyspec")
    cmd = [exe] if exe else [sys.executable, "-m", "pyspec.cli"]
    out = tmp_path / "bs.json"
    run = subprocess.run([*cmd, "bench", "serve", "--llama-server", LLAMA_SERVER_BIN, "-m", gemma_path, "--draft", "",
                          "--raw", "--clients", "2", "-n", "6", "--reps", "1", "--threads", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    names = [PY, PLAIN, LS, NG]
    assert [b["name"] for b in result["backends"]] == names
    assert result["parallel"] == 2 and result["n_ctx"] == 2 * result["n_ctx_per_slot"]
    waves = result["waves"]
    check_waves(waves, names, 2)
    summary = result["summary"]
    assert len(summary["figures"]) == 4 * 2
    assert all(math.isfinite(r["ratio"]) and r["n_reps"] == 1 for r in summary["ratios"])
    lossless = summary["identical"][-1]
    assert (lossless["backend"], lossless["reference"]) == (PY, PLAIN)
    assert lossless["same"] == lossless["compared"] == 4, lossless["differences"]
    assert all(d["compared"] == 4 for d in summary["identical"])
    assert "identical" in result["table"] and "Traceback" not in run.stderr


def test_llama_server_draft_variant_gets_the_draft_model():
    from pyspec.bench.serve.process import llama_server_backends

    plain, draft = llama_server_backends("llama-server", "t.gguf", parallel=2, n_ctx=1024, threads=2,
                                         specs=["none", "draft-simple"], draft="d.gguf")
    assert "-md" not in plain.command and draft.command[-4:] == ["--spec-type", "draft-simple", "-md", "d.gguf"]
    with pytest.raises(ValueError, match="needs a draft model"):
        llama_server_backends("llama-server", "t.gguf", parallel=2, n_ctx=1024, threads=2, specs=["draft-simple"])


@pytest.mark.parametrize("resend", [False, True])
def test_conversations_in_turn_on_fake_servers(monkeypatch, resend):
    """bench serve --turns: conversations sent in turn, each request the whole
    conversation so far (answers included) or, with --resend, the first request
    again; no `user`; cached tokens read from usage (or timings); later-turn
    TTFT ratios paired by (repetition, turn)."""
    from pyspec.bench.serve import turns as bt

    log, sent, seen = [], [], set()

    class FakeBackend(Backend):
        def start(self):
            return FakeServer(log, self.name)

    def fake_stream(port, body, *, path):
        name = log[port][1]
        sent.append((name, [dict(m) for m in body["messages"]], body))
        n = sum(len(m["content"]) for m in body["messages"])
        slow = 2.0 if name == PLAIN else 1.0
        first_turn = (port, body["messages"][0]["content"]) not in seen  # this server has not seen the chat
        seen.add((port, body["messages"][0]["content"]))
        usage = {"prompt_tokens": n, "prompt_tokens_details": {"cached_tokens": 0 if first_turn else n - 5}}
        return {"text": f"answer {len(sent)}", "t_send": 0.0, "t_first": (10.0 if first_turn else 0.1) * slow,
                "t_end": 20.0, "usage": usage if name == PY else None,
                "timings": {"cache_n": 0 if first_turn else n - 5} if name == PLAIN else None}

    monkeypatch.setattr(bt, "stream_completion", fake_stream)
    systems = bt.system_prompts(2, 50, lambda t: len(t.split()))
    assert len(set(systems)) == 2 and all(len(s.split()) >= 50 for s in systems)
    rows = bt.run_turns([FakeBackend(n, []) for n in (PY, PLAIN)], systems, 3, max_tokens=4, reps=2, resend=resend)
    assert len(rows) == 2 * 2 * 3 * 2 and [e[0] for e in log] == ["start", "stop"] * 4
    assert all("user" not in body for _, _, body in sent)
    mine = [m for name, m, _ in sent if name == PY][:6]  # first repetition: A1 B1 A2 B2 A3 B3
    assert mine[0][0]["content"] == systems[0] and mine[1][0]["content"] == systems[1]
    if resend:
        assert mine[2] == mine[0] and mine[4] == mine[0] and mine[3] == mine[1]
    else:
        assert mine[2][:2] == mine[0] and mine[2][2]["role"] == "assistant" and len(mine[4]) == 6
    assert all(r["cached"] == (0 if r["round"] == 0 else r["prompt_tokens"] - 5) for r in rows if r["backend"] == PY)
    assert all(r["cached"] is not None for r in rows if r["backend"] == PLAIN)
    summary = bt.summarize_turns(rows)
    (ratio,) = summary["ratios"]
    assert (ratio["numerator"], ratio["denominator"]) == (PY, PLAIN) and ratio["n"] == 8
    assert ratio["ratio"] == pytest.approx(0.5) and ratio["low"] == pytest.approx(0.5)
    fig = {f["backend"]: f for f in summary["figures"]}
    assert fig[PY]["first_ttft_s"] == 10.0 and fig[PLAIN]["later_ttft_s"] == pytest.approx(0.2)
    assert "conversations in turn" in bt.format_turns(summary, 2, 3, 50, resend)
