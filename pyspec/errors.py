"""The exceptions pyspec raises. The C++ core raises these same classes by name."""


class PyspecError(Exception):
    """Base class for every pyspec-specific error."""


class ModelLoadError(PyspecError):
    """A GGUF model could not be loaded."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """The model file does not exist (or is not a known default model name)."""


class InvalidModelError(ModelLoadError, ValueError):
    """The file is not a GGUF model, or it is truncated or corrupt."""


class ContextOverflowError(PyspecError, ValueError):
    """The tokens do not fit in the model's context window."""


class DecodeError(PyspecError, RuntimeError):
    """llama.cpp failed to evaluate a batch, or produced invalid (NaN) logits."""


class IncompatibleModelsError(PyspecError, ValueError):
    """The draft and target models do not share a vocabulary."""


class QuantizeError(PyspecError, RuntimeError):
    """llama.cpp could not quantize the model (its reason is the message)."""


class ConstraintError(PyspecError, ValueError):
    """A JSON schema, grammar or regex is invalid or unsupported (llguidance's
    reason in the message), or a tool definition or ``tool_choice`` is."""


class RpcError(ModelLoadError, ConnectionError):
    """An RPC worker (``rpc=[...]``, ``--rpc``) is malformed, unreachable, or this
    llama.cpp build has no RPC backend. The message names the endpoint. (A worker
    lost mid-generation ends the process with exit status 75 and one line naming
    it: ggml-rpc cannot recover in-process; docs/distributed.md#faults.)"""


class UnsupportedCPUError(ModelLoadError, RuntimeError):
    """The llama.cpp build uses an instruction set this CPU lacks (a wheel built
    on another machine): its first matmul would die of SIGILL (pyspec/cpu.py)."""


class GPUOffloadUnavailableError(PyspecError, ValueError):
    """GPU layers were asked for (``strict``), but this llama.cpp build has no GPU backend."""
