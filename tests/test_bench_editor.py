"""`pyspec bench editor`: the workload (deterministic, sites inside functions,
keystrokes that only append), the "right" rule, the figures and ratios on fake
servers, option checks, and one end-to-end run of the CLI against a real
`pyspec serve` on the small coder model (the test model has no FIM tokens)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile

import pytest

from pyspec.bench.serve import editor as be
from pyspec.bench.serve.process import Backend


def test_sites_are_deterministic_for_a_seed():
    a, b = be.sites(5, seed=3), be.sites(5, seed=3)
    assert a == b and len(a) == 5
    assert be.sites(5, seed=4) != a
    assert len({(s.file, s.line_no) for s in be.sites(12, seed=0)}) == 12  # no site twice
    assert len({s.file for s in a}) == 5  # spread over files


def test_sites_are_lines_of_function_bodies():
    for s in be.sites(8, seed=1, prefix_lines=10, suffix_lines=3):
        with open(os.path.join(be.stdlib_dir(), s.file), encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        assert lines[s.line_no - 1] == s.line
        assert s.before == tuple(lines[s.line_no - 11:s.line_no - 1]) and s.after == tuple(lines[s.line_no:
                                                                                                 s.line_no + 3])
        assert s.indent > 0 and len(s.line.strip()) >= be.MIN_CHARS
        inside = [fn for fn in ast.walk(ast.parse(text)) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and fn.body[0].lineno <= s.line_no <= fn.end_lineno]
        assert inside, (s.file, s.line_no, s.line)


def test_candidates_leave_out_docstrings_module_code_and_long_statements():
    source = '\n'.join([
        "TOP_LEVEL_NAME = 'a module-level line long enough'",
        "def f(a, b):",
        "    '''A docstring line that is long enough to count.'''",
        "    short = 1",
        "    result = some_function(a, b) + other(a)",
        "    spread = call(a,",
        "                  b, 'over two lines, long enough')",
        "    if a: return 'a one-line body after a colon'",
        "    return result + spread + short",
        "class C:",
        "    attribute_of_a_class = 'long enough but no function'",
        "    def m(self):",
        "        return self.attribute_of_a_class",
    ])
    assert be.candidates(source) == [5, 8, 9, 13]


def test_typed_steps_only_append_and_the_prefetch_follows_the_line():
    site = be.sites(1, seed=2)[0]
    reqs = be.site_requests(site, 4, n_predict=16)
    typed, (prefetch,) = reqs[:-1], reqs[-1:]
    assert [r["kind"] for r in typed] == ["typed"] * 4 and prefetch["kind"] == "prefetch"
    prompts = [r["body"]["prompt"] for r in typed]
    for p, q in zip(prompts, prompts[1:]):
        assert len(p) < len(q) and q.startswith(p)
    assert prompts[-1] == site.line and prompts[0].strip()
    for r in typed:
        body = r["body"]
        assert body["input_prefix"] == "".join(x + "\n" for x in site.before)
        assert body["input_suffix"] == "\n" + "".join(x + "\n" for x in site.after)
        assert body["n_indent"] == site.indent and body["t_max_predict_ms"] == 250 and body["n_predict"] == 16
        assert r["rest"] == site.line[len(body["prompt"]):]
        assert body["id_slot"] == 0 and body["cache_prompt"] is True and body["input_extra"] == []
        assert body["samplers"] == ["top_k", "top_p", "infill", "temperature"] and body["temperature"] == 0
    body = prefetch["body"]
    assert body["input_prefix"].endswith("\n" + site.line + "\n") and body["prompt"] == ""
    assert body["input_suffix"] == typed[0]["body"]["input_suffix"]
    assert body["t_max_predict_ms"] == 1000 and body["n_indent"] == 0 and prefetch["rest"] is None
    # The plugin's own sampling, untouched, when no temperature is sent.
    sampled = be.site_requests(site, 2, temperature=None)[0]["body"]
    assert "temperature" not in sampled and sampled["samplers"] == ["top_k", "top_p", "infill"]
    assert (sampled["top_k"], sampled["top_p"]) == (40, 0.90)


def test_cuts_spread_over_the_line():
    s = be.Site("x.py", 1, "    " + "x" * 20, (), ())
    assert be.cuts(s, 4) == [9, 14, 19, 24]
    assert be.cuts(s, 1) == [24]
    assert be.cuts(be.Site("x.py", 1, "  ab", (), ()), 4) == [3, 4]  # no empty step


@pytest.mark.parametrize("content, rest, right", [
    ("foo(a, b)\n    return x", "foo(a, b)", True),       # the whole rest, then more lines
    ("foo(", "foo(a, b)", True),                           # a prefix of it
    ("bar(a, b)", "foo(a, b)", False),                     # something else
    ("foo(a, b) + 1", "foo(a, b)", False),                 # more than the line holds
    ("", "foo(a, b)", False),                              # nothing, where something follows
    ("\n    return x", "foo", False),                      # an empty first line
    ("\n    return x", "", True),                          # at the line's end: nothing more on it
    ("x", "", False),
])
def test_right_rule(content, rest, right):
    assert be.is_right(content, rest) is right


def test_tokens_within_a_budget():
    assert be.within(10, 200.0, 250) == 10
    assert be.within(20, 500.0, 250) == pytest.approx(10)
    assert be.within(0, 0.0, 250) == 0


def test_response_fields_nested_or_flat():
    assert be._get({"timings": {"prompt_n": 7}}, "timings/prompt_n") == 7
    assert be._get({"timings/prompt_n": 8}, "timings/prompt_n") == 8
    assert be._get({}, "timings/prompt_n") is None and be._get({"content": "x"}, "content") == "x"


class FakeServer:
    def __init__(self, port):
        self.port, self.stopped = port, False

    def stop(self):
        self.stopped = True


class FakeBackend(Backend):
    def start(self):
        return FakeServer(int(self.command[0]))


def test_run_and_summary_on_fake_servers():
    """Backend 2 answers every request three times slower than backend 1 and
    sites cost differently: the paired p50 ratio is exactly 1/3; sites are
    interleaved (AB BA BA AB); backend 1's suggestions are right, 2's not."""
    sent, servers = [], []
    names = ["one", "two"]
    backends = [be.EditorBackend(n, FakeBackend(n, [str(i + 1)]), {"layout": "still"} if i == 0 else {})
                for i, n in enumerate(names)]
    sites = be.sites(4, seed=0)
    wanted = {}

    def send(port, body):
        sent.append((port, body))
        if body["prompt"] == be.WARM_UP["prompt"]:
            return 0.01, {"content": ""}
        site = next(i for i, s in enumerate(sites) if body["input_suffix"] == "\n" + "".join(x + "\n" for x in
                                                                                          s.after))
        rest = sites[site].line[len(body["prompt"]):] if body["prompt"] else "x"
        wanted.setdefault(port, []).append(site)
        return (0.1 * (site + 1) * (1 if port == 1 else 3), {"content": rest if port == 1 else "?" + rest,
                                          "timings/prompt_n": 5 * port, "timings/predicted_n": 20,
                                          "timings/predicted_ms": 500.0})

    orig = FakeBackend.start

    def start(self):
        s = orig(self)
        servers.append(s)
        return s

    FakeBackend.start = start
    try:
        records = be.run(backends, sites, steps=3, send=send)
    finally:
        FakeBackend.start = orig
    assert all(s.stopped for s in servers) and len(servers) == 2
    assert len(records) == 2 * 4 * (3 + 1)
    order = [r["backend"] for r in records if r["step"] == 0]
    assert order == ["one", "two", "two", "one", "two", "one", "one", "two"]
    assert all(b.get("layout") == "still" for p, b in sent if p == 1) and not any("layout" in b for p, b in sent
                                                                                   if p == 2)
    summary = be.summarize(records)
    figs = {(f["backend"], f["kind"]): f for f in summary["figures"]}
    assert figs[("one", "typed")]["right"] == 12 and figs[("two", "typed")]["right"] == 0
    assert figs[("one", "typed")]["prompt_n_mean"] == 5 and figs[("two", "prefetch")]["prompt_n_mean"] == 10
    assert figs[("one", "typed")]["tokens_250ms_mean"] == pytest.approx(10)
    assert figs[("one", "typed")]["tokens_1000ms_mean"] == pytest.approx(20)
    lo, hi = figs[("one", "typed")]["latency_p50_interval"]
    assert 0.1 <= lo <= figs[("one", "typed")]["latency_p50_s"] <= hi <= 0.4
    (typed, prefetch) = summary["ratios"]
    assert (typed["numerator"], typed["denominator"], typed["kind"]) == ("one", "two", "typed")
    assert typed["ratio"] == pytest.approx(1 / 3) and typed["pairs"] == 12 and typed["sites"] == 4
    assert typed["interval"] == pytest.approx((1 / 3, 1 / 3))
    assert prefetch["kind"] == "prefetch" and prefetch["ratio"] == pytest.approx(1 / 3) and prefetch["pairs"] == 4
    table = be.format_summary(summary)
    assert "one / two" in table and "0.33x" in table and "12/12 (100%)" in table


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    recs = [{"backend": b, "kind": k, "latency_s": 0.1 * i} for b in ("a", "b") for k in be.KINDS for i in range(5)]
    out = tmp_path / "editor.png"
    be.plot({"summary": {"backends": ["a", "b"]}, "requests": recs, "sites": [1], "steps": 4}, str(out))
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["--layouts", "still,sideways"], "give some of still, llama-server"),
    (["--temperature", "0.5"], "--temperature goes with --sampled"),
    (["--llama-variant", "plain="], "--llama-variant needs --llama-server"),
])
def test_bench_editor_option_errors(args, message, monkeypatch):
    from click.testing import CliRunner

    from pyspec.cli import main

    monkeypatch.delenv("PYSPEC_LLAMA_SERVER", raising=False)
    out = CliRunner().invoke(main, ["bench", "editor", *args])
    assert out.exit_code == 2, out.output
    assert message in out.output


def test_llama_variants():
    from pyspec.cli.bench_editor import llama_variants

    assert llama_variants(["plain=", "draft=-md {draft} -ngld 0"], "d.gguf", "unused") == [
        ("plain", []), ("draft", ["-md", "d.gguf", "-ngld", "0"])]
    import click

    with pytest.raises(click.BadParameter, match="needs a draft model"):
        llama_variants(["draft=-md {draft}"], "", "unused")
    with pytest.raises(click.BadParameter, match="NAME=ARGS"):
        llama_variants(["plain"], "", "unused")


def test_bench_editor_end_to_end(draft_path):
    """The CLI against a real `pyspec serve --no-draft` on the 0.5B coder
    model: one site, two typed steps and the prefetch, as one JSON object on
    stdout, with a progress line per site on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPEC_LLAMA_SERVER"}
    run = subprocess.run([sys.executable, "-m", "pyspec.cli", "bench", "editor", "--sites", "1", "--steps", "2",
                          "-m", draft_path, "--no-draft", "--json"], capture_output=True, text=True, timeout=300,
                         cwd=tempfile.gettempdir(), env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "site 1/1" in run.stderr and "llama-server: skipped" in run.stderr
    result = json.loads(run.stdout)
    assert [b["name"] for b in result["backends"]] == ["pyspec"] and result["draft"] is None
    assert len(result["sites"]) == 1 and result["steps"] == 2 and result["temperature"] == 0
    reqs = result["requests"]
    assert [(r["kind"], r["step"]) for r in reqs] == [("typed", 0), ("typed", 1), ("prefetch", 2)]
    for r in reqs:
        assert r["latency_s"] > 0 and isinstance(r["content"], str)
        assert r["prompt_n"] >= 1 and r["predicted_n"] >= 0 and r["predicted_ms"] >= 0
        assert r["tokens_1000ms"] >= r["tokens_250ms"] >= 0
    assert reqs[0]["prompt_n"] > 100  # a new site: its whole prompt
    assert all(isinstance(r["right"], bool) for r in reqs[:2]) and reqs[2]["right"] is None
    summary = result["summary"]
    assert summary["backends"] == ["pyspec"] and summary["ratios"] == []
    figs = {f["kind"]: f for f in summary["figures"]}
    assert figs["typed"]["n"] == 2 and figs["prefetch"]["n"] == 1
    assert figs["typed"]["latency_p50_s"] > 0 and figs["typed"]["latency_p90_s"] >= figs["typed"]["latency_p50_s"]
    assert "p50 latency" in result["table"]
