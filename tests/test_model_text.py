"""Tokenizer, detokenizer and chat template on real models."""

from __future__ import annotations

import pytest

SAMPLES = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "def f(x):\n    return x * 2\n",
    "Ünïcödé — 日本語のテキスト — emoji 🚀",
    "numbers 1234567890 and symbols <>&%$#@!",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_gemma(gemma, text):
    tokens = gemma.tokenize(text, add_special=False)
    assert tokens, "tokenizer returned nothing"
    assert gemma.detokenize(tokens) == text


def test_bos_is_added_when_the_model_asks(gemma):
    with_special = gemma.tokenize("Hi", add_special=True)
    without = gemma.tokenize("Hi", add_special=False)
    assert with_special[0] == gemma.native.bos
    assert with_special[1:] == without


@pytest.mark.pair
@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_qwen(target, text):
    assert target.detokenize(target.tokenize(text, add_special=False)) == text


@pytest.mark.pair
def test_chat_template_qwen(target):
    text = target.apply_chat_template([{"role": "user", "content": "Say hi"}])
    assert "<|im_start|>user\nSay hi<|im_end|>" in text
    assert text.rstrip().endswith("<|im_start|>assistant")
    tokens = target.prompt_tokens("Say hi")
    # Control markers become single control tokens, not text.
    im_start = target.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(im_start) == 1 and im_start[0] in tokens


def test_vocab_facts(gemma):
    core = gemma.native
    assert gemma.n_vocab > 1000
    assert core.is_eog(core.eos)
    assert not core.is_eog(gemma.tokenize("the", add_special=False)[0])
    assert core.token_text(core.bos) == "<bos>"
