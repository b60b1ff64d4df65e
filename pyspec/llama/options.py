"""llama-cpp-python's arguments where pyspec has no counterpart, and the
sampling arguments of a call read into pyspec's values.

One rule throughout: an argument is either mapped (it does what it did in
llama-cpp-python 0.3.36), accepted at llama-cpp-python's own default (scripts
pass those unasked: they change nothing), or refused with an error that names
it. Nothing is silently ignored. The table of what maps is in
docs/python.md#coming-from-llama-cpp-python.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

from .. import _core
from ..constraints import Constraint
from ..sampling import Sampling

#: llama.cpp's LLAMA_DEFAULT_SEED: as a call's seed, "a fresh random one".
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

#: Constructor arguments pyspec has no counterpart for, with the values that
#: mean llama-cpp-python's default (accepted: they change nothing).
FIXED: Dict[str, tuple] = {
    "split_mode": (1,),  # LLAMA_SPLIT_MODE_LAYER
    "main_gpu": (0,),
    "vocab_only": (False,),
    "use_mmap": (True,),
    "use_mlock": (False,),
    "kv_overrides": (None,),
    "rope_scaling_type": (-1, None),  # LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    "attention_type": (-1,),
    "rope_freq_base": (0.0,),
    "rope_freq_scale": (0.0,),
    "yarn_ext_factor": (-1.0,),
    "yarn_attn_factor": (1.0,),
    "yarn_beta_fast": (32.0,),
    "yarn_beta_slow": (1.0,),
    "yarn_orig_ctx": (0,),
    "offload_kqv": (True,),
    "op_offload": (None,),
    "swa_full": (None,),
    "lora_base": (None,),
    "lora_scale": (1.0,),
    "lora_path": (None,),
    "numa": (False, 0),  # GGML_NUMA_STRATEGY_DISABLED
    "tokenizer": (None,),
    "type_k": (None,),
    "type_v": (None,),
    "spm_infill": (False,),
}

#: Why some of them cannot be honoured, for the error.
_WHY = {
    "vocab_only": "pyspec always loads the weights (tokenize with any Llama)",
    "lora_path": "pyspec loads no LoRA adapters",
    "lora_base": "pyspec loads no LoRA adapters",
    "tokenizer": "pyspec tokenizes with the GGUF's own vocabulary",
    "spm_infill": "pyspec lays out fill-in-the-middle prompts from the model's FIM tokens (pyspec/fim.py)",
    "kv_overrides": "pyspec reads the GGUF's metadata as it is",
    "type_k": "pyspec's KV cache is llama.cpp's default type",
    "type_v": "pyspec's KV cache is llama.cpp's default type",
}


def check_fixed(given: Mapping[str, Any]) -> None:
    """TypeError for an argument llama-cpp-python does not have either, and
    ValueError for one pyspec cannot honour at a value other than the default."""
    unknown = sorted(set(given) - set(FIXED))
    if unknown:
        raise TypeError(f"Llama() got an unexpected keyword argument '{unknown[0]}'")
    for name, value in given.items():
        allowed = FIXED[name]
        if not any(_same(value, a) for a in allowed):
            why = _WHY.get(name, "pyspec has no such setting")
            raise ValueError(f"Llama({name}={value!r}) is not supported: {why}; only the default "
                             f"{allowed[0]!r} is accepted")


def _same(value: Any, default: Any) -> bool:
    if default is None:
        return value is None
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return isinstance(value, (int, float)) and value == default


def refuse(name: str, value: Any, why: str) -> None:
    raise ValueError(f"{name}={value!r} is not supported by pyspec.Llama: {why}")


def check_call(*, typical_p: float, tfs_z: float, mirostat_mode: int, logits_processor: Any,
               stopping_criteria: Any = None) -> None:
    """The sampling arguments of a call that pyspec has no counterpart for:
    their neutral values pass, anything else is a ValueError naming it."""
    if logits_processor is not None:
        refuse("logits_processor", logits_processor, "pyspec samples in C++ (and speculates: a Python "
               "processor would have to see every drafted row); use logit_bias, grammar or the penalties")
    if stopping_criteria is not None:
        refuse("stopping_criteria", stopping_criteria, "pyspec stops in C++; use stop strings or max_tokens")
    if typical_p != 1.0:
        refuse("typical_p", typical_p, "pyspec's sampler has top-k, top-p, min-p and temperature (1.0 is off)")
    if tfs_z != 1.0:
        refuse("tfs_z", tfs_z, "tail-free sampling is gone from llama.cpp too (1.0 is off)")
    if mirostat_mode != 0:
        refuse("mirostat_mode", mirostat_mode, "mirostat's output law cannot be checked row by row, so it cannot "
               "be speculated losslessly (0 is off)")


def sampling(*, temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
             frequency_penalty: float, presence_penalty: float, logit_bias: Optional[Mapping[Any, float]],
             last_n_tokens_size: int) -> Sampling:
    """llama-cpp-python's sampler chain as a :class:`~pyspec.Sampling`.

    Its chain is logit_bias, penalties over the last ``last_n_tokens_size``
    tokens generated in this call, top-k, top-p, min-p, temperature: pyspec's
    order. A negative temperature samples from the whole distribution (its
    chain is then only the final draw). Penalties and biases need a core that
    applies them; without one they are an error, never ignored."""
    if isinstance(temperature, (int, float)) and temperature < 0:
        base = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    else:
        base = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    bias = {int(t): float(b) for t, b in (logit_bias or {}).items()}
    for b in bias.values():
        if math.isnan(b):
            raise ValueError("logit_bias values must be numbers, got NaN")
    out = base.replace(repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                       # llama_sampler_init_penalties clamps a negative window to 0: penalties off
                       presence_penalty=presence_penalty, penalty_last_n=max(last_n_tokens_size, 0),
                       penalize_prompt=False).replace(logit_bias=bias)
    if out.penalized and not hasattr(_core, "Penalties"):
        raise ValueError("repeat_penalty, frequency_penalty, presence_penalty and logit_bias need pyspec's "
                         "sampling core with penalties, which this build of pyspec._core lacks: rebuild pyspec")
    return out


def grammar_constraint(grammar: Any) -> Optional[Constraint]:
    """``grammar=``: a ``llama_cpp.LlamaGrammar`` (its GBNF text), GBNF or Lark
    text, or a :class:`~pyspec.Constraint`. pyspec compiles grammars with
    llguidance, which takes GBNF through its converter (pyspec/constraints.py)."""
    if grammar is None or isinstance(grammar, Constraint):
        return grammar
    if isinstance(grammar, str):
        return Constraint.grammar(grammar)
    text = getattr(grammar, "_grammar", None)
    if isinstance(text, str):  # llama_cpp.LlamaGrammar keeps its GBNF source there
        return Constraint.grammar(text)
    raise TypeError(f"grammar must be a llama_cpp.LlamaGrammar, GBNF or Lark text, or a pyspec.Constraint; "
                    f"got {type(grammar).__name__}")
