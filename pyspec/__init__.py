"""pyspec: lossless speculative decoding over GGUF models (placeholder)."""
from . import _loader  # noqa: F401  (must run before pyspec._core is imported)
