"""Comparing pyspec.Llama's answers with llama-cpp-python's by their shape
(tests/test_llama_compat.py, tests/test_llama_compat_scripts.py)."""

from __future__ import annotations

import numpy as np


def _kind(x):
    return float if isinstance(x, (float, np.floating)) else type(x)


def same_shape(a, b, path="$"):
    """Same keys, recursively, and the same types (llama-cpp-python's numpy
    float32 logprobs count as floats: pyspec's are Python floats). A
    completion's top_logprobs are maps from token text: only their values' types count."""
    if isinstance(b, dict) and path.endswith("logprobs.top_logprobs[]"):
        assert isinstance(a, dict) and all(_kind(v) is float for v in a.values()), path
    elif isinstance(b, dict):
        assert isinstance(a, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in b:
            same_shape(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, list):
        assert isinstance(a, list), f"{path}: {type(a).__name__} is not a list"
        for x, y in zip(a, b):
            same_shape(x, y, path + "[]")
    else:
        assert _kind(a) is _kind(b), f"{path}: {type(a).__name__} != {type(b).__name__} ({a!r}, {b!r})"
