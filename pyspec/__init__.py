"""pyspec: lossless speculative decoding over two GGUF models through llama.cpp.

>>> from pyspec import Model
>>> m = Model("qwen2.5-coder-1.5b")          # a path, or a default model name
>>> m.generate("Write hello world in C", max_tokens=64, temperature=0).text
"""

from . import _loader  # noqa: F401  (maps llama_cpp's libllama before _core loads)

try:
    from . import _core  # noqa: F401
except ImportError:  # pragma: no cover - depends on how Python was started
    import pathlib as _pathlib

    _here = _pathlib.Path(__file__).resolve().parent
    if not any(_here.glob("_core*")):
        raise ImportError(
            f"pyspec's compiled core (pyspec._core) is not in {_here}: Python imported the source "
            "folder of a pyspec checkout (the current directory comes first on sys.path) instead of "
            "the installed package. Run from another directory, or install the checkout for "
            "development with `pip install -e .` (which builds the core in place)."
        ) from None
    raise
from .constraints import Constraint
from .errors import (
    ConstraintError,
    ContextOverflowError,
    DecodeError,
    GPUOffloadUnavailableError,
    IncompatibleModelsError,
    InvalidModelError,
    ModelLoadError,
    ModelNotFoundError,
    PyspecError,
    RpcError,
    UnsupportedCPUError,
)
from .memory import Memory
from .model import Model
from .speculative import SpeculativeDecoder
from .results import BatchStats, Completion, Completions, GenerationStats
from .sampling import Sampling
from .drafting import Drafting
from .llama.llama import Llama
from .embedding import Embedder

#: Set from another thread to stop a generation (``generate(..., cancel=token)``).
CancelToken = _core.CancelToken

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("pyspec-llama")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "Memory",
    "Model",
    "SpeculativeDecoder",
    "Sampling",
    "Drafting",
    "Llama",
    "Embedder",
    "Constraint",
    "Completion",
    "Completions",
    "GenerationStats",
    "BatchStats",
    "CancelToken",
    "PyspecError",
    "ModelLoadError",
    "ModelNotFoundError",
    "InvalidModelError",
    "ContextOverflowError",
    "ConstraintError",
    "DecodeError",
    "GPUOffloadUnavailableError",
    "RpcError",
    "UnsupportedCPUError",
    "IncompatibleModelsError",
    "__version__",
]
