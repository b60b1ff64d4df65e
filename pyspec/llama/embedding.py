"""What :class:`pyspec.Llama` takes from outside pyspec's generation loop:
embeddings.

pyspec's core computes no embeddings. ``Llama(..., embedding=True)`` makes
``embed`` and ``create_embedding`` llama-cpp-python's own: a
``llama_cpp.Llama(embedding=True)`` on the same file (llama-cpp-python is
pyspec's dependency, and both use the one libllama: pyspec/_loader.py),
loaded on first use with the same context settings, its answers returned as
they are. Loading it installs llama-cpp-python's log callback for the process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .llama import Llama


def embedder(llm: "Llama") -> Any:
    """The ``llama_cpp.Llama`` that embeds for ``llm`` (loaded once)."""
    if not llm.embedding:
        raise RuntimeError("Llama model must be created with embedding=True to call this method")
    llm.model  # closed: RuntimeError
    if llm._embedder is None:
        import llama_cpp

        llm._embedder = llama_cpp.Llama(model_path=str(llm._path), embedding=True, verbose=llm.verbose,
                                        **llm._embed_args)
    return llm._embedder
