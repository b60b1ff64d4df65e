"""Structured output from Python and the CLI (pyspec/constraints.py): answers
follow their JSON schema, regex or grammar; every drafter and policy gives the
plain decoder's greedy answer under a constraint; bad constraints are clear
errors. The laws at T > 0 are test_constrained_lossless.py's."""

from __future__ import annotations

import json
import re

import pytest

import pyspec
from pyspec import Constraint, ConstraintError

from cli_helpers import pyspec_cmd as run_cli

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
PROMPT = "Alice is 31 and lives in Paris. Give her as JSON with name, age and city."


def valid_person(text: str) -> bool:
    obj = json.loads(text)
    return (set(obj) == {"name", "age", "city"} and isinstance(obj["name"], str) and isinstance(obj["age"], int)
            and isinstance(obj["city"], str))


@pytest.fixture(scope="module")
def pair(gemma_path, load_model):
    return load_model(gemma_path, n_ctx=512, seed=0), load_model(gemma_path, "draft", n_ctx=512, seed=0)


# Every drafter, each under a policy that drafts (draft_max 2: batches of <= 3
# rows evaluate like single tokens on this build, so greedy answers are equal).
DRAFTING = [("model", "fixed"), ("model", "auto"), ("ngram", "fixed"), ("hybrid", "heuristic"),
            ("consensus", "fixed"), ("suffix", "fixed")]


@pytest.mark.parametrize("drafter, policy", DRAFTING)
def test_every_drafter_gives_the_plain_greedy_answer_under_a_schema(pair, drafter, policy):
    target, draft = pair
    plain = target.generate(PROMPT, json_schema=PERSON, temperature=0, max_tokens=64)
    assert plain.stop_reason == "eog" and valid_person(plain.text), plain.text
    spec = pyspec.SpeculativeDecoder(target, draft if drafter in ("model", "hybrid") else None, drafter=drafter,
                                     policy=policy, draft_max=2, memory=False)
    out = spec.generate(PROMPT, json_schema=PERSON, temperature=0, max_tokens=64)
    assert out.tokens == plain.tokens
    s = out.stats
    assert s.forced_drafted > 0 and s.forced_accepted > 0, "the schema's frame was not drafted for free"
    assert s.masks >= out.n_generated_tokens and s.mask_s > 0


def test_regex_and_gbnf_and_lark(pair):
    target, _ = pair
    out = target.generate("Today's date:", regex=r"\d{4}-\d{2}-\d{2}", temperature=0.8, seed=3, max_tokens=20)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", out.text) and out.stop_reason == "eog"
    for grammar in ('root ::= "yes" | "no"', 'start: "yes" | "no"'):
        out = target.generate("Is water wet? Answer yes or no.", grammar=grammar, temperature=1.0, seed=5)
        assert out.text in ("yes", "no")
    c = Constraint.json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 3})
    out = target.generate("Three numbers:", constraint=c, temperature=0, max_tokens=40)
    assert all(isinstance(x, int) for x in json.loads(out.text))


def test_stream_stop_and_length_under_a_schema(pair):
    target, draft = pair
    spec = pyspec.SpeculativeDecoder(target, draft, policy="fixed", draft_max=2)
    whole = spec.generate(PROMPT, json_schema=PERSON, temperature=0, max_tokens=64)
    assert "".join(spec.stream(PROMPT, json_schema=PERSON, temperature=0, max_tokens=64)) == whole.text
    cut = spec.generate(PROMPT, json_schema=PERSON, temperature=0, max_tokens=64, stop=['"age"'])
    assert cut.stop_reason == "stop" and whole.text.startswith(cut.text) and '"age"' not in cut.text
    short = spec.generate(PROMPT, json_schema=PERSON, temperature=0, max_tokens=5)
    assert short.stop_reason == "max_tokens" and len(short.tokens) == 5


@pytest.mark.parametrize("kwargs, match", [
    (dict(json_schema={"type": "nonsense"}), "nonsense"),
    (dict(json_schema="{not json"), "not valid JSON"),
    (dict(json_schema=[1, 2]), "JSON object"),
    (dict(regex="(unclosed"), "unclosed group"),
    (dict(json_schema={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}), "nowhere"),
    (dict(grammar="start: undefined_rule"), "undefined_rule"),
    (dict(grammar=""), "non-empty"),
    (dict(json_schema={"type": "object"}, regex="a"), "one constraint"),
])
def test_bad_constraints_are_clear_errors(pair, kwargs, match):
    target, _ = pair
    with pytest.raises(ConstraintError, match=match):
        target.generate("x", max_tokens=2, **kwargs)
    assert target.generate("x", max_tokens=2, temperature=0).n_generated_tokens == 2  # the model stays usable


def test_samples_in_a_batch_each_follow_the_schema(gemma_path, load_model):
    target = load_model(gemma_path, "batch", n_ctx=1024, n_seq_max=3, seed=0)
    spec = pyspec.SpeculativeDecoder(target, drafter="consensus", policy="fixed", draft_max=2)
    out = spec.generate(PROMPT, n=3, json_schema=PERSON, temperature=0.8, seed=11, max_tokens=64)
    assert all(c.stop_reason == "eog" and valid_person(c.text) for c in out.choices), [c.text for c in out.choices]


def test_cli_flags(gemma_path, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    r = run_cli("generate", PROMPT, "--model", gemma_path, "--json-schema", str(schema), "-t", "0", "-n", "64",
                "--json", "--n-ctx", "512")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert valid_person(out["text"]) and out["stats"]["masks"] > 0
    r = run_cli("generate", "Date:", "--model", gemma_path, "--regex", r"\d{4}", "-t", "0", "--n-ctx", "512")
    assert r.returncode == 0 and re.fullmatch(r"\d{4}\n?", r.stdout), (r.stdout, r.stderr)
    r = run_cli("generate", "x", "--model", gemma_path, "--json-schema", '{"type": "nonsense"}', "--n-ctx", "512")
    assert r.returncode == 2 and "nonsense" in r.stderr
    r = run_cli("generate", "x", "--model", gemma_path, "--regex", "a", "--json-schema", "{}")
    assert r.returncode == 2 and "one constraint" in r.stderr
