"""The Python face of one GGUF model: load it once, generate many times."""

from __future__ import annotations

import os
import random
import secrets
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core
from .chat import ChatTemplate
from .constraints import Grammars
from .cpu import check_instruction_sets, excluded_buffer_types
from ._native import native_property
from ._platform import physical_cores
from .errors import GPUOffloadUnavailableError, ModelNotFoundError
from .generation import Generator, Message, Prompt
from .memory import DEFAULT_CAP_MB, Memory
from .settings import SEED_BITS


def resolve_path(model: Union[str, os.PathLike]) -> str:
    """A file path as given, or a default model name pulled into the cache."""
    path = Path(os.fspath(model)).expanduser()
    if path.is_file():
        return str(path)
    if path.suffix == ".gguf" or os.sep in os.fspath(model):
        raise ModelNotFoundError(f"model file not found: {path}")
    from .models import resolve  # deferred: fetching code is only needed for names

    try:
        return str(resolve(model))
    except FileNotFoundError as e:
        raise ModelNotFoundError(str(e)) from None


# Flash attention: "auto" lets llama.cpp enable it where the device supports it.
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}

#: A model's settings as the core defaults them (n_ctx, n_batch, n_seq_max, ...).
MODEL_DEFAULTS = _core.ModelParams()

GPU_BUILD_HINT = (
    "install a GPU build of llama-cpp-python and rebuild pyspec against it: "
    "CMAKE_ARGS=\"-DGGML_CUDA=on\" pip install --no-cache-dir --force-reinstall --no-binary llama-cpp-python "
    "'llama-cpp-python==0.3.36', then `pip install --no-build-isolation .` in pyspec's source tree "
    "(docs/gpu.md; `pyspec info` shows the backends)"
)


def rpc_endpoints(rpc: Union[str, Sequence[str], None]) -> Tuple[str, ...]:
    """``rpc`` as a tuple of "host:port" endpoints: a list, or one comma-separated
    string (``--rpc``); None or empty: none. The core checks each one's form."""
    if rpc is None:
        return ()
    items = rpc.split(",") if isinstance(rpc, str) else list(rpc)
    return tuple(e.strip() for e in items if e.strip())


def check_gpu_offload(n_gpu_layers: int, strict: bool) -> None:
    """GPU layers on a build that cannot offload run on the CPU: say so (or refuse, when strict)."""
    if n_gpu_layers == 0 or _core.supports_gpu_offload():
        return
    message = (f"n_gpu_layers={n_gpu_layers} asks for GPU offload, but this llama.cpp build has no GPU backend "
               f"(llama_supports_gpu_offload() is false)")
    if strict:
        raise GPUOffloadUnavailableError(f"{message}; {GPU_BUILD_HINT}")
    warnings.warn(f"{message}, so the model runs on the CPU; {GPU_BUILD_HINT}", RuntimeWarning, stacklevel=3)


class Model(Generator):
    """A GGUF model loaded through llama.cpp, with its own context.

    ``model`` is a path to a ``.gguf`` file or the name (or alias: ``target``,
    ``draft``, ``test``) of a default model (``pyspec models list``), which is
    pulled on first use. ``generate``/``stream`` decode plainly; wrap two models
    in :class:`~pyspec.SpeculativeDecoder` for speculative decoding. ``seed``
    makes the sequence of generations that pass no seed reproducible (each call
    still draws a new sample); by default every such call is freshly random.
    A Model may be shared by threads and decoders: they take turns on its context.

    ``flash_attn`` is "auto" (llama.cpp enables it where the device supports it,
    the CPU included; see ``cpp/model/model.cpp``), "on" or "off"; :attr:`flash_attn` tells what the context runs. ``n_gpu_layers``
    on a build without a GPU backend warns (the model runs on the CPU), or with
    ``strict=True`` raises :class:`~pyspec.GPUOffloadUnavailableError`.

    ``rpc`` (``["host:port", ...]`` or one comma-separated string) puts the
    model's layers on ggml RPC workers (``pyspec rpc-server`` on each machine;
    docs/distributed.md): all of them unless ``n_gpu_layers`` says how many,
    split as llama.cpp splits them, or by ``tensor_split`` (a share
    per worker, then per local GPU). An unreachable worker raises
    :class:`~pyspec.RpcError` naming it. ``local_output=True`` keeps the
    output layer here: the workers send back hidden states, not the
    vocabulary's logits (docs/distributed.md). ``repack=False`` keeps llama.cpp from
    repacking weights for this CPU's faster kernels: slower, but its rows are
    then bit-identical to a CPU worker's (which never repacks). On a CPU whose AMX
    instructions fault (a probe finds out once per machine: pyspec/cpu.py), the
    AMX layout is left out and the other repacked kernels kept;
    :attr:`weight_buffers` tells where the weights went.

    :attr:`memory` (a :class:`~pyspec.Memory` of ``memory_mb``; 0: none) keeps
    the prompts and answers of its generations, and of decoders over it, for
    the ``suffix`` drafter (docs/drafters.md#suffix).

    Chats are rendered by the file's own Jinja chat template, as llama-server
    and transformers render it (pyspec/chat/templates.py); ``chat_template`` (a file path
    or Jinja source) overrides it.
    """

    def __init__(
        self,
        model: Union[str, os.PathLike],
        *,
        n_ctx: int = MODEL_DEFAULTS.n_ctx,
        n_threads: Optional[int] = None,
        n_gpu_layers: int = MODEL_DEFAULTS.n_gpu_layers,
        n_batch: int = MODEL_DEFAULTS.n_batch,
        seed: Optional[int] = None,
        verbose: bool = MODEL_DEFAULTS.verbose,
        flash_attn: str = "auto",
        strict: bool = False,
        n_seq_max: Optional[int] = None,
        memory_mb: float = DEFAULT_CAP_MB,
        chat_template: Union[str, os.PathLike, None] = None,
        rpc: Union[str, Sequence[str], None] = None,
        tensor_split: Optional[Sequence[float]] = None,
        repack: bool = True,
        local_output: bool = False,
    ) -> None:
        # The core validates the numbers; here only what Python adds: None and names.
        if n_threads is not None and n_threads < 1:
            raise ValueError(f"n_threads must be >= 1 (None: physical cores), got {n_threads}")
        if flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of 'auto', 'on', 'off', got {flash_attn!r}")
        rpc = rpc_endpoints(rpc)
        if rpc and n_gpu_layers == 0:
            n_gpu_layers = -1  # workers were named to hold the layers: all of them
        if not rpc:
            check_gpu_offload(n_gpu_layers, strict)
        path = resolve_path(model)
        check_instruction_sets()  # a wheel built for another CPU: a clear error, not SIGILL
        self._core = _core.Model(_core.ModelParams(
            path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads or physical_cores(),
            n_gpu_layers=n_gpu_layers,
            n_batch=n_batch,
            verbose=verbose,
            flash_attn=FLASH_ATTN[flash_attn],
            # Room for generate(n=...) costs nothing until used (one unified cache);
            # a sequence needs a row of a batch, hence n_batch's bound.
            n_seq_max=min(MODEL_DEFAULTS.n_seq_max, n_batch) if n_seq_max is None else n_seq_max,
            rpc=list(rpc),
            tensor_split=[float(x) for x in tensor_split or ()],
            repack=repack,
            # AMX where its instructions fault here (pyspec/cpu.py): the other repacked kernels stay.
            excluded_buffer_types=excluded_buffer_types() if repack else [],
            local_output=local_output,
        ))
        self._engine = _core.Engine(self._core)
        #: Its compiled constraints (JSON schemas, grammars, regexes) and the vocabulary they need.
        self.grammars = Grammars(self._core)
        # Seeds of generations that pass none: fresh entropy, or with `seed` a
        # reproducible sequence (a new sample each call, the same run each time).
        self._seeds = random.Random(seed) if seed is not None else None
        # What its generations (and decoders' over it) said, for suffix drafting; 0 MB: none.
        if memory_mb < 0:
            raise ValueError(f"memory_mb must be >= 0 (0: no memory), got {memory_mb}")
        self.memory: Optional[Memory] = Memory(memory_mb) if memory_mb > 0 else None
        #: How chats become prompts: the file's Jinja template, or ``chat_template``.
        self.chat_template = ChatTemplate.of_model(self._core, override=chat_template)
        if chat_template is not None:
            self.chat_template.check()  # one given on purpose: fail now, not at the first chat

    @property
    def native(self) -> "_core.Model":
        """The C++ model (``pyspec._core.Model``) that engines, drafters and tools take."""
        return self._core

    def next_seed(self) -> int:
        """The seed of a generation that passes none: fresh entropy, or the next
        of the sequence that this model's ``seed`` started."""
        rng = self._seeds
        return rng.getrandbits(SEED_BITS) if rng is not None else secrets.randbits(SEED_BITS)

    @property
    def target(self) -> "Model":
        """A plain model generates from its own distribution."""
        return self

    def clear_cache(self) -> None:
        for seq in range(self._core.n_seq):  # every sequence of the context
            self._core.truncate(0, seq)

    # ------------------------------------------------------------ facts
    path = native_property[str]("path", "The GGUF file the model was loaded from.")
    n_vocab = native_property[int]("n_vocab", "Tokens in the vocabulary.")
    n_ctx = native_property[int]("n_ctx", "Cells of the context, shared by all its sequences.")
    n_seq_max = native_property[int]("n_seq",
                                     "Sequences one batch may hold (``generate(n=...)``); they share the n_ctx cells.")

    @property
    def weight_buffers(self) -> Dict[str, float]:
        """MiB of its weights per buffer type, as llama.cpp placed them ("CPU_Mapped",
        "CPU_REPACK", "AMX", "CUDA0", ...)."""
        out: Dict[str, float] = {}
        for name, mib in self._core.weight_buffers:
            out[name] = out.get(name, 0.0) + mib
        return out

    @property
    def rpc(self) -> Tuple[str, ...]:
        """The RPC workers holding its layers ("host:port"), in order; () when local."""
        return tuple(self._core.rpc)

    @property
    def n_gpu_layers(self) -> int:
        """Layers asked to be offloaded (-1: all), as the context was loaded."""
        return self._core.n_gpu_layers

    @property
    def flash_attn(self) -> str:
        """Flash attention as this model's context runs it: "on" or "off" ("auto"
        only if llama.cpp did not report what its auto setting chose)."""
        return {1: "on", 0: "off"}.get(self._core.flash_attn, "auto")

    description = native_property[str]("description", "llama.cpp's description: architecture, size, quantization.")

    def __repr__(self) -> str:
        return f"Model({self.path!r}, n_ctx={self.n_ctx})"

    # ------------------------------------------------------------ text
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> List[int]:
        """Token ids of ``text``; ``add_special`` adds BOS where the model wants it."""
        return list(self._core.tokenize(text, add_special, parse_special))

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of ``tokens``; control tokens are rendered only with ``special``."""
        return self._core.detokenize(list(tokens), special).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Message], *, add_assistant: bool = True,
                            tools: Optional[Sequence[Mapping[str, Any]]] = None,
                            variables: Optional[Mapping[str, Any]] = None) -> str:
        """Format ``messages`` ({"role", "content", ...} dicts) with the model's own
        chat template, rendered by Jinja as llama-server and transformers do
        (pyspec/chat/templates.py); ``add_assistant`` opens the assistant's turn (or, after
        a final assistant message, continues it); ``tools`` and ``variables``
        (``chat_template_kwargs``) go to the template."""
        return self.chat_template.render(messages, add_generation_prompt=add_assistant, tools=tools,
                                         variables=variables)

    def prompt_tokens(self, prompt: Prompt, *, chat: bool = True,
                      tools: Optional[Sequence[Mapping[str, Any]]] = None,
                      variables: Optional[Mapping[str, Any]] = None) -> List[int]:
        """Token ids for a prompt: a string (wrapped as one user message when
        ``chat``), a list of chat messages (always templated, with ``tools`` and
        ``variables``), or token ids (as is)."""
        if not isinstance(prompt, str) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, str):
            text = self.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
        else:
            text = self.apply_chat_template(prompt, tools=tools, variables=variables)
        # Templates write control tokens as text; parse them back into tokens.
        tokens = self.tokenize(text, add_special=True, parse_special=True)
        if not tokens:
            raise ValueError("the prompt is empty")
        return tokens
