"""``pyspec.Llama``: llama-cpp-python's ``Llama`` (0.3.36) over pyspec, with
speculative decoding on by default.

This module is the class: loading (the constructor's arguments mapped onto
:class:`~pyspec.Model` and :class:`~pyspec.SpeculativeDecoder`), tokens,
state, seeds and life cycle. A call's work is elsewhere: completion.py
(``create_completion``, ``__call__``), chat.py (``create_chat_completion``),
embedding.py (``embed``, ``create_embedding``); loading.py the generator
and ``chat_format``; options.py holds the
arguments pyspec has no counterpart for. What maps and what differs:
docs/python.md#coming-from-llama-cpp-python.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .. import _core
from ..errors import ModelNotFoundError
from ..generation import Generator
from ..model import Model, resolve_path
from ..request import seed_of
from ..results import GenerationStats
from ..embedding import Embedder
from . import chat, completion, loading, options
from . import embedding as embedding_calls  # `embedding` is the constructor's flag
from .options import LLAMA_DEFAULT_SEED


class ModelPathError(ModelNotFoundError, ValueError):
    """``model_path`` names no file and no default model (a ValueError, as in llama-cpp-python)."""


@dataclass
class LlamaState:
    """What :meth:`Llama.save_state` keeps: each model's cache of sequence 0
    (its tokens and llama.cpp's bytes: the target's, then the draft model's)
    and the seed chain. ``input_ids``, ``n_tokens``, ``llama_state`` and
    ``llama_state_size`` read as llama-cpp-python's ``LlamaState`` (the target's)."""

    parts: List[Tuple[List[int], bytes]]
    seed: int
    input_ids: List[int] = field(init=False)
    n_tokens: int = field(init=False)
    llama_state: bytes = field(init=False)
    llama_state_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.input_ids = list(self.parts[0][0])
        self.n_tokens = len(self.input_ids)
        self.llama_state = self.parts[0][1]
        self.llama_state_size = len(self.llama_state)


class Llama:
    """llama-cpp-python's ``Llama``, generating with pyspec: the same
    constructor, methods, defaults and response dictionaries, and speculative
    decoding on by default (the output keeps the model's distribution
    exactly; docs/python.md#coming-from-llama-cpp-python).

    Drafting: without ``draft_model``, lookup drafting (pyspec's ``suffix``
    drafter: the prompt, the answer so far and earlier answers) under the
    ``auto`` policy, which drafts only where it measures a gain;
    ``draft_model=LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens)``
    is the ``ngram`` drafter (n-grams 1..max_ngram_size, drafts of at most
    num_pred_tokens); a GGUF path or default-model name (or a
    :class:`pyspec.Model`) is a draft model (the ``hybrid`` drafter). pyspec's
    own keywords: ``drafter``, ``policy`` and ``draft_max`` (0: plain decoding).
    """

    def __init__(
        self,
        model_path: str,
        *,
        n_gpu_layers: int = 0,
        tensor_split: Optional[List[float]] = None,
        seed: int = LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: Optional[int] = None,
        n_threads_batch: Optional[int] = None,
        pooling_type: int = -1,
        logits_all: bool = False,
        embedding: bool = False,
        flash_attn: Union[bool, str] = False,
        no_perf: bool = False,
        last_n_tokens_size: int = 64,
        chat_format: Optional[str] = None,
        chat_handler: Any = None,
        draft_model: Any = None,
        verbose: bool = True,
        drafter: Optional[str] = None,
        policy: str = "auto",
        draft_max: Optional[int] = None,
        **fixed: Any,
    ) -> None:
        options.check_fixed(fixed)
        if pooling_type != -1 and not embedding:
            options.refuse("pooling_type", pooling_type, "it only shapes embeddings (give embedding=True)")
        pooling = embedding_calls.check_pooling(pooling_type)
        if chat_handler is not None:
            options.refuse("chat_handler", chat_handler, "pyspec renders chats with the GGUF's own Jinja template "
                           "(as llama-server does); Python chat handlers (LLaVA, functionary ...) do not run")
        chat_format = loading.chat_format(chat_format)
        if isinstance(flash_attn, bool):
            flash = "on" if flash_attn else "off"
        elif flash_attn in ("auto", "on", "off"):
            flash = flash_attn
        else:
            raise ValueError(f"flash_attn must be a bool (or pyspec's 'auto', 'on', 'off'), got {flash_attn!r}")
        if n_threads_batch is not None and n_threads_batch != n_threads:
            options.refuse("n_threads_batch", n_threads_batch, "pyspec runs prompts and generation with one thread "
                           "count: give n_threads (n_threads_batch only equal to it)")
        if not isinstance(last_n_tokens_size, int):
            raise ValueError(f"last_n_tokens_size must be an int, got {last_n_tokens_size!r}")
        try:
            path = resolve_path(model_path)
        except ModelNotFoundError:
            raise ModelPathError(f"Model path does not exist: {model_path}") from None
        self.model_path = model_path
        self.verbose = verbose
        self.last_n_tokens_size = last_n_tokens_size
        self.draft_model = draft_model
        self.chat_handler = None
        self.cache = None
        self._path = path
        self._metadata: Optional[Dict[str, str]] = None
        if n_ctx == 0:  # llama-cpp-python: the context the model was trained with
            n_ctx = int(self.metadata.get(f"{self.metadata.get('general.architecture', '')}.context_length", 0))
            if n_ctx <= 0:
                raise ValueError(f"n_ctx=0: {path} does not say its training context; give n_ctx")
        # pyspec has one batch size, the physical one: llama-cpp-python's
        # min(n_batch, n_ubatch) (a batch size changes speed, never the output).
        self.n_batch = min(n_ctx, n_batch, n_ubatch)
        self._load = dict(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_batch=self.n_batch,
                          verbose=verbose, flash_attn=flash, tensor_split=tensor_split, n_seq_max=1)
        self._target: Optional[Model] = Model(path, **self._load)
        self.n_threads = self._target.native.n_threads
        self._draft: Optional[Model] = loading.draft_model(draft_model, self._load) if draft_max != 0 else None
        self._generator: Optional[Generator] = loading.generator(self._target, self._draft, draft_model, drafter,
                                                                 policy, draft_max)
        self._seed = seed or LLAMA_DEFAULT_SEED  # llama-cpp-python's seed chain (see _call_seed)
        self.chat_format = chat_format
        self._logits_all = logits_all
        self.embedding = embedding
        # The embedder's context (embedding.py), made on first use: llama-cpp-python's embedding context.
        self._embed_args = dict(n_ctx=n_ctx, n_batch=self.n_batch, n_threads=self.n_threads, pooling=pooling,
                                flash_attn=flash)
        self._embedder: Optional[Embedder] = None
        #: pyspec's figures of the last call (drafted, accepted, timings ...): :class:`~pyspec.GenerationStats`.
        self.last_stats: Optional[GenerationStats] = None
        self._last: Any = None  # the last call's Completion (tests read its tokens)

    # ------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, repo_id: str, filename: Optional[str] = None, additional_files: Optional[List] = None,
                        local_dir: Any = None, local_dir_use_symlinks: Any = "auto", cache_dir: Any = None,
                        **kwargs: Any) -> "Llama":
        """A Llama of one of pyspec's default models (``pyspec models list``:
        a name or alias such as ``"test"``, ``"target"``), pulled into pyspec's
        cache on first use; ``filename`` (a glob), if given, must match its file.
        Hugging Face repositories are not fetched: download the file and pass
        ``model_path``."""
        name = loading.pretrained(repo_id, filename, additional_files=additional_files, local_dir=local_dir,
                                  cache_dir=cache_dir)
        return cls(model_path=name, **kwargs)

    # ------------------------------------------------------------ generation
    def create_completion(self, prompt: Union[str, List[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None,
                          echo: bool = False, stop: Optional[Union[str, List[str]]] = [],
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                          repeat_penalty: float = 1.0, top_k: int = 40, stream: bool = False,
                          seed: Optional[int] = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                          stopping_criteria: Any = None, logits_processor: Any = None, grammar: Any = None,
                          logit_bias: Optional[Dict[int, float]] = None) -> Union[dict, Iterator[dict]]:
        """Generate text from a prompt (llama-cpp-python's arguments and
        defaults): a ``text_completion`` dict, or with ``stream`` an iterator
        of its chunks. ``suffix`` fills in between ``prompt`` and it with the
        model's FIM tokens."""
        options.check_call(typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                           logits_processor=logits_processor, stopping_criteria=stopping_criteria)
        call = completion.prepare(
            self, prompt, suffix=suffix, max_tokens=max_tokens, logprobs=logprobs, echo=echo, stop=stop,
            seed=seed, model=model, constraint=options.grammar_constraint(grammar),
            sampling=self._sampling(temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                    presence_penalty, logit_bias))
        return completion.stream(self, call) if stream else completion.whole(self, call)

    def __call__(self, prompt: Union[str, List[int]], *args: Any, **kwargs: Any) -> Union[dict, Iterator[dict]]:
        """:meth:`create_completion` (the same arguments, in the same order)."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages: List[Dict[str, Any]], functions: Optional[List[dict]] = None,
                               function_call: Any = None, tools: Optional[List[dict]] = None,
                               tool_choice: Any = None, temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: Optional[Union[str, List[str]]] = [], seed: Optional[int] = None,
                               response_format: Optional[dict] = None, max_tokens: Optional[int] = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                               logits_processor: Any = None, grammar: Any = None,
                               logit_bias: Optional[Dict[Any, float]] = None, logprobs: Optional[bool] = None,
                               top_logprobs: Optional[int] = None) -> Union[dict, Iterator[dict]]:
        """Answer a chat (llama-cpp-python's arguments and defaults), rendered
        by the GGUF's own chat template, or by the named ``chat_format`` as
        llama-cpp-python renders it (chat_formats.py): a ``chat.completion``
        dict, or with ``stream`` an iterator of ``chat.completion.chunk``
        dicts. Tool calls are parsed out of the answer in the template's
        format; a named ``tool_choice`` (or "required") makes the answer a call."""
        options.check_call(typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                           logits_processor=logits_processor)
        request = chat.prepare(self, messages, functions=functions, function_call=function_call, tools=tools,
                               tool_choice=tool_choice, response_format=response_format, grammar=grammar)
        call = completion.prepare(
            self, request.tokens, max_tokens=max_tokens, logprobs=(top_logprobs or 0) if logprobs else None,
            echo=False, stop=request.stops(stop), seed=seed, model=model, constraint=request.constraint,
            sampling=self._sampling(temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty,
                                    presence_penalty, logit_bias))
        return chat.stream(self, request, call) if stream else chat.whole(self, request, call)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`create_chat_completion` as the ``openai`` package's types."""
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**c) for c in self.create_chat_completion(*args, **kwargs))
        return ChatCompletion(**self.create_chat_completion(*args, **kwargs))

    def create_embedding(self, input: Union[str, List[str]], model: Optional[str] = None) -> dict:
        """Embed a string or a list of them (``embedding=True``): llama-cpp-python's
        response dict, computed by pyspec's core (embedding.py)."""
        return embedding_calls.create_embedding(self, input, model)

    def embed(self, input: Union[str, List[str]], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """Embed a string (one vector) or a list of them (``embedding=True``), as
        llama-cpp-python does, computed by pyspec's core (embedding.py);
        ``return_count`` adds the number of tokens embedded."""
        return embedding_calls.embed(self, input, normalize=normalize, truncate=truncate, return_count=return_count)

    def _sampling(self, temperature, top_k, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty,
                  logit_bias):
        return options.sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logit_bias=logit_bias,
                                last_n_tokens_size=self.last_n_tokens_size)

    @property
    def generator(self) -> Generator:
        """The pyspec generator behind it (a :class:`~pyspec.SpeculativeDecoder`,
        or the :class:`~pyspec.Model` with ``draft_max=0``)."""
        if self._generator is None:
            raise RuntimeError("this Llama is closed")
        return self._generator

    @property
    def model(self) -> Model:
        """The target :class:`~pyspec.Model` (llama-cpp-python's ``model`` is a C pointer)."""
        if self._target is None:
            raise RuntimeError("this Llama is closed")
        return self._target

    # ------------------------------------------------------------ seeds
    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def _call_seed(self, seed: Optional[int]) -> Optional[int]:
        """A call's seed, as llama-cpp-python chooses it: the one given, else the
        next of a chain that the constructor's ``seed`` (and ``set_seed``,
        ``load_state``) starts, so that a script's unseeded calls repeat from
        run to run. -1 and LLAMA_DEFAULT_SEED mean a fresh random seed: None
        (pyspec/request.py's ``seed_of``, the one home of that rule)."""
        seed = seed if seed is not None else random.Random(self._seed).randint(0, 2**32)
        self._seed = seed
        return seed_of(seed)

    # ------------------------------------------------------------ tokens
    def tokenize(self, text: Union[bytes, str], add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of UTF-8 ``text``; ``add_bos`` adds the vocabulary's BOS
        (and EOS) where it asks for them; ``special`` parses control tokens."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return list(self.model.native.tokenize(text, add_bos, special))

    def detokenize(self, tokens: Sequence[int], prev_tokens: Optional[Sequence[int]] = None,
                   special: bool = False) -> bytes:
        """The bytes of ``tokens``, piece by piece (``prev_tokens`` changes
        nothing, as in llama-cpp-python's own tokenizer); the space a leading
        BOS leaves is dropped."""
        core = self.model.native
        out = b"".join(core.token_to_piece(int(t), special) for t in tokens)
        if tokens and tokens[0] == core.bos and out[:1] == b" ":
            out = out[1:]
        return out

    @property
    def n_tokens(self) -> int:
        """Tokens the target's cache holds (llama-cpp-python's ``n_tokens``)."""
        return len(self.model.native.cached(0))

    def n_ctx(self) -> int:
        return self.model.n_ctx

    def n_vocab(self) -> int:
        return self.model.n_vocab

    def token_bos(self) -> int:
        return self.model.native.bos

    def token_eos(self) -> int:
        return self.model.native.eos

    @property
    def metadata(self) -> Dict[str, str]:
        """The GGUF's metadata as llama.cpp reads it (key -> value as text), read once."""
        if self._metadata is None:
            self._metadata = dict(_core.gguf_metadata(str(self._path)))
        return self._metadata

    # ------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget the cached prompt: the next call processes all of it."""
        self.generator.clear_cache()

    def save_state(self) -> LlamaState:
        """Every model's cache (sequence 0) and the seed chain; :meth:`load_state`
        puts them back, and a later call whose prompt starts with the cached
        tokens processes only the rest."""
        models = [self.model.native] + ([self._draft.native] if self._draft is not None else [])
        return LlamaState([(list(m.cached(0)), m.save_state(0)) for m in models], seed=self._seed)

    def load_state(self, state: LlamaState) -> None:
        models = [self.model.native] + ([self._draft.native] if self._draft is not None else [])
        if not isinstance(state, LlamaState) or len(state.parts) != len(models):
            raise TypeError("load_state takes a LlamaState that save_state of a Llama with the same models made")
        for m, (tokens, data) in zip(models, state.parts):
            if not tokens:  # an empty cache: nothing to put back
                m.truncate(0, 0)
            elif not m.load_state(0, data, tokens):
                raise RuntimeError("Failed to set llama state data (a state of another model or context size?)")
        self._seed = state.seed

    # ------------------------------------------------------------ life cycle
    def close(self) -> None:
        """Free the models now (later calls raise RuntimeError)."""
        self._generator = self._target = self._draft = None
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"pyspec.Llama(model_path={self.model_path!r}, generator={self._generator!r})"

    # ------------------------------------------------------------ not in pyspec
    def eval(self, tokens: Sequence[int]) -> None:
        raise NotImplementedError(_LOW_LEVEL)

    def sample(self, *args: Any, **kwargs: Any) -> int:
        raise NotImplementedError(_LOW_LEVEL)

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[int]:
        raise NotImplementedError(_LOW_LEVEL)

    def set_cache(self, cache: Any) -> None:
        if cache is not None:
            raise NotImplementedError("set_cache: pyspec keeps its own prompt cache (a later call reuses the cached "
                                      "prefix); save_state/load_state keep and restore it")


_LOW_LEVEL = ("pyspec.Llama has no token-level loop (eval, sample, generate): its loop drafts and verifies in C++. "
              "Use create_completion(..., stream=True), or pyspec.Model / SpeculativeDecoder")



Llama.__call__.__signature__ = inspect.signature(Llama.create_completion)  # type: ignore[attr-defined]
