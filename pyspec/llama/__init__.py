"""llama-cpp-python's ``Llama`` over pyspec: ``from pyspec import Llama`` in
place of ``from llama_cpp import Llama``, with speculative decoding on
(docs/python.md#coming-from-llama-cpp-python).

* ``llama.py``: the class (loading, tokens, state, seeds, life cycle);
* ``completion.py``: ``create_completion`` and its response dicts;
* ``chat.py``: ``create_chat_completion`` (templates, tools, response formats);
* ``embedding.py``: ``embed`` and ``create_embedding``, computed by pyspec's core (pyspec/embedding.py);
* ``chat_formats.py``: llama-cpp-python's named chat formats (``chat_format="chatml"`` ...) as data;
* ``functions.py``: ``chat_format="chatml-function-calling"``: its grammar and its calls' parser;
* ``loading.py``: the generator from ``draft_model``, ``chat_format``, ``from_pretrained``;
* ``options.py``: the arguments pyspec has no counterpart for, and a call's sampling.

``LlamaGrammar`` and ``LlamaPromptLookupDecoding`` are llama-cpp-python's,
re-exported here (imported on first use) for scripts that import them beside ``Llama``.
"""

from .llama import Llama, LlamaState

__all__ = ["Llama", "LlamaState", "LlamaGrammar", "LlamaPromptLookupDecoding"]


def __getattr__(name: str):
    if name == "LlamaGrammar":
        from llama_cpp import LlamaGrammar

        return LlamaGrammar
    if name == "LlamaPromptLookupDecoding":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        return LlamaPromptLookupDecoding
    raise AttributeError(f"module 'pyspec.llama' has no attribute {name!r}")
