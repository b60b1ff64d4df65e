"""pyspec: lossless speculative decoding over two GGUF models through llama.cpp.

>>> from pyspec import Model
>>> m = Model("qwen2.5-coder-1.5b")          # a path, or a default model name
>>> m.generate("Write hello world in C", max_tokens=64, temperature=0).text
"""

from . import _loader  # noqa: F401  (maps llama_cpp's libllama before _core loads)
from . import _core  # noqa: F401
from .errors import (
    ContextOverflowError,
    DecodeError,
    GPUOffloadUnavailableError,
    IncompatibleModelsError,
    InvalidModelError,
    ModelLoadError,
    ModelNotFoundError,
    PyspecError,
)
from .model import Model
from .speculative import SpeculativeDecoder
from .results import Completion, GenerationStats

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("pyspec-llama")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "Model",
    "SpeculativeDecoder",
    "Completion",
    "GenerationStats",
    "PyspecError",
    "ModelLoadError",
    "ModelNotFoundError",
    "InvalidModelError",
    "ContextOverflowError",
    "DecodeError",
    "GPUOffloadUnavailableError",
    "IncompatibleModelsError",
    "__version__",
]
