"""The things a benchmark compares. Each runner generates from the same prompt
tokens with the same settings and reports the same measurements."""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ...compute import llama_cpp_on_compute_thread
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

    def run(self, tokens: List[int], s: Settings, constraint=None) -> Sample:
        if constraint is not None:
            raise ValueError(f"{self.name} runs free text only: leave out the constrained categories")
        self.llm.reset()  # no prompt reuse between runs: same work as the others
        sp = s.sampling
        if sp.penalized and (sp.penalty_last_n != self.llm.last_n_tokens_size or sp.penalize_prompt):
            # its window is the constructor's, over the generated tokens only
            raise ValueError("llama-cpp-python penalises the last last_n_tokens_size generated tokens: "
                             "use penalty_last_n=64, penalize_prompt=False")
        call = dict(max_tokens=s.max_tokens, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                    min_p=sp.min_p, repeat_penalty=sp.repeat_penalty, frequency_penalty=sp.frequency_penalty,
                    presence_penalty=sp.presence_penalty, logit_bias=dict(sp.logit_bias) or None, seed=s.seed)
        times: List[float] = []
        finish: Optional[str] = None
        # Its graphs on pyspec's compute thread: a second OpenMP team in this
        # process would throttle both sides' barriers (pyspec/compute.py).
        t0 = time.perf_counter()
        with llama_cpp_on_compute_thread():
            for chunk in self.llm.create_completion(tokens, stream=True, **call):
                times.append(time.perf_counter())
                finish = chunk["choices"][0].get("finish_reason") or finish
        n_gen = self._generated(tokens, finish)
        t_first = times[0] if times else time.perf_counter()
        return Sample(self.name, "", "", len(tokens), n_gen, t_first - t0, (times[-1] if times else t_first) - t_first)

    def _generated(self, tokens: List[int], finish: Optional[str]) -> int:
        # Everything the context holds past the prompt, plus the last sampled
        # token, which is never evaluated when the length limit stops it.
        return self.llm.n_tokens - len(tokens) + (1 if finish == "length" else 0)


class PyspecLlamaRunner(LlamaCppRunner):
    """The same calls on :class:`pyspec.Llama`, the drop-in: speculation as
    it comes (pyspec's default drafting), no memory of earlier answers (a
    repeated bench prompt would otherwise copy its last answer; llama-cpp-python
    keeps none either)."""

    def __init__(self, model_path: str, *, n_ctx: int, n_threads: int, n_batch: int = 512,
                 flash_attn: bool = False, n_gpu_layers: int = 0, name: str = "pyspec.Llama") -> None:
        from ...llama import Llama

        self.llm = Llama(model_path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, n_batch=n_batch,
                         flash_attn=flash_attn, n_gpu_layers=n_gpu_layers, verbose=False)
        memory = self.llm.generator.memory
        if memory is not None:
            self.llm.generator.remember = False
            memory.clear()
        self.name = name

    def _generated(self, tokens: List[int], finish: Optional[str]) -> int:
        # As llama-cpp-python counts them: an end-of-generation token is not one.
        from ...llama.completion import generated

        return len(generated(self.llm, self.llm._last))
