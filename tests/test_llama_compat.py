"""pyspec.Llama against llama-cpp-python's own Llama (0.3.36), in one process
on the same model files: every call's dictionary has the same keys and types,
finish_reason and usage, and greedy text is equal or parts at a near tie
(tests/near_ties.py). llama-cpp-python's own Llama-level tests
(tests/test_llama.py of its source) are adapted here to the local models;
what pyspec refuses, it refuses with an error that names the argument.

Both sides start each compared call from an empty cache (``reset()``):
pyspec's prefill of a prompt whose prefix is cached rounds differently from a
fresh one (the CPU kernels' row paths, tests/near_ties.py), llama-cpp-python's
does not.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

import pyspec
from pyspec import Llama
from lcp_shapes import same_shape
from near_ties import near_tie_flips

llama_cpp = pytest.importorskip("llama_cpp")

FOX = "The quick brown fox jumps over the lazy dog. The quick brown fox"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def ours(gemma_path):
    with Llama(gemma_path, n_ctx=256, n_threads=2, verbose=False) as llm:
        yield llm


@pytest.fixture(scope="module")
def theirs(gemma_path):
    return llama_cpp.Llama(gemma_path, n_ctx=256, n_threads=2, verbose=False)


@pytest.fixture(scope="module")
def theirs_logprobs(gemma_path):
    """llama-cpp-python reports logprobs only with logits_all (pyspec always can)."""
    return llama_cpp.Llama(gemma_path, n_ctx=256, n_threads=2, logits_all=True, verbose=False)


@pytest.fixture(scope="module")
def qwen_path():
    """The default draft model (Qwen2.5-Coder-0.5B): the small model with a chat template and tool calls."""
    from pyspec import models

    return str(models.ensure(models.DEFAULT_DRAFT))


@pytest.fixture(scope="module")
def ours_chat(qwen_path):
    with Llama(qwen_path, n_ctx=1024, n_threads=2, verbose=False) as llm:
        yield llm


@pytest.fixture(scope="module")
def theirs_chat(qwen_path):
    return llama_cpp.Llama(qwen_path, n_ctx=1024, n_threads=2, verbose=False)


# ------------------------------------------------------------------ comparing answers

def same_text(llm: Llama, prompt_tokens, got: str, want: str) -> None:
    """Greedy texts equal, or parting where the lone run's top two are a near tie."""
    if got == want:
        return
    want_tokens = llm.tokenize(want.encode(), add_bos=False, special=False)
    assert near_tie_flips(llm.model, prompt_tokens, list(llm._last.tokens), want_tokens) == 1, (got, want)


def both(ours_llm, theirs_llm, method, *args, **kwargs):
    ours_llm.reset()
    theirs_llm.reset()
    mine = getattr(ours_llm, method)(*args, **kwargs)
    return mine, getattr(theirs_llm, method)(*args, **kwargs)


def check_completion(llm, mine, want, prompt_tokens, text=True):
    same_shape(mine, want)
    assert mine["id"].startswith("cmpl-") and mine["object"] == "text_completion"
    assert mine["model"] == want["model"] and isinstance(mine["created"], int)
    assert mine["usage"] == want["usage"]
    assert mine["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    if text:
        same_text(llm, prompt_tokens, mine["choices"][0]["text"], want["choices"][0]["text"])


LONG = " ".join(f"item {i}," for i in range(45))  # ~ 220 tokens: the context ends soon after it
CASES = {
    "plain": (FOX, dict(max_tokens=12, temperature=0)),
    "stop": (FOX, dict(max_tokens=24, temperature=0, stop=["."])),
    "stops": ("Roses are red,", dict(max_tokens=24, temperature=0, stop=["\n", "blue"])),
    "echo": ("Hello", dict(max_tokens=6, temperature=0, echo=True)),
    "to the context's end": (LONG, dict(max_tokens=None, temperature=0)),
    "token prompt": ([2, 818, 5279, 563], dict(max_tokens=6, temperature=0)),
    "empty prompt": ("", dict(max_tokens=4, temperature=0)),
    "seeded": ("Once upon a time", dict(max_tokens=8, temperature=0, seed=7, top_k=50, top_p=0.9)),
    "penalties": (FOX, dict(max_tokens=16, temperature=0, repeat_penalty=1.5, frequency_penalty=0.5,
                            presence_penalty=0.3)),
    "logit_bias": (FOX, dict(max_tokens=4, temperature=0, logit_bias={8864: 30.0})),  # 8864: " cat"
}


@pytest.mark.parametrize("prompt,kwargs", list(CASES.values()), ids=list(CASES))
def test_completions_are_llama_cpp_pythons(ours, theirs, prompt, kwargs):
    mine, want = both(ours, theirs, "create_completion", prompt, **kwargs)
    tokens = prompt if isinstance(prompt, list) else ours.tokenize(prompt.encode(), special=True)
    check_completion(ours, mine, want, tokens)


def test_call_is_create_completion_with_its_defaults(ours, theirs):
    """__call__ takes create_completion's arguments in the same order; the
    defaults (max_tokens 16 ...) are llama-cpp-python's."""
    ours.reset()
    mine = ours(FOX, None, 8, 0.0)  # prompt, suffix, max_tokens, temperature
    want = theirs(FOX, None, 8, 0.0)
    check_completion(ours, mine, want, ours.tokenize(FOX.encode(), special=True))
    assert ours(FOX, temperature=0)["usage"]["completion_tokens"] == 16


def test_logprobs_are_the_targets(ours, theirs_logprobs):
    mine, want = both(ours, theirs_logprobs, "create_completion", "The capital of France is", max_tokens=4,
                      temperature=0, logprobs=2)
    check_completion(ours, mine, want, ours.tokenize(b"The capital of France is", special=True))
    a, b = mine["choices"][0]["logprobs"], want["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    np.testing.assert_allclose(a["token_logprobs"], b["token_logprobs"], atol=2e-3)
    for x, y in zip(a["top_logprobs"], b["top_logprobs"]):
        assert set(x) == set(y)
        np.testing.assert_allclose([x[k] for k in y], [float(v) for v in y.values()], atol=2e-3)
    json.dumps(mine)  # pyspec's are Python floats (llama-cpp-python's are numpy's)


@pytest.mark.parametrize("logprobs", [None, 1])
def test_streamed_chunks_are_llama_cpp_pythons(ours, theirs, theirs_logprobs, logprobs):
    other = theirs if logprobs is None else theirs_logprobs
    mine, want = both(ours, other, "create_completion", "Once upon a time", max_tokens=8, temperature=0,
                      stream=True, logprobs=logprobs)
    mine, want = list(mine), list(want)
    for chunk in mine[:-1]:
        same_shape(chunk, want[0])
        assert chunk["choices"][0]["finish_reason"] is None and chunk["id"] == mine[0]["id"]
    same_shape(mine[-1], want[-1])
    assert mine[-1]["choices"][0]["finish_reason"] == want[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in mine)
    same_text(ours, ours.tokenize(b"Once upon a time", special=True), text,
              "".join(c["choices"][0]["text"] for c in want))
    if logprobs is not None and text == "".join(c["choices"][0]["text"] for c in want):
        assert len(mine) == len(want)  # one token a chunk, as there


def test_a_stream_closed_early_stops_the_generation(ours):
    chunks = ours("Once upon a time", max_tokens=200, temperature=0, stream=True)
    next(chunks)
    chunks.close()
    assert ours("Hi", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2  # usable at once


def test_fill_in_the_middle_needs_fim_tokens(ours, ours_chat):
    """``suffix`` is a FIM prompt from the model's own tokens (llama-cpp-python
    0.3.36 lays it out with token 0); a model without them says so."""
    out = ours_chat("def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n", max_tokens=12, temperature=0)
    assert out["choices"][0]["text"] and out["usage"]["prompt_tokens"] > 10
    with pytest.raises(Exception, match="(?i)fim|fill"):
        ours("def add(a, b):\n    ", suffix="\n", max_tokens=4)


# ------------------------------------------------------------------ llama-cpp-python's tests, adapted

def test_tokenization_is_llama_cpp_pythons(ours, theirs):
    """test_llama_cpp_tokenization on the local vocabulary."""
    for text in (b"Hello World", b"Hello World<eos>", b"", "naïve café ☕".encode()):
        for add_bos in (True, False):
            for special in (True, False):
                assert ours.tokenize(text, add_bos, special) == theirs.tokenize(text, add_bos, special)
    tokens = ours.tokenize(b"Hello World")
    assert tokens[0] == ours.token_bos() == theirs.token_bos()
    assert ours.detokenize(tokens) == theirs.detokenize(tokens) == b"Hello World"
    assert ours.detokenize(ours.tokenize(b"Hello World<eos>", special=True), special=True) == \
        theirs.detokenize(theirs.tokenize(b"Hello World<eos>", special=True), special=True)
    assert ours.tokenize(b"", add_bos=True, special=True) == [ours.token_bos()]
    assert (ours.n_ctx(), ours.n_vocab(), ours.token_eos()) == (theirs.n_ctx(), theirs.n_vocab(), theirs.token_eos())


def test_real_llama(ours):
    """test_real_llama: greedy text, a GBNF grammar (a LlamaGrammar object), a
    Python logits processor (refused: pyspec samples in C++), and the seed
    chain with save_state/load_state."""
    ours.reset()
    out = ours.create_completion(FOX, max_tokens=6, top_k=50, top_p=0.9, temperature=0.0, seed=1337)
    assert out["choices"][0]["text"] == " jumps over the lazy dog."
    grammar = llama_cpp.LlamaGrammar.from_string('root ::= "true" | "false"')
    out = ours.create_completion("The capital of france is paris, 'true' or 'false'?:\n", max_tokens=4, top_k=50,
                                 top_p=0.9, temperature=0.8, seed=1337, grammar=grammar)
    assert out["choices"][0]["text"] in ("true", "false")
    with pytest.raises(ValueError, match="logits_processor"):
        ours.create_completion("The capital of france is par", max_tokens=4,
                               logits_processor=llama_cpp.LogitsProcessorList([lambda ids, logits: logits]))


@pytest.mark.parametrize("draft_max", [0, None], ids=["plain", "speculative"])
def test_the_seed_chain_repeats_after_load_state(gemma_path, draft_max):
    """llama-cpp-python derives an unseeded call's seed from the one before
    (set_seed, load_state restore it). Plain decoding repeats the text exactly;
    under speculation the law is the same, but a draft (here: from the memory
    of the first answer) decides which random numbers test which token, so
    the repeated text may differ (docs/python.md#seeds)."""
    with Llama(gemma_path, n_ctx=256, n_threads=2, verbose=False, draft_max=draft_max) as llm:
        llm.set_seed(1337)
        state = llm.save_state()
        kwargs = dict(max_tokens=12, top_k=50, top_p=0.9, temperature=1.0)
        first = llm("Once upon a time", **kwargs)["choices"][0]["text"]
        second = llm("Once upon a time", **kwargs)["choices"][0]["text"]
        llm.load_state(state)
        third = llm("Once upon a time", **kwargs)["choices"][0]["text"]
        seed = llm.last_stats.seed
        llm.set_seed(1337)
        llm("Once upon a time", **kwargs)
        assert llm.last_stats.seed == seed  # the same call seed, as llama-cpp-python chooses it
        assert first != second
        if draft_max == 0:
            assert first == third


def test_repeated_prompt_reuses_the_cache(ours):
    """test_real_llama_repeated_prompt_cache: the same answer, the prompt found cached."""
    ours.reset()
    one = ours.create_completion(FOX, max_tokens=6, temperature=0.0, seed=1337)
    two = ours.create_completion(FOX, max_tokens=6, temperature=0.0, seed=1337)
    assert one["choices"][0]["text"] == two["choices"][0]["text"] == " jumps over the lazy dog."
    assert ours.last_stats.n_cached_tokens >= len(ours.tokenize(FOX.encode())) - 1


def test_an_edited_history_is_processed_again(ours):
    """_assert_prompt_cache_reset_handles_history_edit: a prompt that differs
    inside the cached one."""
    ours.reset()
    assert isinstance(ours("The quick brown fox", max_tokens=1, temperature=0)["choices"][0]["text"], str)
    assert isinstance(ours("The slow brown fox", max_tokens=1, temperature=0)["choices"][0]["text"], str)
    assert ours.last_stats.n_cached_tokens < len(ours.tokenize(b"The slow brown fox"))


def test_state_round_trip_continues_from_the_cache(ours):
    """_assert_loaded_exact_cached_prompt_reuse_matches_fresh, at the API: a
    state saved after one prompt, another prompt in between, then the state
    back: the first prompt is found cached and answered as before."""
    ours.reset()
    prompt = "def fibonacci(n):\n"
    first = ours(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    state = ours.save_state()
    assert state.n_tokens == len(state.input_ids) >= len(ours.tokenize(prompt.encode())) and state.llama_state
    ours("import os\n", max_tokens=4, temperature=0)
    ours.load_state(state)
    again = ours(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    same_text(ours, ours.tokenize(prompt.encode(), special=True), again, first)
    assert ours.last_stats.n_cached_tokens >= len(ours.tokenize(prompt.encode())) - 1


def test_embeddings_are_llama_cpp_pythons(gemma_path, ours):
    """test_real_llama_embeddings: with embedding=True, pyspec's core computes
    them (an Embedder on the Llama's own model, no llama_cpp.Llama): the same
    values, shapes and counts as llama-cpp-python's, with the model's own
    pooling (none for Gemma: a vector per token) and with mean pooling.
    tests/test_embeddings.py holds the core's own tests."""
    from pyspec.embedding import Embedder
    from pyspec.llama import embedding

    with pytest.raises(RuntimeError, match="embedding=True"):
        ours.embed("Hello World")
    texts = ["Hello World", "A different prompt"]
    with Llama(gemma_path, n_ctx=64, n_batch=64, n_threads=2, embedding=True, verbose=False) as llm:
        want = llama_cpp.Llama(gemma_path, n_ctx=64, n_batch=64, n_threads=2, embedding=True, verbose=False)
        np.testing.assert_allclose(llm.embed("Hello World"), want.embed("Hello World"), rtol=1e-4, atol=1e-4)
        assert isinstance(embedding.embedder(llm), Embedder)
        mine, theirs = llm.create_embedding(texts), want.create_embedding(texts)
        same_shape(mine, theirs)
        assert mine["usage"] == theirs["usage"] and mine["model"] == theirs["model"]
        # A later input's per-token vectors: llama-cpp-python 0.3.36 reads them in a list at a wrong
        # offset (its pooling-none loop advances by tokens, not floats); alone, it reads them right.
        np.testing.assert_allclose(mine["data"][1]["embedding"], want.embed(texts[1]), rtol=1e-4, atol=1e-4)
        assert not np.allclose(theirs["data"][1]["embedding"], want.embed(texts[1]), rtol=1e-4, atol=1e-4)
        assert llm.embed(texts, normalize=True, return_count=True)[1] == want.embed(texts, return_count=True)[1]
        want.close()
    mean = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    with Llama(gemma_path, n_ctx=64, n_threads=2, embedding=True, pooling_type=mean, verbose=False) as llm:
        want = llama_cpp.Llama(gemma_path, n_ctx=64, n_threads=2, embedding=True, pooling_type=mean, verbose=False)
        np.testing.assert_allclose(llm.embed(texts, normalize=True), want.embed(texts, normalize=True), atol=1e-5)
        long = "word " * 100
        np.testing.assert_allclose(llm.embed(long), want.embed(long), atol=1e-5)  # both cut to the batch
        with pytest.raises(ValueError, match="exceed batch size of 64"):
            llm.embed(long, truncate=False)
        want.close()


# ------------------------------------------------------------------ chats

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def check_chat(mine, want):
    same_shape(mine, want)
    assert mine["id"].startswith("chatcmpl-") and mine["object"] == "chat.completion"
    assert mine["usage"] == want["usage"]
    assert mine["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]


def test_chats_are_llama_cpp_pythons(ours_chat, theirs_chat):
    mine, want = both(ours_chat, theirs_chat, "create_chat_completion", MESSAGES, temperature=0, max_tokens=24)
    check_chat(mine, want)
    prompt = ours_chat.model.prompt_tokens(MESSAGES)
    same_text(ours_chat, prompt, mine["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"])


def test_chat_defaults_answer_until_the_turn_ends(ours_chat, theirs_chat):
    """max_tokens None: to the end of the turn (or the context)."""
    mine, want = both(ours_chat, theirs_chat, "create_chat_completion",
                      [{"role": "user", "content": "What is 2+2? Answer with one digit."}], temperature=0)
    check_chat(mine, want)
    assert mine["choices"][0]["finish_reason"] == "stop"


def test_streamed_chats_are_llama_cpp_pythons(ours_chat, theirs_chat):
    mine, want = both(ours_chat, theirs_chat, "create_chat_completion", MESSAGES, temperature=0, max_tokens=16,
                      stream=True)
    mine, want = list(mine), list(want)
    same_shape(mine[0], want[0])
    assert mine[0]["choices"][0]["delta"] == {"role": "assistant"}
    for chunk in mine[1:-1]:
        same_shape(chunk, want[1])
    same_shape(mine[-1], want[-1])
    assert mine[-1]["choices"][0]["finish_reason"] == want[-1]["choices"][0]["finish_reason"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in mine)
    same_text(ours_chat, ours_chat.model.prompt_tokens(MESSAGES), text,
              "".join(c["choices"][0]["delta"].get("content", "") for c in want))


NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER_CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_named_tool_choice_is_a_call(ours_chat, theirs_chat):
    mine, want = both(ours_chat, theirs_chat, "create_chat_completion", WEATHER_CHAT, tools=[WEATHER],
                      tool_choice=NAMED, temperature=0, max_tokens=48)
    check_chat({**mine, "usage": want["usage"]}, want)  # llama-cpp-python's call is its arguments alone
    m, w = mine["choices"][0]["message"], want["choices"][0]["message"]
    assert m["content"] is None and m["function_call"]["name"] == w["function_call"]["name"] == "get_weather"
    assert json.loads(m["tool_calls"][0]["function"]["arguments"]) == json.loads(w["tool_calls"][0]["function"]
                                                                                  ["arguments"])
    assert mine["choices"][0]["finish_reason"] == "tool_calls"


def test_a_streamed_named_tool_call(ours_chat, theirs_chat):
    mine, want = both(ours_chat, theirs_chat, "create_chat_completion", WEATHER_CHAT, tools=[WEATHER],
                      tool_choice=NAMED, temperature=0, max_tokens=48, stream=True)
    mine, want = list(mine), list(want)
    for chunk, like in ((mine[0], want[0]), (mine[1], want[1]), (mine[-1], want[-1])):
        same_shape(chunk, like)
    arguments = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                        for c in mine if c["choices"][0]["delta"].get("tool_calls"))
    assert json.loads(arguments) == {"city": "Paris"}
    assert mine[-1]["choices"][0]["finish_reason"] == want[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_calls_are_parsed_under_auto(ours_chat):
    """llama-cpp-python's GGUF-template handler leaves a call in the content;
    pyspec parses it out in the template's format (as its server does)."""
    ours_chat.reset()
    out = ours_chat.create_chat_completion(WEATHER_CHAT, tools=[WEATHER], tool_choice="auto", temperature=0,
                                           max_tokens=48)
    message = out["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert out["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("response_format", [
    {"type": "json_object"},
    {"type": "json_object", "schema": {"type": "object", "properties": {"name": {"type": "string"}},
                                       "required": ["name"]}},
    {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}},
], ids=["json_object", "json_object+schema", "json_schema"])
def test_response_formats_make_json(ours_chat, response_format):
    ours_chat.reset()
    out = ours_chat.create_chat_completion([{"role": "user", "content": "Describe a person as JSON."}],
                                           response_format=response_format, temperature=0, max_tokens=40)
    value = json.loads(out["choices"][0]["message"]["content"])
    assert isinstance(value, dict)
    required = (response_format.get("schema") or response_format.get("json_schema", {}).get("schema") or {}).get(
        "required", [])
    assert set(required) <= set(value)


def test_chat_logprobs_have_llama_cpp_pythons_shape(ours_chat, qwen_path):
    theirs = llama_cpp.Llama(qwen_path, n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    messages = [{"role": "user", "content": "Say yes."}]
    mine, want = both(ours_chat, theirs, "create_chat_completion", messages, temperature=0, max_tokens=3,
                      logprobs=True, top_logprobs=2)
    check_chat(mine, want)
    assert mine["choices"][0]["logprobs"]["refusal"] is None


# ------------------------------------------------------------------ construction, defaults and errors

def _defaults(fn):
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("method", ["create_completion", "__call__", "create_chat_completion", "tokenize",
                                    "detokenize", "embed", "create_embedding"])
def test_defaults_are_llama_cpp_pythons(method):
    assert _defaults(getattr(Llama, method)) == _defaults(getattr(llama_cpp.Llama, method))


def test_constructor_defaults_are_llama_cpp_pythons():
    from pyspec.llama.options import FIXED

    theirs = _defaults(llama_cpp.Llama.__init__)
    mine = _defaults(Llama.__init__)
    for name, value in theirs.items():
        if name in FIXED:
            assert value in FIXED[name] or value == FIXED[name][0], name
        elif name in mine:
            assert mine[name] == value, name
        else:
            pytest.fail(f"Llama() does not take {name}")


def test_speculation_is_on_by_default(ours, gemma_path, qwen_path):
    assert isinstance(ours.generator, pyspec.SpeculativeDecoder) and ours.generator.drafter == "suffix"
    with Llama(gemma_path, n_ctx=128, verbose=False, draft_max=0) as plain:
        assert plain.generator is plain.model
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    lookup = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=7)
    with Llama(gemma_path, n_ctx=128, verbose=False, draft_model=lookup) as llm:
        assert llm.generator.drafter == "ngram" and llm.generator.draft_max == 7
        assert llm(FOX, max_tokens=6, temperature=0)["choices"][0]["text"] == " jumps over the lazy dog."
    with Llama(qwen_path, n_ctx=256, n_threads=2, verbose=False, draft_model=qwen_path) as llm:
        assert llm.generator.draft is not None
        assert llm(FOX, max_tokens=6, temperature=0)["usage"]["completion_tokens"] == 6
        state = llm.save_state()
        assert len(state.parts) == 2  # the draft model's cache too
        llm.load_state(state)


def test_from_pretrained_takes_default_model_names(gemma_path):
    with Llama.from_pretrained("test", filename="*.gguf", n_ctx=64, verbose=False) as llm:
        assert llm.model.path == gemma_path
    with pytest.raises(ValueError, match="default models"):
        Llama.from_pretrained("lmstudio-community/Qwen3.5-0.8B-GGUF", "Qwen3.5-0.8B-Q8_0.gguf")
    with pytest.raises(ValueError, match="No file found"):
        Llama.from_pretrained("test", filename="*.bin")


def test_metadata_is_the_files(ours, theirs):
    for key in ("general.architecture", "general.name", "gemma3.context_length", "tokenizer.ggml.model"):
        if key in theirs.metadata:
            assert ours.metadata[key] == theirs.metadata[key]


def test_close_and_the_context_manager(gemma_path):
    with Llama(gemma_path, n_ctx=64, verbose=False) as llm:
        assert llm.n_ctx() >= 64
    with pytest.raises(RuntimeError, match="closed"):
        llm("Hi", max_tokens=1)
    llm.close()  # twice is fine


BAD_CONSTRUCTION = {
    "unknown argument": (dict(n_gpu_layerz=1), TypeError, "n_gpu_layerz"),
    "vocab_only": (dict(vocab_only=True), ValueError, "vocab_only"),
    "lora_path": (dict(lora_path="x.gguf"), ValueError, "lora_path"),
    "kv_overrides": (dict(kv_overrides={"a": 1}), ValueError, "kv_overrides"),
    "chat_handler": (dict(chat_handler=object()), ValueError, "chat_handler"),
    "chat_format": (dict(chat_format="no-such-format"), ValueError, "chat_format"),
    "n_threads_batch": (dict(n_threads=2, n_threads_batch=4), ValueError, "n_threads_batch"),
    "a Python draft model": (dict(draft_model=object()), TypeError, "draft_model"),
    "pooling without embeddings": (dict(pooling_type=1), ValueError, "pooling_type"),
    "rank pooling": (dict(embedding=True, pooling_type=4), ValueError, "pooling_type"),
    "unknown pooling": (dict(embedding=True, pooling_type=7), ValueError, "pooling_type"),
    "rope_freq_base": (dict(rope_freq_base=10000.0), ValueError, "rope_freq_base"),
}


@pytest.mark.parametrize("kwargs,error,match", list(BAD_CONSTRUCTION.values()), ids=list(BAD_CONSTRUCTION))
def test_unsupported_construction_is_refused(gemma_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        Llama(gemma_path, n_ctx=64, verbose=False, **kwargs)


def test_defaults_given_explicitly_are_accepted(gemma_path):
    with Llama(gemma_path, n_ctx=64, verbose=False, vocab_only=False, use_mmap=True, use_mlock=False, numa=False,
               rope_scaling_type=-1, split_mode=1, main_gpu=0, offload_kqv=True, logits_all=True, no_perf=True,
               chat_format="chat_template.default", n_threads=2, n_threads_batch=2, n_ubatch=512) as llm:
        assert llm.n_batch == 64
    # As llama-cpp-python: the physical batch is min(n_batch, n_ubatch), and a
    # negative penalty window is llama.cpp's 0 (penalties off).
    with Llama(gemma_path, n_ctx=256, verbose=False, n_batch=128, n_ubatch=32, last_n_tokens_size=-1) as llm:
        assert llm.n_batch == 32
        plain = llm("ha ha ha ha", max_tokens=8, temperature=0)["choices"][0]["text"]
        assert llm("ha ha ha ha", max_tokens=8, temperature=0, repeat_penalty=2.0)["choices"][0]["text"] == plain


def test_a_missing_model_path_is_a_value_error():
    with pytest.raises(ValueError, match="Model path does not exist"):
        Llama("/nonexistent/model.gguf")


BAD_CALLS = {
    "logits_processor": (dict(logits_processor=[lambda ids, scores: scores]), "logits_processor"),
    "stopping_criteria": (dict(stopping_criteria=[lambda ids, logits: False]), "stopping_criteria"),
    "mirostat": (dict(mirostat_mode=2), "mirostat_mode"),
    "typical_p": (dict(typical_p=0.9), "typical_p"),
    "tfs_z": (dict(tfs_z=0.5), "tfs_z"),
    "echo with logprobs": (dict(echo=True, logprobs=1), "echo"),
}


@pytest.mark.parametrize("kwargs,match", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_unsupported_call_arguments_are_refused(ours, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ours("Hi", max_tokens=2, **kwargs)


def test_bad_chat_arguments_are_refused(ours_chat):
    with pytest.raises(ValueError, match="mirostat_mode"):
        ours_chat.create_chat_completion(MESSAGES, mirostat_mode=1)
    with pytest.raises(ValueError, match="response_format"):
        ours_chat.create_chat_completion(MESSAGES, response_format={"type": "yaml"})
    with pytest.raises(ValueError, match="not among the tools"):
        ours_chat.create_chat_completion(MESSAGES, tools=[WEATHER],
                                         tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="Requested tokens"):
        ours_chat.create_chat_completion([{"role": "user", "content": "word " * 1200}])


def test_low_level_calls_say_they_are_not_there(ours):
    for call in (lambda: ours.eval([1]), lambda: ours.sample(), lambda: ours.generate([1]),
                 lambda: ours.set_cache(llama_cpp.LlamaRAMCache())):
        with pytest.raises(NotImplementedError):
            call()
    ours.set_cache(None)
