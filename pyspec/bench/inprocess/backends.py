"""The things a benchmark compares. Each runner generates from the same prompt
tokens with the same settings and reports the same measurements."""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ...generation import Generator
from ...sampling import Sampling


@dataclass
class Settings:
    """The bench's settings: greedy unless asked (so that every runner produces
    comparable text)."""

    max_tokens: int = 128
    sampling: Sampling = Sampling.GREEDY
    seed: int = 0


@dataclass
class Sample:
    """One generation by one runner."""

    runner: str
    prompt_id: str
    category: str
    n_prompt: int
    n_generated: int
    ttft_s: float
    decode_s: float  # first token -> last token
    extra: Dict[str, Any] = field(default_factory=dict)  # drafting statistics

    @property
    def decode_tokens(self) -> int:
        return max(self.n_generated - 1, 0)


class PyspecRunner:
    """pyspec's own loop: plain (a Model) or speculative (a SpeculativeDecoder
    with ``draft_max`` and any other per-call drafting arguments)."""

    def __init__(self, generator: Generator, name: str, **draft_kwargs) -> None:
        self.generator = generator
        self.name = name
        self.draft_kwargs = draft_kwargs

    def run(self, tokens: List[int], s: Settings, constraint=None) -> Sample:
        """One generation; under a ``constraint`` its text and stop reason are
        kept too (the bench checks each answer)."""
        # Runners share models; start from empty caches so that every runner
        # processes the prompt (time to first token stays comparable).
        self.generator.clear_cache()
        out = self.generator.generate(tokens, max_tokens=s.max_tokens, sampling=s.sampling, seed=s.seed,
                                      constraint=constraint, **self.draft_kwargs)
        st = out.stats
        extra = st.to_dict()
        if constraint is not None:
            extra.update(text=out.text, stop_reason=out.stop_reason)
        return Sample(self.name, "", "", len(tokens), st.n_generated, st.ttft_s, st.decode_s, extra)


@contextlib.contextmanager
def _without_faulting_kernels():
    """Where AMX faults here (pyspec/cpu.py), llama-cpp-python's Llama loads with
    no extra buffer types (it has no argument for it, nor for leaving one out:
    its model defaults are patched while it loads), so that the baseline runs,
    without repacked weights, instead of killing the bench; said once."""
    from ... import cpu

    if not cpu.excluded_buffer_types():
        yield
        return
    import llama_cpp.llama_cpp as lib

    warnings.warn(f"pyspec: llama-cpp-python runs without repacked weights: {cpu.verdict().buffer_type} is "
                  f"unusable on this CPU ({cpu.verdict().reason}), and its Llama can only leave out all of them")
    defaults = lib.llama_model_default_params

    def without_extra_buffer_types():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffer_types
    try:
        yield
    finally:
        lib.llama_model_default_params = defaults


class LlamaCppRunner:
    """llama-cpp-python's ``Llama.create_completion``, optionally with its
    prompt-lookup drafter. Streams so that time to first token is visible.
    ``flash_attn`` is llama-cpp-python's bool (its default is off; pass what the
    pyspec side runs, so that both compute the same numerics); ``n_gpu_layers``
    as pyspec's (-1 = all), so that both run on the same device."""

    def __init__(self, model_path: str, *, n_ctx: int, n_threads: int, n_batch: int = 512,
                 flash_attn: bool = False, n_gpu_layers: int = 0, prompt_lookup: Optional[int] = None,
                 name: Optional[str] = None) -> None:
        import llama_cpp

        draft = None
        if prompt_lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup)
        with _without_faulting_kernels():
            self.llm = llama_cpp.Llama(model_path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                                       n_batch=n_batch, flash_attn=flash_attn, n_gpu_layers=n_gpu_layers,
                                       draft_model=draft, verbose=False)
        self.name = name or ("llama-cpp-python lookup" if prompt_lookup else "llama-cpp-python")

    def run(self, tokens: List[int], s: Settings) -> Sample:
        self.llm.reset()  # no prompt reuse between runs: same work as the others
        t0 = time.perf_counter()
        t_first = t_last = None
        finish = None
        for chunk in self.llm.create_completion(tokens, max_tokens=s.max_tokens, **s.sampling.to_dict(),
                                                seed=s.seed, stream=True):
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            t_last = now
            finish = chunk["choices"][0].get("finish_reason") or finish
        # Generated tokens: everything the context holds past the prompt, plus the
        # last sampled token, which is never evaluated when the length limit stops it.
        n_gen = self.llm.n_tokens - len(tokens) + (1 if finish == "length" else 0)
        t_first = t_first or time.perf_counter()
        return Sample(self.name, "", "", len(tokens), n_gen, t_first - t0, (t_last or t_first) - t_first)
