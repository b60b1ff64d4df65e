"""Typed surface of the C++ core (cpp/bindings/: module.cpp and one bind_*.cpp per room).

Each struct's fields and defaults are documented once, in its C++ header
(engine/engine.h, engine/stats.h, model/model.h, model/embedder.h, policies/policy.h,
drafters/drafters.h, core/sampling.h); bound structs take
keyword arguments over those defaults and list their fields in ``FIELDS``.
tests/test_boundary.py checks this stub against the module.
"""

from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, overload

import numpy as np
import numpy.typing as npt

# --------------------------------------------------------------- structs
class SamplingParams:
    FIELDS: ClassVar[Tuple[str, ...]]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    infill: bool
    def __init__(self, **fields: Any) -> None: ...  # ValueError for invalid settings
    def to_dict(self) -> Dict[str, Any]: ...

class Penalties:  # logit biases and repetition penalties (core/penalties.h)
    FIELDS: ClassVar[Tuple[str, ...]]
    repeat: float
    frequency: float
    presence: float
    last_n: int  # -1: every token before the row, 0: off
    include_prompt: bool
    logit_bias: List[Tuple[int, float]]
    def __init__(self, **fields: Any) -> None: ...  # ValueError for invalid settings
    def to_dict(self) -> Dict[str, Any]: ...

GRAMMAR_CONTROLS: Tuple[str, ...]  # "off", "unmasked", "stale" (engine.h, GrammarControl)
PENALTY_CONTROLS: Tuple[str, ...]  # "off", "stale", "last_draft" (engine.h, PenaltyControl)

class TestControls:  # TEST-ONLY negative controls, a session's (pyspec.testing.TestControls builds it)
    FIELDS: ClassVar[Tuple[str, ...]]
    variant: str  # "correct", or one of sampling.VARIANTS' wrong rules
    discard_below: float  # > 0: a draft discards a drawn token believed below this
    shared_stream: bool  # every sequence draws from the one stream of its seed
    grammar: str  # GRAMMAR_CONTROLS: "unmasked" or "stale": the target's rows under a wrong grammar mask
    pit: bool  # probe, not a control: record each decided token's PIT under its target row in stats.pit
    penalties: str  # PENALTY_CONTROLS: "stale" or "last_draft": a row's penalty window leaves out drafts before it
    timing_scale: float  # pin, > 0: a batch timed between rounds reports this times the fastest round
    stale_join: bool  # a prompt's last row, decoded with its final chunk, carries the token before the last
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class GrammarVocab:  # a model's vocabulary as llguidance sees it (constraint/grammar.h)
    def __init__(self, model: Model, library: str) -> None: ...
    n_vocab: int
    version: str

class Grammar:  # a compiled grammar; ConstraintError if it does not compile
    def __init__(self, vocab: GrammarVocab, kind: str, text: str) -> None: ...
    kind: str
    def valid_prefix(self, tokens: Sequence[int]) -> int: ...
    def allowed(self, prefix: Sequence[int] = ...) -> np.ndarray: ...
    def forced(self, prefix: Sequence[int] = ..., max_n: int = ...) -> List[int]: ...
    def time_masks(self, tokens: Sequence[int]) -> List[float]: ...

class SequenceParams:  # what one sequence generates and how it samples (engine.h)
    FIELDS: ClassVar[Tuple[str, ...]]
    max_tokens: int
    sampling: SamplingParams
    draft_sampling: SamplingParams
    seed: int
    stop: List[str]
    logprobs: int  # -1 none; k >= 0: each token's and the k most likely (the target's, at T = 1)
    grammar: Optional[Grammar]  # the constraint the output follows (constraint/grammar.h)
    penalties: Penalties  # biases and repetition penalties before sampling (core/penalties.h)
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class SessionParams:  # how a session runs all its sequences (engine.h)
    FIELDS: ClassVar[Tuple[str, ...]]
    prefill_chunk: int  # most prompt rows a round adds beside running sequences, or a chunked one's alone (0: all that fit)
    calibration_share: float  # most share of round time spent timing batch sizes between rounds (auto)
    first_with_prompt: bool  # a new prompt's first token read from its prompt's last decode (decode.cpp)
    test: TestControls
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class BatchStats:
    FIELDS: ClassVar[Tuple[str, ...]]
    n_seq: int
    rounds: int
    rows: int
    max_rows: int
    prompt_rows: int
    cached_tokens: int
    cache_evictions: int
    draft_decodes: int
    joint_rounds: int
    prompt_s: float
    decode_s: float
    n_generated: int
    aggregate_tok_s: float
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class GenerationStats:
    FIELDS: ClassVar[Tuple[str, ...]]
    n_prompt_tokens: int
    n_cached_tokens: int
    n_prompt_decoded: int  # prompt tokens decoded for it (n_prompt_tokens - n_cached_tokens unless it ended first)
    n_generated: int
    prompt_s: float
    ttft_s: float
    decode_s: float
    decode_tok_s: float
    rounds: int
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    overhead_s: float
    calibrate_s: float
    drafted_at: List[int]
    accepted_at: List[int]
    length_hist: List[int]
    policy_plain: int
    ngram_rounds: int
    ngram_drafted: int
    ngram_accepted: int
    ngram_reanchored: int
    memory_rounds: int
    memory_drafted: int
    memory_accepted: int
    ngram_guesses: int
    ngram_guess_hits: int
    stops_before: int
    stops_after: int
    forced_rounds: int  # rounds that drafted text the grammar forces
    forced_drafted: int
    forced_accepted: int
    grammar_cuts: int  # lookup drafts cut before a token the grammar refuses
    draft_windows: int  # draft-model catch-ups that started over on a window
    first_with_prompt: int  # 1: the first token came from the prompt's last decode
    masks: int  # grammar masks computed
    mask_s: float  # ... and their seconds
    pit: List[float]  # TEST-ONLY (TestControls.pit): each decided token's randomized PIT under its target row
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class GenerateResult:
    tokens: List[int]
    text: bytes  # UTF-8
    stop_reason: str  # "eog", "max_tokens", "stop", "context", "cancelled"
    stats: GenerationStats
    logprobs: List[Tuple[float, List[Tuple[int, float]]]]  # per token, when SequenceParams.logprobs >= 0

class DrafterParams:
    FIELDS: ClassVar[Tuple[str, ...]]
    name: str  # "" = hybrid with a draft model, ngram without
    ngram_min: int
    ngram_max: int
    hybrid_min_match: int
    draft_window: int  # the most tokens a draft model catches up on (0: all)
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class PolicyParams:
    FIELDS: ClassVar[Tuple[str, ...]]
    name: str
    draft_max: Optional[int]  # the user's cap in [0, MAX_DRAFT]; None: the policy's default
    p_min: float
    gamma: float
    h: float
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

# --------------------------------------------------------------- model
class ModelParams:
    FIELDS: ClassVar[Tuple[str, ...]]
    path: str
    n_ctx: int
    n_threads: int
    n_gpu_layers: int
    n_batch: int
    flash_attn: int
    n_seq_max: int
    verbose: bool
    repack: bool
    excluded_buffer_types: List[str]
    rpc: List[str]
    local_output: bool
    tensor_split: List[float]
    def __init__(self, **fields: Any) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class Model:
    @overload
    def __init__(self, params: ModelParams) -> None: ...
    @overload  # defaults: ModelParams()'s
    def __init__(self, path: str, n_ctx: int = ..., n_threads: int = ..., n_gpu_layers: int = ...,
                 n_batch: int = ..., verbose: bool = ..., flash_attn: int = ..., n_seq_max: int = ...) -> None: ...
    params: ModelParams  # a copy of what it was loaded with
    path: str
    n_vocab: int
    n_ctx: int
    n_batch: int
    n_seq: int
    n_threads: int
    n_gpu_layers: int
    rpc: List[str]
    tensor_split: List[float]
    flash_attn: int  # as run: 1 on, 0 off, -1 auto and unreported
    flash_attn_requested: int
    description: str
    n_params: int
    file_type: int  # llama_model_ftype (LLAMA_FTYPE_*): the quantisation the file declares
    weight_buffers: List[Tuple[str, float]]  # (buffer name, MiB) holding its weights
    vocab_type: int
    bos: int
    eos: int
    eot: int
    add_bos: bool
    add_eos: bool
    chat_template: Optional[bytes]  # the file's Jinja source (tokenizer.chat_template), or None
    fim_tokens: Dict[str, int]  # {pre, suf, mid, pad, rep, sep}: fill-in-the-middle ids, -1 where absent
    def is_eog(self, token: int) -> bool: ...
    def token_text(self, token: int) -> str: ...
    def token_attr(self, token: int) -> int: ...
    def infill_vocab(self) -> _Sampling.InfillVocab: ...  # the infill sampler's view (core/infill.h)
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> List[int]: ...
    def token_to_piece(self, token: int, special: bool = False) -> bytes: ...
    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes: ...
    # llama.cpp's built-in approximation (ChatML without a template): pyspec/chat/templates.py's fallback.
    def apply_chat_template(self, messages: Sequence[Tuple[str, str]], add_assistant: bool = True) -> str: ...
    def decode(self, tokens: Sequence[int], pos0: int, n_logits: int = 1, seq: int = 0) -> None: ...
    def decode_rows(self, rows: Sequence[Tuple[int, int, int, bool]]) -> None: ...  # (seq, pos, token, logits)
    def logits(self, row: int = 0) -> npt.NDArray[np.float32]: ...
    def test_simulate_async(self, latency_s: float, synced: bool = True) -> None: ...  # TEST-ONLY (model.h)
    def test_share_cell(self, src: int, dst: int, pos: int) -> None: ...  # TEST-ONLY (model.h): a row-law control
    def test_hide_cell(self, seq: int, pos: int) -> None: ...  # TEST-ONLY (model.h): a row-law control
    def truncate(self, pos: int, seq: int = 0) -> None: ...
    def copy_prefix(self, src: int, dst: int, n: int) -> None: ...
    def pos_max(self, seq: int = 0) -> int: ...
    def cached(self, seq: int = 0) -> List[int]: ...
    n_decoded: int
    def save_state(self, seq: int = 0) -> bytes: ...
    def load_state(self, seq: int, state: bytes, tokens: Sequence[int]) -> bool: ...

class CancelToken:
    def __init__(self) -> None: ...
    def set(self) -> None: ...
    is_set: bool

# --------------------------------------------------------------- embeddings (model/embedder.h)
class EmbedderParams:
    FIELDS: ClassVar[Tuple[str, ...]]
    n_ctx: int
    n_batch: int  # 0: n_ctx
    n_threads: int  # 0: the model's
    flash_attn: int  # 0 off (the default), 1 on, -1 auto
    pooling: int  # llama_pooling_type: 1 mean, 2 cls, 3 last, 0 none, -1 the model's; 4 (rank) refused
    def __init__(self, **fields: Any) -> None: ...  # ValueError for invalid settings
    def to_dict(self) -> Dict[str, Any]: ...

class Embedder:  # a second context on a Model's weights; keeps the Model alive
    def __init__(self, model: Model, params: EmbedderParams = ...) -> None: ...
    params: EmbedderParams  # a copy
    n_embd: int
    pooling: int  # as run (-1 resolved)
    n_ctx: int
    n_batch: int
    n_seq_max: int  # sequences one decode packs
    max_tokens: int  # the longest sequence embed() takes
    n_threads: int
    n_decoded: int  # tokens embedded over its life
    n_decodes: int  # llama_decode calls over its life
    # float32 (n, n_embd): a row per sequence (a row per token with pooling none);
    # ValueError (empty, ids), ContextOverflowError (too long), DecodeError, RuntimeError when cancelled.
    def embed(self, sequences: Sequence[Sequence[int]], normalize: bool = True,
              cancel: Optional[CancelToken] = None) -> npt.NDArray[np.float32]: ...

# --------------------------------------------------------------- drafters and policies
class SuffixStore:
    def __init__(self, cap_bytes: int) -> None: ...
    def add(self, tokens: Sequence[int]) -> None: ...
    def clear(self) -> None: ...
    def documents(self) -> List[List[int]]: ...
    def longest_match(self, tokens: Sequence[int]) -> Dict[str, int]: ...  # {match_len, next_token, count}
    cap_bytes: int
    bytes: int
    n_tokens: int
    n_documents: int
    epoch: int

class Drafter:
    def use_memory(self, store: Optional[SuffixStore]) -> bool: ...

class NgramDrafter(Drafter):
    def __init__(self, n_vocab: int, n_min: int = 1, n_max: int = 16) -> None: ...
    def begin(self, prompt: Sequence[int]) -> None: ...
    def plan(self, history: Sequence[int]) -> Dict[str, Any]: ...  # {match_len, near_copy, next_guess, fresh}
    def find(self, history: Sequence[int]) -> Tuple[int, int]: ...
    def propose(self, history: Sequence[int], max_n: int) -> List[int]: ...

class ConsensusPool:
    def __init__(self, n_seq: int, n_min: int = 2, n_max: int = 8) -> None: ...
    n_seq: int

class ConsensusDrafter(Drafter):
    def __init__(self, pool: ConsensusPool, seq: int, n_vocab: int, n_min: int = 1, n_max: int = 16) -> None: ...
    def begin(self, prompt: Sequence[int]) -> None: ...
    def plan(self, history: Sequence[int]) -> Dict[str, Any]: ...  # {match_len, next_guess}
    def propose(self, history: Sequence[int], max_n: int) -> List[int]: ...
    sibling_drafts: int

class SuffixDrafter(Drafter):
    def __init__(self, n_vocab: int, n_min: int = 1, n_max: int = 16) -> None: ...
    def begin(self, prompt: Sequence[int]) -> None: ...
    def plan(self, history: Sequence[int]) -> Dict[str, Any]: ...  # {match_len, near_copy, next_guess, fresh, from_memory}
    def propose(self, history: Sequence[int], max_n: int) -> List[int]: ...
    memory_drafts: int

def drafters() -> List[Dict[str, Any]]: ...  # [{name, needs_draft_model, summary}]
def drafter_name(params: DrafterParams, have_draft_model: bool) -> str: ...
def make_drafter(params: DrafterParams, target: Model, draft: Optional[Model] = None) -> Drafter: ...
def make_batch_drafters(params: DrafterParams, target: Model, draft: Optional[Model], n: int,
                        siblings: bool = True) -> List[Drafter]: ...

class LengthPolicy:
    name: str
    draft_max: int
    def next_length(self, round_max: int, source: str = "model", match_len: int = 0, lag: int = 1,
                    near_copy: bool = False, next_guess: int = -1, fresh: bool = False) -> int: ...
    def stop_before(self, i: int, belief: _Sampling.Distribution, known: int = -1) -> bool: ...
    def stop_after(self, i: int, belief: _Sampling.Distribution, token: int) -> bool: ...
    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, source: str = "model",
                match_len: int = 0, lag: int = 1, near_copy: bool = False, next_guess: int = -1,
                guess_hit: int = -1, batch_rows: int = 0, round_s: float = 0.0, length: int = -2) -> None: ...
    def calibration_sizes(self, max_batch: int) -> List[int]: ...  # [] for a policy that needs no timings
    def calibrated(self, sizes: Sequence[int], seconds: Sequence[float], fresh: bool = True) -> None: ...
    def begin_generation(self) -> None: ...

class AutoPolicy(LengthPolicy):
    # Joint planning (policy.h, JointPlanner): only auto plans with the batch.
    def set_remaining(self, tokens: int) -> None: ...
    def set_batch(self, other_rows: int, other_seqs: int) -> None: ...
    def plans_jointly(self, model: bool = False) -> bool: ...
    def allot_lengths(self, bids: Sequence[Tuple[float, float, int]], max_rows: int = 512) -> List[int]: ...
    def may_draft(self, source: str) -> bool: ...
    def catch_up_pays(self, lag: int) -> bool: ...  # the draft model's catch-up on lag tokens pays back
    catch_up_cost: float  # seconds per caught-up token (measured, else the prior; -1: neither)
    calibration: Dict[int, float]
    def take_new_timings(self) -> Dict[int, float]: ...  # measured here since the last call: to keep on disk
    def verify_cost(self, batch: int) -> float: ...
    def draft_cost(self, source: str) -> float: ...
    def recorded_draft_cost(self, seconds: float) -> None: ...
    def draft_cost_prior(self, steps: float) -> None: ...  # the draft's step in target steps, until measured
    def acceptance(self, source: str = "model", match_len: int = 0) -> float: ...
    def probe_interval(self, source: str = "model", match_len: int = 0) -> int: ...
    def host_cost(self, rows: int) -> float: ...
    plain_round_cost: float
    def suspended(self, k: int, source: str = "model", match_len: int = 0, near_copy: bool = False) -> bool: ...
    clock: bool  # read-write: whether the clock judges choices by their wall time
    learn_costs: bool  # read-write: whether round timings refine its costs (False: frozen as calibrated)
    clock_suspensions: int
    clock_vetoes: int
    memory: List[float]  # long-run acceptance of the 7 lookup buckets, then h_1, h_row
    def remember(self, memory: Sequence[float]) -> None: ...
    rounds_seen: int

MAX_DRAFT: int  # the longest draft, and the largest draft_max (cpp/policies/policy.h)
MAX_SEQUENCES: int  # the most sequences one context holds (cpp/model/model.h, kMaxSequences)
def policies() -> List[Dict[str, Any]]: ...  # [{name, default_draft_max, summary}]
def make_policy(params: PolicyParams) -> LengthPolicy: ...  # the most derived class (AutoPolicy for "auto")
def expected_tokens(alpha: Sequence[float], k: int) -> float: ...

# --------------------------------------------------------------- the loop
class Engine:
    def __init__(self, target: Model, drafter: Optional[Drafter] = None) -> None: ...
    def generate(self, prompt: Sequence[int], params: SequenceParams, session: SessionParams = ...,
                 policy: Optional[LengthPolicy] = None,
                 on_token: Optional[Callable[[int, bytes, bool], Any]] = None,
                 cancel: Optional[CancelToken] = None) -> GenerateResult: ...
    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SequenceParams, session: SessionParams = ...,
                       drafters: Sequence[Optional[Drafter]] = ..., policies: Sequence[Optional[LengthPolicy]] = ...,
                       on_token: Optional[Callable[[int, int, bytes, bool], Any]] = None,
                       cancel: Optional[CancelToken] = None) -> Tuple[List[GenerateResult], BatchStats]: ...

    def session(self, params: SessionParams, on_token: Optional[Callable[[int, int, bytes, bool], Any]] = None,
                cancel: Optional[CancelToken] = None, draft_models: Sequence[Model] = ...,
                host_cache: Optional[HostCache] = None) -> BatchSession: ...

class HostCache:
    """The prompt cache's host-memory tier: conversations no slot holds, within a byte bound (engine/host_cache.h)."""
    MIN_TOKENS: int
    def __init__(self, capacity_bytes: int) -> None: ...
    stats: Dict[str, int]  # saved, restored, restored_tokens, evicted, entries, bytes, capacity
    def clear(self) -> None: ...
    def put(self, parts: Sequence[Tuple[Model, Sequence[int], bytes]]) -> bool: ...
    def entries(self) -> List[List[Tuple[Model, List[int], bytes]]]: ...

class BatchSession:
    """Continuous batching: add() between step()s; each step is one round."""
    def add(self, prompt: Sequence[int], params: SequenceParams, drafter: Optional[Drafter] = None,
            policy: Optional[LengthPolicy] = None, stream: int = 0, slot: int = -1, chunked: bool = False) -> int: ...
    def pick_slot(self, prompt: Sequence[int]) -> int: ...
    def step(self) -> bool: ...
    def cancel(self, handle: int) -> None: ...
    def take_finished(self) -> List[Tuple[int, GenerateResult]]: ...
    def logprobs(self, handle: int, start: int = 0) -> List[Tuple[float, List[Tuple[int, float]]]]: ...
    def release_cache(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> "BatchSession": ...
    def __exit__(self, *args: Any) -> None: ...
    free_slots: int
    cached_slots: int
    n_active: int
    n_waiting: int
    kv_cells: Tuple[int, int]  # (running sequences' cells, all cells held incl. the prefix cache)
    stats: BatchStats

def sequence_seed(seed: int, j: int) -> int: ...
def gguf_metadata(path: str) -> List[Tuple[str, str]]: ...
def calibration_rows(draft_max: int, n_batch: int, n_seq: int) -> int: ...  # min(n_batch, (draft_max + 1) * n_seq)

# --------------------------------------------------------------- build facts (bind_info.cpp)
def llama_system_info() -> str: ...

# Model tools (bind_tools.cpp): `pyspec agree` and `pyspec quantize`.
def agreement(reference: Model, candidate: Model, tokens: Sequence[int], first: int, sampling: SamplingParams,
              cancel: Optional[CancelToken] = None) -> Dict[str, Any]:
    """Rows first .. len(tokens) - 2 of a teacher-forced stream (cpp/tools/agreement.h):
    alpha, kl, logp_ref, logp_cand (float64 [n_rows]), top1 (bool [n_rows]),
    nonfinite (int)."""
def check_compatible(target: Model, draft: Model) -> None: ...
def quantize_types() -> List[str]: ...
def quantize(input: str, output: str, type: str, n_threads: int = 0, allow_requantize: bool = False) -> None: ...
def quantize_progress() -> Tuple[int, int]: ...
def libllama_path() -> str: ...
def libggml_path() -> str: ...
def backends() -> List[Dict[str, Any]]: ...
def devices() -> List[Dict[str, Any]]: ...
def max_devices() -> int: ...
def supports_gpu_offload() -> bool: ...
def rpc_available() -> bool: ...
def rpc_protocol() -> str: ...
def rpc_endpoint_reachable(endpoint: str, timeout_s: float = 1.0) -> bool: ...
def rpc_worker_problem(endpoint: str, timeout_s: float = 1.0) -> str: ...
def rpc_serve(endpoint: str, cache_dir: str = "", n_threads: int = 1) -> None: ...
def rpc_lost_exit_status() -> int: ...
def set_compute_thread(on: bool) -> None: ...
def threads_that_computed() -> int: ...
def on_compute_thread(fn: Callable[[], Any]) -> Any: ...
def supports_mmap() -> bool: ...
def supports_mlock() -> bool: ...
def flash_attn_default() -> str: ...
AMX_BUFFER_TYPE: str
def cpu_extra_buffer_types() -> List[str]: ...
def probe_buffer_type(name: str, n_threads: int) -> str: ...
def buffer_overrides_without(path: str, excluded: List[str]) -> List[Tuple[str, str, int]]: ...
def set_default_excluded_buffer_types(names: List[str]) -> None: ...
def default_excluded_buffer_types() -> List[str]: ...
def install_fatal_signal_notice() -> None: ...

# --------------------------------------------------------------- the sampling submodule
class _Sampling:
    """The type of ``_core.sampling`` (public API: pyspec/sampling.py)."""

    class InfillVocab:  # opaque: Model.infill_vocab()
        n_vocab: int
        end: int

    class Distribution:
        @staticmethod
        def from_logits(logits: npt.ArrayLike, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                        min_p: float = 0.0, infill: Optional[_Sampling.InfillVocab] = None
                        ) -> _Sampling.Distribution: ...
        @staticmethod
        def from_probs(p: npt.ArrayLike, storage: str = "auto") -> _Sampling.Distribution: ...
        @staticmethod
        def one_hot(token: int, n_vocab: int) -> _Sampling.Distribution: ...
        n_vocab: int
        dense: bool
        support_size: int
        total: float
        def prob(self, token: int) -> float: ...
        def argmax(self) -> int: ...
        def entropy(self) -> float: ...
        def sample(self, u: float) -> int: ...
        def to_numpy(self) -> npt.NDArray[np.float64]: ...

    RESIDUAL_MIN_MASS: float
    VARIANTS: Tuple[str, ...]
    def distribution(self, logits: npt.ArrayLike, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     min_p: float = 0.0, infill: Optional[_Sampling.InfillVocab] = None
                     ) -> npt.NDArray[np.float64]: ...
    def penalize(self, logits: npt.ArrayLike, history: npt.ArrayLike, penalties: Penalties,
                 n_prompt: int = 0) -> npt.NDArray[np.float32]: ...
    def residual_mass(self, p: _Sampling.Distribution, q: _Sampling.Distribution) -> float: ...
    def sample_residual(self, p: _Sampling.Distribution, q: _Sampling.Distribution, u: float) -> int: ...
    def verify_many(self, p: npt.ArrayLike, q: npt.ArrayLike, draft: Optional[npt.ArrayLike], n_rounds: int,
                    seed: int, variant: str = "correct", storage: str = "auto",
                    return_drafts: bool = False) -> Tuple[npt.NDArray[np.int32], ...]: ...
    def bench_verify(self, logits_p: npt.ArrayLike, logits_q: npt.ArrayLike, temperature: float, top_k: int,
                     top_p: float, min_p: float, seconds: float, seed: int) -> Dict[str, Any]: ...

sampling: _Sampling
