"""Embeddings computed by pyspec's core (cpp/model/embedder.h, pyspec/embedding.py)
and their wire formats (pyspec/wire/embeddings.py), on the test model.

The reference is llama-cpp-python's ``Llama(embedding=True, pooling_type=MEAN)``
on the same file, and llama-server's ``/v1/embeddings`` where a build is at
hand: the vectors must agree to cosine >= AGREE (the negative controls show
the check catches another pooling and vectors of other inputs).

A packed call is not bit-identical to one input at a time: llama.cpp's CPU
matrix kernels round a token's row differently by the number of rows in the
batch (embedder.h), and Gemma 3's outsized activations make that visible. So
packed and lone agree to AGREE too; the same call shape is bit-exact.

One module-scoped model and embedder; the whole file runs in a few seconds.
"""

from __future__ import annotations

import base64
import os
import threading

import numpy as np
import pytest

import pyspec
from pyspec import ContextOverflowError, Embedder
from pyspec.server.api_error import APIError
from pyspec.wire import embeddings as wire

llama_cpp = pytest.importorskip("llama_cpp")

#: The bound every comparison with another implementation (or another packing) must meet.
AGREE = 0.9999
TEXTS = ["Hello World", "A different prompt", "The quick brown fox jumps over the lazy dog.",
         "Speculative decoding drafts tokens cheaply and verifies them with the target model.",
         "def add(a, b):\n    return a + b\n"]
LLAMA_SERVER_BIN = os.environ.get("PYSPEC_LLAMA_SERVER", "/tmp/llama-build/bin/llama-server")
N_CTX = 128


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def agree(a, b) -> bool:
    """The equality check of this file: every pair of rows at cosine >= AGREE."""
    return bool(cosines(a, b).min() >= AGREE)


@pytest.fixture(scope="module")
def model(gemma_path):
    return pyspec.Model(gemma_path, n_ctx=64, n_threads=2, n_seq_max=1)


@pytest.fixture(scope="module")
def emb(model):
    return Embedder(model, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def ours(emb):
    return emb.embed_array(TEXTS)


@pytest.fixture(scope="module")
def theirs(gemma_path):
    """llama-cpp-python's normalized mean-pooled vectors of TEXTS, and its tokens."""
    ll = llama_cpp.Llama(gemma_path, n_ctx=N_CTX, n_threads=2, embedding=True,
                         pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
    try:
        return np.array(ll.embed(TEXTS, normalize=True)), [ll.tokenize(t.encode()) for t in TEXTS]
    finally:
        ll.close()


# ------------------------------------------------------------------ values

def test_values_are_llama_cpp_pythons(emb, ours, theirs):
    vectors, tokens = theirs
    assert emb.tokens(TEXTS) == tokens  # llama-server's tokenization is llama-cpp-python's on plain text
    cos = cosines(ours, vectors)
    print("cosine against llama-cpp-python (mean, normalized):", np.round(cos, 7))
    assert agree(ours, vectors), cos


def test_the_check_catches_other_pooling_and_other_inputs(model, ours, theirs):
    """Negative controls: last-token pooling, and each text's vector against
    the next text's, must fail the check the values pass."""
    vectors, _ = theirs
    last = Embedder(model, n_ctx=N_CTX, pooling="last").embed_array(TEXTS)
    assert not agree(last, vectors), cosines(last, vectors)
    shuffled = np.roll(ours, 1, axis=0)
    assert not agree(shuffled, vectors), cosines(shuffled, vectors)
    print("controls: last pooling", np.round(cosines(last, vectors), 4).min(),
          "other inputs", np.round(cosines(shuffled, vectors), 4).max())


def test_a_packed_call_is_one_decode_and_agrees_with_lone_inputs(emb, ours):
    before = emb.native.n_decodes
    again = emb.embed_array(TEXTS)
    assert emb.native.n_decodes == before + 1  # all five in one llama_decode
    np.testing.assert_array_equal(again, ours)  # the same call shape is bit-exact
    lone = np.stack([emb.embed_array(t)[0] for t in TEXTS])
    assert emb.native.n_decodes == before + 1 + len(TEXTS)
    cos = cosines(ours, lone)
    print("cosine packed against lone:", np.round(cos, 7))
    assert agree(ours, lone), cos


def test_inputs_that_do_not_fit_one_decode_are_split(model):
    small = Embedder(model, n_ctx=16)
    toks = [[2] + [100 + i] * 9 for i in range(3)]  # 10 tokens each: one per decode of 16
    out = small.embed_array(toks)
    assert out.shape == (3, small.n_embd) and small.native.n_decodes == 3
    assert small.max_tokens == 16


def test_vectors_are_unit_length_and_normalize_false_is_the_same_direction(emb, ours):
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    raw = emb.embed_array(TEXTS, normalize=False)
    assert (np.linalg.norm(raw, axis=1) > 2).all()  # Gemma's pooled states are long
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), ours, atol=1e-6)


def test_token_input_is_the_texts_tokens(emb, ours):
    tokens = [emb.tokenize(t) for t in TEXTS]
    assert tokens[0][0] == emb.model.native.bos  # special tokens added, as llama-server adds them
    np.testing.assert_array_equal(emb.embed_array(tokens), ours)
    one = emb.embed(tokens[0])  # one token list: one input
    assert len(one) == 1 and one[0] == emb.embed(TEXTS[0])[0]
    assert emb.tokenize("<bos>x") == [emb.model.native.bos] * 2 + emb.tokenize("x")[1:]  # control text parsed


def test_pooling_none_gives_a_vector_per_token(model, emb):
    per_token = Embedder(model, n_ctx=N_CTX, pooling="none")
    out = per_token.embed(TEXTS[:2])
    assert [len(x) for x in out] == [len(emb.tokenize(t)) for t in TEXTS[:2]]
    assert per_token.pooling == "none" and Embedder(model, pooling="model").pooling == "none"  # Gemma's own


# ------------------------------------------------------------------ errors

def test_refusals_are_exceptions_that_say_why(emb):
    n_vocab = emb.model.n_vocab
    with pytest.raises(ValueError, match="no inputs"):
        emb.embed([])
    with pytest.raises(ValueError, match="input 1 is empty"):
        emb.embed([[2, 3], []])
    for bad in (n_vocab, -1):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            emb.embed([[2, bad]])
    with pytest.raises(ValueError, match="outside the vocabulary"):  # the core checks too
        emb.native.embed([[2, n_vocab]])
    with pytest.raises(TypeError):  # an id past int32: refused by the binding, no crash
        emb.native.embed([[2, 2**40]])
    with pytest.raises(ValueError, match="at least one input"):
        emb.native.embed([])
    long = [2] + [100] * N_CTX
    with pytest.raises(ContextOverflowError, match=f"129 tokens; this embedder takes at most {N_CTX}"):
        emb.embed([long])
    assert len(emb.tokens([long], truncate=True)[0]) == N_CTX
    assert len(emb.embed([long], truncate=True)) == 1
    with pytest.raises(TypeError):
        emb.embed(b"bytes")
    with pytest.raises(TypeError):
        emb.embed([["a"]])


def test_a_cancelled_call_stops_and_the_embedder_goes_on(emb, ours):
    cancel = pyspec.CancelToken()
    cancel.set()
    with pytest.raises(RuntimeError, match="cancelled"):
        emb.native.embed([emb.tokenize(TEXTS[0])], True, cancel)
    np.testing.assert_array_equal(emb.embed_array(TEXTS), ours)


def test_bad_settings_are_refused(model):
    for kwargs, match in [(dict(pooling="rank"), "reranker"), (dict(pooling="sum"), "pooling"),
                          (dict(flash_attn="yes"), "flash_attn"), (dict(n_threads=0), "n_threads"),
                          (dict(n_ctx=16, n_batch=32), "n_batch"), (dict(n_ctx=0), "n_ctx")]:
        with pytest.raises(ValueError, match=match):
            Embedder(model, **kwargs)
    with pytest.raises(ValueError, match="rank"):
        pyspec._core.EmbedderParams(pooling=4)
    with pytest.raises(TypeError):
        Embedder("model.gguf")


def test_threads_share_the_embedder_while_the_model_generates(model, emb, ours):
    """Two threads embed while a third generates on the model's own context
    (separate llama.cpp contexts on one model): all answers are as alone."""
    results, errors = {}, []

    def run(name, call):
        try:
            results[name] = call()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    want = model.generate("Once upon a time", max_tokens=16, temperature=0, chat=False).tokens
    threads = [threading.Thread(target=run, args=(f"embed{i}", lambda: emb.embed_array(TEXTS))) for i in range(2)]
    threads.append(threading.Thread(target=run, args=(
        "generate", lambda: model.generate("Once upon a time", max_tokens=16, temperature=0, chat=False).tokens)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results["generate"] == want
    for i in range(2):
        np.testing.assert_array_equal(results[f"embed{i}"], ours)


# ------------------------------------------------------------------ OpenAI's /v1/embeddings

def openai(emb, body):
    return wire.openai_embeddings(emb, wire.parse_openai(body, emb.n_embd), "gemma")


def test_openai_answer_and_base64(emb, ours):
    answer = openai(emb, {"input": TEXTS, "model": "x", "encoding_format": "float", "user": "u",
                          "dimensions": emb.n_embd})
    assert answer["object"] == "list" and answer["model"] == "gemma"
    assert [d["index"] for d in answer["data"]] == list(range(len(TEXTS)))
    assert all(d["object"] == "embedding" for d in answer["data"])
    n_tokens = sum(len(t) for t in emb.tokens(TEXTS))
    assert answer["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    floats = np.array([d["embedding"] for d in answer["data"]], np.float32)
    np.testing.assert_array_equal(floats, ours)
    b64 = openai(emb, {"input": TEXTS, "encoding_format": "base64"})
    # As OpenAI's client decodes it: little-endian float32.
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]])
    np.testing.assert_array_equal(decoded, floats)


def test_openai_input_shapes(emb, ours):
    tokens = emb.tokens(TEXTS[:2])
    for body_input, want in [(TEXTS[0], ours[:1]), (TEXTS[:2], ours[:2]), (tokens[0], ours[:1]),
                             (tokens, ours[:2])]:
        got = np.array([d["embedding"] for d in openai(emb, {"input": body_input})["data"]], np.float32)
        assert agree(got, want)


@pytest.mark.parametrize("body,param,match", [
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "a", "dimensions": 64}, "dimensions", "640"),
    ({"input": "a", "temperature": 0}, "temperature", "unsupported parameter 'temperature'"),
    ({"model": "x"}, "input", "'input' is required"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": ["a", [1, 2]]}, "input", "not a mix"),
    ({"input": [True, 2]}, "input", "must be"),
    ({"input": 3}, "input", "must be"),
    ({"input": "a", "model": 1}, "model", "a string"),
    ({"input": ["a"] * (wire.MAX_INPUTS + 1)}, "input", "at most 2048"),
], ids=["encoding", "dimensions", "unknown", "no input", "empty", "mixed", "bools", "number", "model", "too many"])
def test_openai_bad_bodies_are_400s_naming_the_field(emb, body, param, match):
    with pytest.raises(APIError, match=match) as e:
        wire.parse_openai(body, emb.n_embd)
    assert (e.value.status, e.value.param) == (400, param)


def test_openai_inputs_the_embedder_cannot_take_are_400s(emb):
    for body, match in [({"input": [[2, emb.model.n_vocab]]}, "outside the vocabulary"),
                        ({"input": [[2, 3], []]}, r"input\[1\] is empty"),
                        ({"input": [[2] + [100] * N_CTX]}, f"129 tokens, more than the {N_CTX}")]:
        with pytest.raises(APIError, match=match) as e:
            openai(emb, body)
        assert (e.value.status, e.value.param) == (400, "input")
    with pytest.raises(APIError, match="pools nothing"):
        openai(Embedder(emb.model, pooling="none"), {"input": "a"})


# ------------------------------------------------------------------ ollama's /api/embed and /api/embeddings

def test_ollama_embed(emb, ours):
    answer = wire.ollama_embed(emb, wire.parse_ollama_embed(
        {"model": "gemma3", "input": TEXTS[:2], "options": {"num_ctx": 8}, "keep_alive": "5m"}, emb.n_embd), "gemma3")
    assert set(answer) == {"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"}
    assert answer["model"] == "gemma3" and answer["load_duration"] == 0 and answer["total_duration"] > 0
    assert answer["prompt_eval_count"] == sum(len(t) for t in emb.tokens(TEXTS[:2]))
    assert agree(answer["embeddings"], ours[:2])
    one = wire.ollama_embed(emb, wire.parse_ollama_embed({"input": TEXTS[0]}, emb.n_embd), "m")
    assert len(one["embeddings"]) == 1
    none = wire.ollama_embed(emb, wire.parse_ollama_embed({"model": "m", "input": ""}, emb.n_embd), "m")
    assert none["embeddings"] == [] and none["prompt_eval_count"] == 0
    short = wire.ollama_embed(emb, wire.parse_ollama_embed({"input": TEXTS[0], "dimensions": 8}, emb.n_embd), "m")
    v = np.array(short["embeddings"][0])
    assert v.shape == (8,) and abs(np.linalg.norm(v) - 1) < 1e-6 and agree(v, ours[0, :8])


def test_ollama_truncate(emb):
    text = "word " * (2 * N_CTX)
    cut = wire.ollama_embed(emb, wire.parse_ollama_embed({"input": text}, emb.n_embd), "m")
    assert cut["prompt_eval_count"] == N_CTX
    with pytest.raises(APIError, match="'truncate': true cuts it") as e:
        wire.ollama_embed(emb, wire.parse_ollama_embed({"input": text, "truncate": False}, emb.n_embd), "m")
    assert e.value.status == 400


@pytest.mark.parametrize("body,param", [
    ({"input": ["a", 1]}, "input"), ({"input": "a", "truncate": "yes"}, "truncate"),
    ({"input": "a", "dimensions": 4096}, "dimensions"), ({"input": "a", "options": []}, "options"),
    ({"input": "a", "keep_alive": [1]}, "keep_alive"), ({"input": "a", "format": "json"}, "format"),
])
def test_ollama_embed_bad_bodies(emb, body, param):
    with pytest.raises(APIError) as e:
        wire.parse_ollama_embed(body, emb.n_embd)
    assert (e.value.status, e.value.param) == (400, param)
    assert wire.ollama_error(e.value) == {"error": e.value.message}


def test_ollama_legacy_embeddings_are_not_normalized(emb):
    answer = wire.ollama_embeddings(emb, wire.parse_ollama_embeddings({"model": "m", "prompt": TEXTS[0]}))
    np.testing.assert_array_equal(np.array(answer["embedding"], np.float32),
                                  emb.embed_array(TEXTS[0], normalize=False)[0])
    assert wire.ollama_embeddings(emb, wire.parse_ollama_embeddings({"model": "m"})) == {"embedding": []}
    for body, param in [({"prompt": 1}, "prompt"), ({"prompt": "a", "input": "b"}, "input")]:
        with pytest.raises(APIError) as e:
            wire.parse_ollama_embeddings(body)
        assert (e.value.status, e.value.param) == (400, param)


# ------------------------------------------------------------------ llama-server

@pytest.mark.skipif(not os.path.isfile(LLAMA_SERVER_BIN), reason="no llama-server (set PYSPEC_LLAMA_SERVER)")
def test_values_are_llama_servers(gemma_path, ours):
    """llama-server --embeddings --pooling mean (flash attention off, as the
    embedder's default) answers /v1/embeddings with pyspec's vectors."""
    from pyspec.bench.serve.process import ServerProcess, free_port, request

    port = free_port()
    server = ServerProcess([LLAMA_SERVER_BIN, "-m", gemma_path, "--embeddings", "--pooling", "mean", "-t", "2",
                            "-fa", "off", "-c", str(N_CTX), "--port", str(port)], port, startup_s=120)
    try:
        status, answer = request(port, "POST", "/v1/embeddings", {"input": TEXTS}, timeout=120)
    finally:
        server.stop()
    assert status == 200, answer
    vectors = np.array([d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])])
    cos = cosines(ours, vectors)
    print("cosine against llama-server:", np.round(cos, 7))
    assert agree(ours, vectors), cos


def test_unpacked_inputs_are_their_lone_vectors_bit_for_bit(model, emb):
    """pack=False (the server's): each input its own decode, so a list's
    vectors are exactly each input's alone; a refusal is the packed call's,
    before any input is embedded."""
    texts = ["The cat sat on the mat.", "def f(x):\n    return x * 2", "日本語の文"]
    unpacked = Embedder(model, pack=False)
    together = unpacked.embed_array(texts)
    assert all(np.array_equal(together[i], unpacked.embed_array([t])[0]) for i, t in enumerate(texts))
    before = unpacked.native.n_decodes
    with pytest.raises(ValueError, match="input 1 is empty"):
        unpacked.embed_tokens([[1, 2], []])
    assert unpacked.native.n_decodes == before
