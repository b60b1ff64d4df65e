"""Every bad input becomes a clear exception, and nothing is left half-done."""

from __future__ import annotations

import shutil

import pytest

import pyspec
from pyspec import ContextOverflowError, InvalidModelError, ModelNotFoundError


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        pyspec.Model(tmp_path / "nope.gguf")


def test_missing_file_is_also_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        pyspec.Model(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is a text file, not a model\n" * 100)
    with pytest.raises(InvalidModelError, match="not a GGUF"):
        pyspec.Model(bad)


def test_empty_file(tmp_path):
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"")
    with pytest.raises(InvalidModelError):
        pyspec.Model(bad)


@pytest.mark.parametrize("keep", [64, 4096, 1 << 20, "half"])
def test_truncated_gguf(tmp_path, gemma_path, keep):
    """A GGUF cut short (header only, mid-metadata, mid-tensors) is refused."""
    size = shutil.os.path.getsize(gemma_path)
    n = size // 2 if keep == "half" else keep
    bad = tmp_path / "truncated.gguf"
    with open(gemma_path, "rb") as src, open(bad, "wb") as dst:
        dst.write(src.read(n))
    with pytest.raises(InvalidModelError, match="truncated or corrupt|GGUF"):
        pyspec.Model(bad)


def test_prompt_longer_than_context(gemma_path, load_model):
    m = load_model(gemma_path, n_ctx=64)  # llama.cpp may round n_ctx up; m.n_ctx is the truth
    with pytest.raises(ContextOverflowError, match="context"):
        m.generate("word " * (m.n_ctx + 10), chat=False, max_tokens=4)
    # The model is still usable afterwards.
    assert m.generate("Hello", chat=False, max_tokens=2, temperature=0).n_generated_tokens == 2


def test_generation_stops_at_full_context(gemma_path, load_model):
    m = load_model(gemma_path, n_ctx=32)
    prompt = "Count: " + ", ".join(str(i) for i in range(m.n_ctx // 10))
    n_prompt = len(m.prompt_tokens(prompt, chat=False))
    assert n_prompt < m.n_ctx
    out = m.generate(prompt, chat=False, max_tokens=10 * m.n_ctx, temperature=0)
    assert out.stop_reason in ("context", "eog")
    # Every generated token but the last one was decoded into the context.
    assert n_prompt + out.n_generated_tokens <= m.n_ctx + 1


def test_decode_past_context_raises(gemma):
    with pytest.raises(ContextOverflowError):
        gemma.native.decode([1, 2, 3], gemma.n_ctx - 1, 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"top_k": -3},
        {"max_tokens": -1},
        {"temperature": float("nan")},
    ],
)
def test_invalid_sampling_settings(gemma, kwargs):
    with pytest.raises(ValueError):
        gemma.generate("Hi", chat=False, **kwargs)


def test_invalid_model_settings(gemma_path):
    with pytest.raises(ValueError):
        pyspec.Model(gemma_path, n_ctx=4)
    with pytest.raises(ValueError):
        pyspec.Model(gemma_path, n_threads=0)


def test_broken_chat_template_is_a_clear_error(gemma_path):
    # A template given on purpose is compiled at once; one that does not compile is refused.
    with pytest.raises(ValueError, match="does not compile.*--chat-template"):
        pyspec.Model(gemma_path, n_ctx=256, chat_template="{% for m in messages %}{{ m.content }}")
    model = pyspec.Model(gemma_path, n_ctx=256, chat_template="{% for m in messages %}<{{ m.content }}>{% endfor %}")
    assert model.apply_chat_template([{"role": "user", "content": "Hi"}]) == "<Hi>"
