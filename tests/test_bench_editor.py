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
from pyspec.bench.serve import editor_sites as es
from pyspec.bench.serve.process import Backend


def test_sites_are_deterministic_for_a_seed():
    a, b = es.sites(5, seed=3), es.sites(5, seed=3)
    assert a == b and len(a) == 5
    assert es.sites(5, seed=4) != a
    assert len({(s.file, s.line_no) for s in es.sites(12, seed=0)}) == 12  # no site twice
    assert len({s.file for s in a}) == 5  # spread over files


def test_sites_are_lines_of_function_bodies():
    for s in es.sites(8, seed=1, prefix_lines=10, suffix_lines=3):
        with open(os.path.join(es.stdlib_dir(), s.file), encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        assert lines[s.line_no - 1] == s.line
        assert s.before == tuple(lines[s.line_no - 11:s.line_no - 1]) and s.after == tuple(lines[s.line_no:
                                                                                                 s.line_no + 3])
        assert s.indent > 0 and len(s.line.strip()) >= es.MIN_CHARS
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
    assert es.candidates(source) == [5, 8, 9, 13]


def test_fresh_sites_are_any_statements_first_line_typed_from_its_indentation():
    source = "\n".join([
        "TOP_LEVEL = 1",                      # 1: module level, 8+ characters
        "def f(a, b):",                       # 2: a def line
        "    '''A docstring line.'''",        # 3: no
        "    total = 1",                      # 4: short, but 8+ characters after all
        "    spread = call(a,",               # 5: a statement's first line
        "                  b)",               # 6: its second line: no
        "    x = 1",                          # 7: under 8 characters: no
    ])
    assert es.candidates(source, fresh=True) == [1, 2, 4, 5]
    assert es.candidates(source) == []  # the default sites: 20+ characters, single-line, in a body
    s = es.Site("x.py", 1, "    " + "x" * 20, (), (), fresh=True)
    assert es.cuts(s, 4) == [4, 9, 14, 19, 24]  # the bare indentation first
    fresh = es.sites(6, seed=0, fresh=True)
    assert all(x.fresh for x in fresh) and es.site_requests(fresh[0], 3)[0]["body"]["prompt"].strip() == ""


@pytest.mark.parametrize("content, rest, whole", [
    ("foo(a, b)", "foo(a, b)", True),
    ("foo(a, b)\n", "foo(a, b)", True),                   # trailing whitespace aside
    ("foo(a, b)\n    return x", "foo(a, b)", False),      # runs on into lines that are already there
    ("foo(", "foo(a, b)", False),                          # right, but not whole
    ("", "", True),                                        # at the line's end: nothing
])
def test_whole_rule(content, rest, whole):
    assert es.is_whole(content, rest) is whole


def test_typed_steps_only_append_and_the_prefetch_follows_the_line():
    site = es.sites(1, seed=2)[0]
    reqs = es.site_requests(site, 4, n_predict=16)
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
    sampled = es.site_requests(site, 2, temperature=None)[0]["body"]
    assert "temperature" not in sampled and sampled["samplers"] == ["top_k", "top_p", "infill"]
    assert (sampled["top_k"], sampled["top_p"]) == (40, 0.90)


def test_cuts_spread_over_the_line():
    s = es.Site("x.py", 1, "    " + "x" * 20, (), ())
    assert es.cuts(s, 4) == [9, 14, 19, 24]
    assert es.cuts(s, 1) == [24]
    assert es.cuts(es.Site("x.py", 1, "  ab", (), ()), 4) == [3, 4]  # no empty step


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
    assert es.is_right(content, rest) is right


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
    sites = es.sites(4, seed=0)
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
    (["--workload", "edits", "--plot", "x.png"], "--plot draws the typing workload"),
    (["--workload", "edits", "--edit-lines", "150-60"], "give MIN-MAX lines"),
    (["--workload", "sideways"], "'sideways' is not one of"),
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


# --- the edits workload (pyspec/bench/serve/editor_edits.py) ---

from pyspec.bench.serve import editor_edits as ee  # noqa: E402


def test_edits_are_deterministic_renames_of_windows():
    a = ee.edits(6, seed=0)
    assert a == ee.edits(6, seed=0) and len(a) == 6
    assert ee.edits(6, seed=1) != a
    spans = {}
    for e in a:
        with open(os.path.join(es.stdlib_dir(), e.file), encoding="utf-8") as f:
            lines = f.read().split("\n")
        assert 60 <= e.n_lines <= 150
        assert e.original == "".join(x + "\n" for x in lines[e.start - 1:e.start - 1 + e.n_lines])
        assert e.original.startswith(("def ", "async def ", "class ", "@"))
        assert e.new == e.old + "_renamed" and len(e.old) >= 3
        # The rename changes every occurrence of the word, and there are several.
        assert e.uses >= 2 and e.uses == len(ee._word(e.old).findall(e.original))
        assert e.expected.count(e.new) == e.uses and not ee._word(e.old).search(e.expected)
        assert e.expected.replace(e.new, e.old) == e.original
        spans.setdefault(e.file, []).append((e.start, e.start + e.n_lines - 1))
    for ranges in spans.values():  # a file's windows do not overlap
        ranges.sort()
        assert all(b[0] > a[1] for a, b in zip(ranges, ranges[1:]))
    exact = ee.edits(3, seed=0, lines=(60, 60))
    assert [e.n_lines for e in exact] == [60, 60, 60]


SOURCE = """def f(alpha, beta, xy):
    gamma = alpha + beta
    gamma += alpha
    print("beta is", beta, xy, xy, xy)
    obj.delta = gamma
    delta = 1
    delta += delta
    call(alpha=1)
    epsilon = 2
    epsilon += epsilon
    return gamma

def g(self):
    return epsilon + self.x + self.x + self + self

def h(zeta):
    global omega
    omega = zeta + zeta + zeta
"""


def test_identifiers_are_locals_that_nothing_else_spells():
    """alpha: a keyword argument spells it; beta: a string; xy: too short;
    delta: an attribute; self: never; omega: a global; epsilon: g reads the
    module's, unless g is outside the window."""
    src = ee._source("x.py", SOURCE)
    assert ee.identifiers(src, 1, 18) == [("gamma", 4), ("zeta", 4)]
    assert ee.identifiers(src, 1, 11) == [("epsilon", 3), ("gamma", 4)]
    assert ee.identifiers(src, 1, 10) == []  # f is not entirely in the window


def test_window_ends():
    text = "".join(["def a():\n" + "    x = 1\n" * 29,   # lines 1-30
                    "def b():\n" + "    y = 2\n" * 39,   # lines 31-70
                    "def c():\n" + "    z = 3\n" * 179])  # lines 71-250
    src = ee._source("x.py", text)
    assert [(s, e) for s, e, _ in src.tops] == [(1, 30), (31, 70), (71, 250)]
    assert ee.window_end(src, 1, 60, 150) == 70    # the last top-level statement that fits
    assert ee.window_end(src, 71, 60, 150) == 220  # none fits: the last statement end within the limit
    assert ee.window_end(src, 1, 60, 60) == 60
    assert ee.window_end(src, 200, 60, 150) is None


def test_rename_and_matches():
    assert ee.rename("day day1 xday day_ .day day(", "day", "d2") == "d2 day1 xday day_ .d2 d2("
    want = "def f(a):\n    return a\n"
    assert ee.matches("```python\n" + want + "```", want) and ee.matches(want + "\n\n", want)
    assert ee.matches("  ```\n" + want + "```\n", want)
    assert not ee.matches("Here it is:\n```python\n" + want + "```", want)
    assert not ee.matches(want.replace("a", "b"), want)


def test_edit_requests():
    e = ee.Edit("x.py", 1, "def f(abc):\n    return abc + abc\n", "abc", "abc_renamed", 3)
    plain, default, predicted, llama = ee.variants("pyspec", ["llama-server ngram-mod"])
    assert [v.name for v in (plain, default, predicted, llama)] == [
        "pyspec plain", "pyspec default", "pyspec prediction", "llama-server ngram-mod"]
    assert ee.max_tokens(e) == int(len(e.original) // 3 * 1.3) + 32 and ee.max_tokens(e, 10) == 10
    b = ee.body(e, predicted, cap=20)
    assert b["prediction"] == {"type": "content", "content": e.original} and b["max_tokens"] == 20
    assert b["temperature"] == 0 and "draft_max" not in b and b["user"] == "bench-editor pyspec prediction"
    assert b["messages"] == [{"role": "system", "content": ee.SYSTEM},
                             {"role": "user", "content": "Rename `abc` to `abc_renamed` in this file:\n```python\n"
                                                         "def f(abc):\n    return abc + abc\n```"}]
    assert ee.body(e, plain)["draft_max"] == 0 and "prediction" not in ee.body(e, plain)
    assert ee.body(e, default) == {**ee.body(e), "user": "bench-editor pyspec default"}
    assert ee.body(e, llama) == ee.body(e) and "user" not in ee.body(e)
    assert ee.variants(None, ["llama-server"]) == [ee.Variant("llama-server", "llama-server")]


def test_edits_run_and_report_on_fake_servers():
    """Per edit e (0-based), decode takes 1000, 500, 250 and 2000 ms x (e + 1)
    for pyspec plain, default, prediction and llama-server, request time
    the same in seconds / 1000 + 0.1: the decode ratios are exactly 0.5,
    0.25 and 2; every server's cache is primed before an edit's variants."""
    edits = [ee.Edit("x.py", 1, f"def f(abc{i}):\n    return abc{i} + abc{i}\n", f"abc{i}", f"abc{i}_renamed", 3)
             for i in range(4)]
    ms = {"pyspec plain": 1000, "pyspec default": 500, "pyspec prediction": 250, "llama-server": 2000}
    sent = []

    def send(port, body):
        text = body["messages"][-1]["content"]
        if text == "Say hi.":
            sent.append((port, "warm-up", None))
            return 0.01, {"choices": [{"message": {"content": "hi"}}]}
        i = next(i for i, e in enumerate(edits) if f"`{e.old}`" in text)
        if body["max_tokens"] == 1:
            assert body.get("user") == ("bench-editor prime" if port == 1 else None)
            sent.append((port, "prime", i))
            return 0.5, {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]}
        name = ("llama-server" if port == 2 else "pyspec plain" if "draft_max" in body else
                "pyspec prediction" if "prediction" in body else "pyspec default")
        sent.append((port, name, i))
        assert body.get("user") == (None if port == 2 else f"bench-editor {name}")
        t = ms[name] * (i + 1)
        resp = {"choices": [{"message": {"content": "```python\n" + edits[i].expected + "```"
                                         if name == "pyspec prediction" else edits[i].original},
                             "finish_reason": "length" if port == 2 else "stop"}],
                "usage": {"completion_tokens": 100},
                "timings": {"predicted_n": 100, "predicted_ms": float(t), "prompt_n": 3, "draft_n": 10,
                            "draft_n_accepted": 5}}
        if "prediction" in body:
            resp["usage"]["completion_tokens_details"] = {"accepted_prediction_tokens": 7,
                                                          "rejected_prediction_tokens": 2}
        return t / 1000 + 0.1, resp

    servers = [("pyspec", FakeBackend("pyspec", ["1"])), ("llama-server", FakeBackend("llama-server", ["2"]))]
    variants = ee.variants("pyspec", ["llama-server"])
    progress = []
    records = ee.run(servers, variants, edits, cap=64, progress=progress.append, send=send)
    assert sent[:2] == [(1, "warm-up", None), (2, "warm-up", None)]
    for i in range(4):
        mine = [s for s in sent if s[2] == i]
        assert mine[:2] == [(1, "prime", i), (2, "prime", i)]
        assert [s[1] for s in mine[2:]] == [v.name for v in be.run_order(variants, i)]
    assert len(records) == 16 and len([p for p in progress if p.startswith("edit ")]) == 4
    summary = ee.summarize(records, [v.name for v in variants])
    assert summary["baseline"] == "pyspec plain"
    figs = {f["variant"]: f for f in summary["figures"]}
    for name, want in (("pyspec plain", 1), ("pyspec default", 0.5), ("pyspec prediction", 0.25),
                       ("llama-server", 2)):
        f = figs[name]
        assert f["decode_ratio"]["ratio"] == pytest.approx(want) and f["decode_ratio"]["pairs"] == 4
        assert f["decode_ratio"]["interval"] == pytest.approx((want, want))
        lo, hi = f["request_ratio"]["interval"]
        assert lo <= f["request_ratio"]["ratio"] <= hi
        assert f["decode_s"] == pytest.approx(ms[name] * 10 / 1000)
        assert f["decode_tok_s"] == pytest.approx(400 / (ms[name] * 10 / 1000))
        assert f["request_s"] == pytest.approx(ms[name] * 10 / 1000 + 0.4)
        assert (f["draft_n"], f["draft_n_accepted"]) == (40, 20)
    assert (figs["pyspec prediction"]["accepted_prediction_tokens"],
            figs["pyspec prediction"]["rejected_prediction_tokens"]) == (28, 8)
    assert figs["pyspec plain"]["accepted_prediction_tokens"] is None
    assert figs["pyspec prediction"]["matches"] == 4 and figs["pyspec default"]["matches"] == 0
    assert figs["llama-server"]["truncated"] == 4 and figs["pyspec plain"]["truncated"] == 0
    table = ee.format_summary(summary)
    assert "0.25x [0.25, 0.25]" in table and "28/8" in table and "over pyspec plain's" in table


def test_edit_ratio_leaves_out_missing_and_empty_pairs():
    recs = [{"edit": 0, "variant": "a", "t": 2.0}, {"edit": 0, "variant": "b", "t": 1.0},
            {"edit": 1, "variant": "a", "t": 0.0}, {"edit": 1, "variant": "b", "t": 1.0},
            {"edit": 2, "variant": "a", "t": 8.0}, {"edit": 2, "variant": "b", "t": 2.0},
            {"edit": 3, "variant": "a", "t": 5.0}]
    r = ee.ratio(recs, "a", "b", "t")
    assert r["pairs"] == 2 and r["ratio"] == pytest.approx((2 * 4) ** 0.5)
    assert 2 <= r["interval"][0] <= r["interval"][1] <= 4
    assert ee.ratio(recs, "a", "c", "t")["pairs"] == 0


def test_edit_servers_and_lines_option():
    import click

    from pyspec.cli.bench_editor import edit_servers, line_range

    bs = [be.EditorBackend("pyspec", Backend("pyspec", ["1"]), {"layout": "still"}),
          be.EditorBackend("pyspec layout=llama-server", Backend("pyspec", ["2"]), {"layout": "llama-server"}),
          be.EditorBackend("llama-server ngram-mod", Backend("llama-server", ["3"]))]
    servers, variants = edit_servers(bs)
    assert servers == [("pyspec", bs[0].server), ("llama-server ngram-mod", bs[2].server)]
    assert [v.name for v in variants] == ["pyspec plain", "pyspec default", "pyspec prediction",
                                          "llama-server ngram-mod"]
    assert [v.server for v in variants] == ["pyspec"] * 3 + ["llama-server ngram-mod"]
    assert line_range("60-150") == (60, 150) and line_range("60") == (60, 60)
    for bad in ("150-60", "0-5", "x"):
        with pytest.raises(click.BadParameter):
            line_range(bad)


def test_bench_editor_edits_end_to_end(draft_path):
    """The edits workload against a real `pyspec serve --no-draft` on the
    0.5B coder model: one 60-line file, 48 tokens at most per answer, the
    three pyspec variants, as one JSON object on stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPEC_LLAMA_SERVER"}
    run = subprocess.run([sys.executable, "-m", "pyspec.cli", "bench", "editor", "--workload", "edits", "--edits", "1",
                          "--edit-lines", "60", "--edit-max-tokens", "48", "-m", draft_path, "--no-draft", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir(), env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "edit 1/1" in run.stderr and "llama-server: skipped" in run.stderr
    result = json.loads(run.stdout)
    assert result["workload"] == "edits" and "requests" not in result and "sites" not in result
    edits = result["edits"]
    assert [v["name"] for v in edits["variants"]] == ["pyspec plain", "pyspec default", "pyspec prediction"]
    (edit,) = edits["edits"]
    assert edit["lines"] == 60 and edit["uses"] >= 2 and edit["max_tokens"] == 48
    reqs = edits["requests"]
    assert sorted(r["variant"] for r in reqs) == ["pyspec default", "pyspec plain", "pyspec prediction"]
    for r in reqs:
        assert r["latency_s"] > 0 and r["content"] and isinstance(r["match"], bool)
        assert 0 < r["predicted_n"] <= 48 and r["predicted_ms"] > 0 and r["completion_tokens"] == r["predicted_n"]
        assert r["prompt_n"] >= 1
        assert (r["accepted_prediction_tokens"] is None) is (r["variant"] != "pyspec prediction")
    pred = next(r for r in reqs if r["variant"] == "pyspec prediction")
    assert pred["accepted_prediction_tokens"] + pred["rejected_prediction_tokens"] > 100  # the whole window
    figs = {f["variant"]: f for f in edits["summary"]["figures"]}
    assert edits["summary"]["baseline"] == "pyspec plain" and figs["pyspec plain"]["decode_ratio"]["ratio"] == 1
    for f in figs.values():
        assert f["edits"] == 1 and f["request_s"] > 0 and f["decode_tok_s"] > 0
        assert f["decode_ratio"]["pairs"] == 1 and f["request_ratio"]["ratio"] > 0
    assert "pyspec prediction" in edits["table"] and result["table"] == edits["table"]
