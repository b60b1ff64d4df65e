"""How :class:`pyspec.Llama` loads: its generator from llama-cpp-python's
``draft_model`` (speculation on by default), its ``chat_format`` (the
GGUF's template or a named format of chat_formats.py), and ``from_pretrained``'s names.
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Dict, Optional

from ..generation import Generator
from ..model import Model
from ..speculative import SpeculativeDecoder
from . import chat_formats, options


def draft_model(value: Any, load: Dict[str, Any]) -> Optional[Model]:
    """The draft *model* that ``draft_model`` names (a path, a default-model
    name, or a :class:`~pyspec.Model`), loaded with the target's settings;
    None for none or for a prompt-lookup drafter."""
    if value is None or is_prompt_lookup(value):
        return None
    if isinstance(value, Model):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Model(value, **load)
    raise TypeError(f"draft_model={type(value).__name__}: pyspec drafts in C++ and takes "
                    f"llama_cpp.LlamaPromptLookupDecoding, a draft GGUF's path or default-model name, "
                    f"or a pyspec.Model; a Python LlamaDraftModel does not run")


def generator(target: Model, draft: Optional[Model], value: Any, drafter: Optional[str], policy: str,
              draft_max: Optional[int]) -> Generator:
    """Speculative by default: lookup drafting (``suffix``) without a draft
    model, ``ngram`` for llama-cpp-python's prompt lookup (its n-gram size
    and draft length), ``hybrid`` with a draft model; plain with ``draft_max=0``."""
    if draft_max == 0:
        if value is not None:
            raise ValueError("draft_max=0 decodes plainly: it takes no draft_model")
        return target
    if draft is not None:
        return SpeculativeDecoder(target, draft, drafter=drafter, policy=policy, draft_max=draft_max)
    if value is not None:  # LlamaPromptLookupDecoding
        return SpeculativeDecoder(target, drafter=drafter or "ngram", policy=policy, ngram_min=1,
                                  ngram_max=int(value.max_ngram_size),
                                  draft_max=int(value.num_pred_tokens) if draft_max is None else draft_max)
    return SpeculativeDecoder(target, drafter=drafter or "suffix", policy=policy, draft_max=draft_max)


def is_prompt_lookup(obj: Any) -> bool:
    """llama_cpp.LlamaPromptLookupDecoding (by its class, without importing llama_cpp)."""
    return any(c.__name__ == "LlamaPromptLookupDecoding" and c.__module__.startswith("llama_cpp")
               for c in type(obj).__mro__)


def chat_format(name: Optional[str]) -> str:
    """The chat format of ``chat_format=name``: None and "chat_template.default"
    are the GGUF's own template (as llama-server renders it), a name of
    chat_formats.py renders as llama-cpp-python's format of that name; any
    other is a ValueError that lists them."""
    if name is None or name == "chat_template.default":
        return "chat_template.default"
    return chat_formats.check(name)


def pretrained(repo_id: str, filename: Optional[str], **where: Any) -> str:
    """The default model's name that ``from_pretrained(repo_id, filename)`` names."""
    from ..models import UnknownModelError, lookup

    try:
        spec = lookup(repo_id)
    except UnknownModelError as e:
        raise ValueError(f"{e}. pyspec.Llama.from_pretrained knows pyspec's default models only; for a "
                         f"Hugging Face repository download the file (huggingface_hub.hf_hub_download) and "
                         f"give Llama(model_path=...)") from None
    if filename is not None and not fnmatch.fnmatch(spec.filename, filename):
        raise ValueError(f"No file found in {repo_id} that match {filename}\n\nAvailable Files:\n"
                         f"[\"{spec.filename}\"]")
    for name, value in where.items():
        if value:
            options.refuse(name, value, "default models live in pyspec's cache ($PYSPEC_MODELS)")
    return spec.name
