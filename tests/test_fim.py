"""Fill-in-the-middle prompts (pyspec/fim.py), the editor's stop rules, FIM
through the Python API, and the prediction counts (pyspec/prediction.py).

The FIM model is the catalog's draft, Qwen2.5-Coder-0.5B (it has the FIM
tokens; the test model, Gemma, has none). The ``llama-server`` layout is
checked against llama.cpp's format_prompt_infill as its source lays the tokens
out (each piece tokenized alone, the budgets of n_batch, the extra context's
header and file separators), written out here token by token.
"""

from __future__ import annotations

import json

import pytest

import pyspec
from pyspec import fim, prediction

PREFIX = "import os\n\n\ndef read(path):\n"
SUFFIX = "\n\n\ndef write(path, text):\n    pass\n"


@pytest.fixture(scope="module")
def coder(draft_path, load_model):
    return load_model(draft_path, n_ctx=2048)


def tok(model, text):
    return model.tokenize(text, add_special=False)


def test_the_tokens_are_the_models(coder, gemma_path, load_model):
    t = fim.FimTokens.of(coder)
    assert [coder.detokenize([x], special=True) for x in (t.pre, t.suf, t.mid, t.rep, t.sep)] == [
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]
    with pytest.raises(fim.FimUnsupported, match="prefix token is missing. suffix token is missing."):
        fim.build(load_model(gemma_path, n_ctx=256), "a", "b")


def test_llama_server_layout_token_by_token(coder):
    t = fim.FimTokens.of(coder)
    extra = [fim.Chunk("x = 1\n", "a.py"), fim.Chunk("y = 2\n")]
    got = fim.build(coder, PREFIX, SUFFIX, typed="    with open(", extra=extra, layout="llama-server", n_batch=64)
    want_extra = ([t.rep] + tok(coder, "myproject\n") + [t.sep] + tok(coder, "a.py\n") + tok(coder, "x = 1\n")
                  + [t.sep] + tok(coder, "tmp\n") + tok(coder, "y = 2\n") + [t.sep] + tok(coder, "filename\n"))
    typed = tok(coder, "    with open(")
    pre, suf = tok(coder, PREFIX), tok(coder, SUFFIX)
    pre = pre[-min(len(pre), 3 * (64 // 4)):]
    suf = suf[:max(0, 64 // 4 - 2 - len(typed))]
    assert got.tokens == want_extra + [t.pre] + pre + typed + [t.suf] + suf + [t.mid]
    assert got.heal == "" and got.n_extra == len(want_extra)


def test_the_still_layout_only_appends_while_the_user_types(coder):
    line = "    with open(path) as f:"
    before = None
    for cut in range(6, len(line) + 1, 3):
        p = fim.build(coder, PREFIX, SUFFIX, typed=line[:cut], n_batch=64)
        t = fim.FimTokens.of(coder)
        head = p.tokens[:p.tokens.index(t.mid) + 1]
        if before is not None:
            assert head == before, "a keystroke changed the prefix or suffix tokens"
        before = head
    # Control: llama-server's layout charges the typed text to the suffix and puts it before SUF.
    a = fim.build(coder, PREFIX, SUFFIX, typed=line[:6], n_batch=64, layout="llama-server")
    b = fim.build(coder, PREFIX, SUFFIX, typed=line, n_batch=64, layout="llama-server")
    n_same = next(i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y)
    assert n_same < a.tokens.index(fim.FimTokens.of(coder).suf)


def test_healing_takes_back_a_half_typed_word(coder):
    p = fim.build(coder, PREFIX, SUFFIX, typed="    ret")
    assert p.heal == " ret" and p.constraint() is not None
    assert p.visible(" return x") == "urn x"
    assert fim.build(coder, PREFIX, SUFFIX, typed="    ret", healing=False).heal == ""


@pytest.mark.parametrize("typed, heal", [
    ("    x = ", " "),                 # a trailing space: " 1" is one token
    ("    ", "    "),                 # a bare indentation: "   " + " return" in the model's text
    ("    retur", " retur"),          # a word split as no finished text is (" ret" + "ur"): all of it
    ("    os.path.jo", ".jo"),        # a word with the character before it
    ("    open(", "("),               # punctuation: "(" goes on as "(path"
    ("    if x:\n        ", "        "),  # never across a line break
])
def test_healing_ends_the_prompt_where_the_tokenizer_would_cut(coder, typed, heal):
    """The typed text's last piece is taken back whole (fim.heal), so that the
    prompt ends at a cut of the finished text's tokens; the kept tokens and the
    taken text make up the typed text again."""
    p = fim.build(coder, PREFIX, SUFFIX, typed=typed)
    assert p.heal == heal
    plain = fim.build(coder, PREFIX, SUFFIX, typed=typed, healing=False)
    assert coder.detokenize(p.tokens[-8:]) + heal == coder.detokenize(plain.tokens[-8 - (len(plain.tokens)
                                                                                          - len(p.tokens)):])


def test_healing_writes_a_fresh_line_and_a_split_word_as_the_model_would(coder):
    """Where the cursor ends a prompt in the middle of the model's tokens, the
    healed answer is the line; without healing (the control) it is not."""
    prefix = PREFIX + "    with open(path) as f:\n"
    healed = coder.infill(prefix + "        ", SUFFIX, max_tokens=6, temperature=0)
    plain = coder.infill(prefix + "        ", SUFFIX, max_tokens=6, temperature=0, healing=False)
    assert healed.text.startswith("return f.read()"), healed.text
    assert not plain.text.startswith("return"), plain.text
    out = coder.infill(PREFIX + "    ret", SUFFIX, max_tokens=8, temperature=0)
    assert not out.text.startswith(" ret") and out.text.startswith("urn"), out.text


def test_healing_is_switched_off_by_a_keyword(coder):
    healed = coder.generate(PREFIX + "    ret", suffix=SUFFIX, max_tokens=2, temperature=0)
    plain = coder.generate(PREFIX + "    ret", suffix=SUFFIX, max_tokens=2, temperature=0, healing=False)
    # Off, the typed last token stays in the prompt and nothing constrains the answer.
    assert plain.n_prompt_tokens == healed.n_prompt_tokens + 1
    assert coder.infill(PREFIX + "    ret", SUFFIX, max_tokens=2, temperature=0, healing=False).tokens == plain.tokens
    with pytest.raises(ValueError, match="healing=False"):
        coder.generate(PREFIX + "    ret", suffix=SUFFIX, max_tokens=2, healing=True, regex="[a-z]+")
    with pytest.raises(TypeError, match="fill-in-the-middle"):
        coder.generate("def f():", chat=False, max_tokens=2, healing=False)


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_an_answer_cut_inside_the_healed_text_shows_nothing_whole_or_streamed(coder, max_tokens):
    """The healed text is " ret"; biases make the answer " r" then "e": cut
    after one or two tokens it ends inside the typed text, which neither the
    result nor the stream shows again (they once disagreed: the result
    repeated the typed characters)."""
    r, e = (tok(coder, t) for t in (" r", "e"))
    assert len(r) == len(e) == 1
    pieces = []
    out = coder.generate(PREFIX + "    ret", suffix=SUFFIX, max_tokens=max_tokens, temperature=0,
                         logit_bias={r[0]: 30.0, e[0]: 30.0}, on_text=pieces.append)
    assert coder.detokenize(out.tokens) == " re"[:1 + max_tokens], "the biases did not cut inside the healed text"
    assert out.text == "".join(pieces) == ""
    # Past the healed text, both show the same remainder.
    more = []
    longer = coder.generate(PREFIX + "    ret", suffix=SUFFIX, max_tokens=4, temperature=0, on_text=more.append)
    assert longer.text == "".join(more) and coder.detokenize(longer.tokens).startswith(" ret")


def test_suffix_in_generate_and_infill_agree(coder):
    a = coder.generate(PREFIX + "    ", suffix=SUFFIX, max_tokens=10, temperature=0)
    b = coder.infill(PREFIX + "    ", SUFFIX, max_tokens=10, temperature=0)
    assert a.text == b.text and a.tokens == b.tokens
    with pytest.raises(TypeError, match="prompt must be the text"):
        coder.generate([1, 2, 3], suffix="x")
    # A batch shares one request's settings; FIM prompts each heal their own way.
    fill = fim.build(coder, PREFIX, SUFFIX, typed="    ret")
    with pytest.raises(TypeError, match="FIM prompts"):
        coder.generate_batch([fill, fill], max_tokens=2)


def test_extra_context_keeps_its_newest_tokens_within_the_budget(coder):
    chunks = [fim.Chunk(f"value_{i} = {i}\n" * 40, f"f{i}.py") for i in range(20)]
    p = fim.build(coder, PREFIX, SUFFIX, extra=chunks, n_batch=512, n_predict=128)
    assert p.n_extra == coder.n_ctx - 512 - 2 * 128 and p.cut > 0
    assert coder.detokenize(p.tokens[:p.n_extra], special=True).endswith("filename\n")


def test_n_indent_cuts_a_line_that_leaves_the_block():
    s = fim.EditorStops(n_indent=4)
    assert s.feed("x = 1\n") and s.feed("    y = 2\n")
    assert not s.feed("z")  # column 0 < 4: the answer ends, that line's text dropped
    assert s.final("x = 1\n    y = 2\nz") == "x = 1\n    y = 2\n"
    blank = fim.EditorStops(n_indent=4)
    assert blank.feed("a\n\n") and blank.feed("    b")  # a blank line is no leaving
    assert fim.EditorStops(n_indent=0).feed("a\nb")  # control: off


def test_time_budget_ends_only_at_a_line_end():
    s = fim.EditorStops(t_max_predict_ms=250)
    assert s.feed("a", now=0.0)
    assert s.feed("bc", now=0.3)  # over budget, but mid-line
    assert not s.feed("d\n", now=0.31)
    assert fim.EditorStops(t_max_predict_ms=250).feed("x\n", now=0.1)
    healed = fim.EditorStops(n_indent=2, skip=3)
    assert healed.feed("ret") and healed.text == ""


def test_prediction_counts():
    assert prediction.counts([1, 2, 3, 4], [1, 2, 3, 4]) == (4, 0)
    assert prediction.counts([1, 2, 9, 3, 4], [1, 2, 3, 4, 5]) == (4, 1)
    assert prediction.counts([], [1]) == (0, 0)
    assert prediction.from_body({"type": "content", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]}) == "ab"
    for bad in ({"type": "x", "content": "a"}, {"content": "a"}, {"type": "content", "content": 3}, "a"):
        with pytest.raises(ValueError):
            prediction.from_body(bad)


def test_a_plain_model_takes_a_prediction_and_counts_it(coder):
    out = coder.generate("def f():", chat=False, max_tokens=5, temperature=0)
    again = coder.generate("def f():", chat=False, max_tokens=5, temperature=0, prediction=out.text)
    assert again.tokens == out.tokens and again.accepted_prediction_tokens >= 1
    spec = pyspec.SpeculativeDecoder(coder, drafter="ngram", policy="fixed", draft_max=4)
    fast = spec.generate("def f():", chat=False, max_tokens=5, temperature=0, prediction=out.text)
    assert fast.tokens == out.tokens and fast.stats.memory_drafted > 0, "ngram decoder did not switch to a lookup"


def test_the_cli_fills_in_and_counts_a_prediction(draft_path, gemma_path, tmp_path):
    from cli_helpers import pyspec_cmd

    r = pyspec_cmd("generate", "-m", draft_path, "--suffix", "\n\nprint(add(1, 2))\n", "def add(a, b):\n    ret",
                   "-n", "4", "--temperature", "0")
    assert r.returncode == 0 and r.stdout.startswith("urn"), r.stderr
    pred = tmp_path / "prediction.txt"
    pred.write_text("def f(y):\n    return y * 2\n")
    r = pyspec_cmd("generate", "-m", draft_path, "--prediction", str(pred), "--json", "-n", "6", "--temperature",
                   "0", "Rename x to y: def f(x): return x * 2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["accepted_prediction_tokens"] + out["rejected_prediction_tokens"] == len(
        pyspec.Model(draft_path, n_ctx=256).tokenize(pred.read_text(), add_special=False))
    r = pyspec_cmd("generate", "-m", gemma_path, "--suffix", "x", "a", "-n", "2")
    assert r.returncode != 0 and "Infill is not supported by this model" in r.stderr


def test_the_still_prefix_keeps_its_start_while_lines_are_added(coder):
    """A long file typed line by line below: the still layout's prompt starts at
    the same anchored line for most new lines (its cache holds), where
    llama-server's cut of the last tokens moves at every one (the control)."""
    import textwrap

    source = open(textwrap.__file__, encoding="utf-8").read().splitlines(keepends=True)
    moved = {"still": 0, "llama-server": 0}
    for layout in moved:
        before = None
        for n in range(300, 312):
            p = fim.build(coder, "".join(source[:n]), "\n", n_batch=256, layout=layout)
            head = p.tokens[1:9]
            moved[layout] += before is not None and head != before
            before = head
    assert moved["llama-server"] >= 8 and moved["still"] <= 3, moved


def test_going_on_to_the_next_line_also_only_appends(coder):
    """An editor's prefetch (the shown line accepted, the cursor on the next):
    the still prompt of the next line extends this line's, except when the
    split before MID moves to a later anchor (about once in eight lines);
    llama-server's layout changes the tokens before its suffix at every line."""
    import textwrap

    source = open(textwrap.__file__, encoding="utf-8").read().splitlines(keepends=True)
    rebuilt = {"still": 0, "llama-server": 0}
    for layout in rebuilt:
        before = None
        for n in range(200, 216):
            # New lines written above unchanged code: the suffix stays.
            p = fim.build(coder, "".join(source[:n]), "".join(source[230:246]), n_batch=512, layout=layout)
            rebuilt[layout] += before is not None and p.tokens[:len(before)] != before
            before = p.tokens
    assert rebuilt["llama-server"] >= 14 and rebuilt["still"] <= 4, rebuilt


def test_the_llama_server_layout_is_llama_servers(draft_path, load_model):
    """Golden renderings: llama-server's own /infill prompts (its `prompt`
    field, tests/fixtures/infill_llama_server.json, recorded from the llama.cpp
    that llama-cpp-python vendors) for four bodies: other files' chunks, a
    prefix cut to its budget, an empty typed part, typed text that eats the
    suffix's budget. pyspec's "llama-server" layout gives the same text and the
    same number of tokens."""
    from pathlib import Path

    golden = json.loads((Path(__file__).parent / "fixtures" / "infill_llama_server.json").read_text("utf-8"))
    model = load_model(draft_path, n_ctx=golden["n_ctx"])
    for case in golden["cases"]:
        extra = [fim.Chunk(c["text"], c.get("filename", "tmp")) for c in case.get("input_extra", [])]
        p = fim.build(model, case["input_prefix"], case["input_suffix"], typed=case["prompt"], extra=extra,
                      n_batch=golden["n_batch"], layout="llama-server")
        assert model.detokenize(p.tokens, special=True) == case["llama_server_prompt"], case["name"]
        assert len(p.tokens) == case["tokens_evaluated"], case["name"]
