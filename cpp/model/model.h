// RAII wrapper over one llama_model + llama_context, through the public llama.h
// API. Owns: loading, tokenizer, chat template, batched decode with chosen logit
// rows, KV-cache truncation, vocabulary facts, and the context's lock.
//
// Sequences: the context holds n_seq_max of them in one unified KV cache (they
// share its n_ctx cells), so a prefix copied from one sequence to another costs
// no memory, and one llama_decode may carry rows of several sequences. Calls
// without a sequence id act on sequence 0, which is all a single generation uses.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/infill.h"
#include "model/cpu_kernels.h"

struct llama_model;
struct llama_context;
struct llama_vocab;

namespace pyspec {

struct ModelParams {
    std::string path;
    int32_t n_ctx = 4096;
    int32_t n_threads = 0;      // 0 = all hardware threads (the Python layer passes physical cores)
    int32_t n_gpu_layers = 0;   // Metal/CUDA builds; -1 = all
    int32_t n_batch = 512;      // prompt chunk size and the largest verification batch
    int32_t flash_attn = -1;    // llama_flash_attn_type: -1 auto (llama.cpp decides per device), 0 off, 1 on
    int32_t n_seq_max = 16;     // sequences the context holds (one unified KV cache of n_ctx cells)
    bool verbose = false;       // forward llama.cpp's info logs to stderr
    // Let llama.cpp repack weights into this CPU's faster layouts (its "extra
    // buffer types"). Repacked kernels round differently, so rows move by a few
    // ulps; an RPC worker never repacks: off, local rows equal a worker's bit for bit.
    bool repack = true;
    // Extra buffer types not to use even where repack is on, by name ("AMX" where
    // its instructions fault here: model/cpu_kernels.h); the others are kept.
    std::vector<std::string> excluded_buffer_types = default_excluded_buffer_types();
    // RPC workers ("host:port") that hold the offloaded layers (model/devices.h),
    // before any local accelerator; empty: this machine only.
    std::vector<std::string> rpc;
    // Keep the output layer (norm and vocabulary projection) on this machine's
    // CPU while the other layers are offloaded: a decode then brings back hidden
    // states (n_embd floats a row) instead of logits (n_vocab floats a row).
    bool local_output = false;
    // Share of the offloaded layers per device (RPC workers first, then local
    // GPUs), as llama.cpp's --tensor-split; empty: by free memory.
    std::vector<float> tensor_split;

    static constexpr int32_t kMaxSequences = 256;  // llama.cpp's own limit

    // std::invalid_argument unless n_ctx >= 16, n_threads >= 0, n_batch >= 1,
    // flash_attn in {-1, 0, 1}, 1 <= n_seq_max <= min(kMaxSequences, n_batch), and a
    // tensor_split of finite non-negative shares, not all 0, no longer than
    // llama_max_devices().
    void validate() const;
};

class Model {
public:
    // Throws InvalidModelError for files llama.cpp cannot load and for models
    // whose memory cannot drop a rejected tail (recurrent or hybrid).
    explicit Model(const ModelParams& params);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelParams& params() const { return params_; }
    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_batch() const { return n_batch_; }
    int32_t n_seq() const { return n_seq_; }  // sequences, as the context reports them
    // Flash attention as the context runs it: 1 on, 0 off; -1 when params.flash_attn
    // was auto and llama.cpp did not say what it chose.
    int32_t flash_attn() const { return flash_attn_; }
    std::string description() const;
    uint64_t n_params() const;   // llama_model_n_params
    int32_t file_type() const;   // llama_model_ftype: the quantisation the file declares (LLAMA_FTYPE_*)
    // The buffers holding its weights, as llama.cpp reported them while loading
    // ("CPU_Mapped", "CPU_REPACK", "AMX", "CUDA0"...), with their MiB.
    const std::vector<std::pair<std::string, double>>& weight_buffers() const { return weight_buffers_; }
    // The loaded weights, for another context on them (model/embedder.h): llama.cpp
    // runs several contexts of one llama_model side by side, the weights being
    // read-only once loaded. Valid while this Model lives, so whoever makes a
    // context on it keeps the Model alive and frees that context first.
    llama_model* weights() const { return model_.get(); }

    // Tokenizer. add_special adds BOS/EOS as the model's metadata asks;
    // parse_special turns "<|im_start|>"-style text into control tokens.
    std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const;
    std::string token_to_piece(int32_t token, bool special = false) const;
    std::string detokenize(const std::vector<int32_t>& tokens, bool special = false) const;
    // The file's chat template (Jinja source; pyspec/chat/templates.py renders it), if any.
    std::optional<std::string> chat_template() const;
    // llama.cpp's built-in approximation of the template's family (ChatML for a
    // file without one): pyspec/chat/templates.py's fallback, llama_chat_apply_template.
    std::string apply_chat_template(const std::vector<std::pair<std::string, std::string>>& messages,
                                    bool add_assistant) const;

    // Vocabulary facts.
    int32_t vocab_type() const;
    int32_t bos() const;
    int32_t eos() const;
    int32_t eot() const;
    bool add_bos() const;
    bool add_eos() const;
    bool is_eog(int32_t token) const;
    // Fill-in-the-middle tokens (llama_vocab_fim_*: from the GGUF keys, else
    // found by their text when llama.cpp loaded the vocabulary); -1 where absent.
    struct FimTokens { int32_t pre, suf, mid, pad, rep, sep; };
    FimTokens fim_tokens() const;
    std::string token_text(int32_t token) const;
    int32_t token_attr(int32_t token) const;
    // The vocabulary as the infill sampler reads it (core/infill.h): built on first use, then shared.
    std::shared_ptr<const InfillVocab> infill_vocab() const;

    // The context's lock. llama_decode and the KV record are not thread-safe, so
    // everything that uses this context holds it: decode/truncate/pos_max take it
    // themselves, and an engine holds it for a whole generation (recursive, so
    // that its own decode calls pass). Callers that may wait for it must not hold
    // Python's GIL (the holder may need the GIL for a callback).
    std::unique_lock<std::recursive_mutex> lock() const { return std::unique_lock<std::recursive_mutex>(mutex_); }
    std::recursive_mutex& mutex() const { return mutex_; }
    // While a flag is set, llama_decode on this context stops as soon as *flag
    // becomes true (llama.cpp's abort callback, polled between graph nodes), and
    // decode() throws Cancelled. Set and cleared by the lock holder.
    void set_abort_flag(const std::atomic<bool>* flag) { abort_flag_.store(flag); }
    // A batch session that lives across calls (a server's) claims the model
    // between its steps, when it does not hold the lock: any other session then
    // fails clearly instead of overwriting the claimed sequences' caches.
    // claim() throws std::runtime_error when another owner holds the claim.
    void claim(const void* owner);
    void unclaim(const void* owner) {
        const void* expected = owner;
        claim_.compare_exchange_strong(expected, nullptr);
    }

    // Decode tokens at positions pos0.. of sequence `seq`, splitting into n_batch
    // chunks. Logits are kept for the last n_logits tokens (n_logits <= n_batch),
    // read back with logits(0..n_logits-1). Throws ContextOverflowError when the
    // tokens do not fit, DecodeError when llama_decode fails.
    void decode(const int32_t* tokens, int32_t n, int32_t pos0, int32_t n_logits, int32_t seq = 0);

    // One row of a multi-sequence batch: `token` at position `pos` of sequence
    // `seq`, with or without logits.
    struct Row {
        int32_t seq = 0;
        int32_t pos = 0;
        int32_t token = 0;
        bool logits = false;
    };
    // Decode rows of any sequences in ONE llama_decode (so n <= n_batch). Each
    // sequence's rows must be in order and continue its cached tokens (no gaps,
    // no overwrites: truncate first). logits(i) is then the i-th row that asked
    // for logits. On failure every sequence is left as it was.
    void decode_rows(const Row* rows, int32_t n);
    const float* logits(int32_t row) const;

    // decode and decode_rows return when their work is done, not when it is
    // launched: on CUDA llama_decode returns after queueing the graph (0.24 ms
    // of a 2.0 ms step), and every clock around a decode (calibration, rounds,
    // drafts, --stats, the server's timings) would time the launch, leaving the
    // work to whoever reads outputs next. Waiting there costs nothing: the
    // caller reads the logits next, which waits anyway. On the CPU the work is
    // done when llama_decode returns and this returns at once.
    void wait_for_work() const;
    // TEST-ONLY: behave as an asynchronous backend. Each decode's work finishes
    // latency_s after it is launched (queued behind unfinished work), and only
    // waiting sees it done: wait_for_work, or reading logits, as
    // llama_get_logits_ith waits. synced = false is the negative control the
    // clock tests must catch: decodes return at launch (the clocks of before).
    void simulate_async(double latency_s, bool synced = true);
    // TEST-ONLY: the row law's negative controls (tests/test_row_law.py), cells
    // the record (cached()) does not know, as an engine bug would leave them:
    // test_share_cell makes the cell of `src` at `pos` visible to `dst` too
    // (another sequence's cell); test_hide_cell takes the cell of `seq` at `pos`
    // out of its rows' view (a stale mask). llama.cpp refuses a hidden cell at
    // the sequence's last position (its positions must stay consecutive), so
    // `pos` is below it. The test truncates the sequences afterwards.
    void test_share_cell(int32_t src, int32_t dst, int32_t pos);
    void test_hide_cell(int32_t seq, int32_t pos);

    // Drop sequence `seq` from position pos on (pos = 0 clears it). Throws
    // DecodeError if llama.cpp cannot remove that part of its memory.
    void truncate(int32_t pos, int32_t seq = 0);
    // Make sequence dst hold the first n tokens of sequence src (a shared prompt:
    // the cells are shared, not copied). dst's own tokens are dropped first.
    void copy_prefix(int32_t src, int32_t dst, int32_t n);
    // Make dst hold the longest prefix of `tokens` (at most `limit` tokens) that
    // any sequence holds: copied where another holds more than dst itself (n
    // samples of one prompt, a shared system prompt), else dst's own, cut there.
    // Returns its length: what no longer needs decoding.
    size_t adopt_prefix(int32_t dst, const std::vector<int32_t>& tokens, size_t limit);
    int32_t pos_max(int32_t seq = 0) const;   // -1 when empty
    // The tokens the KV cache holds for a sequence, by position. Everything that
    // decodes with this context goes through this class, so the record is exact,
    // whichever engine (plain or speculative) used the context last.
    const std::vector<int32_t>& cached(int32_t seq = 0) const { return cached_[checked_seq(seq)]; }

    // A sequence's cache as bytes (llama.cpp's own per-sequence state: the cells'
    // positions and K/V), and back: the host cache keeps conversations that no
    // slot holds (engine/host_cache.h) and restores them without a prefill.
    // load_state replaces sequence `seq` with `state`, whose cells hold `tokens`;
    // false (the sequence left empty) when the cache has no room for it or the
    // bytes are not a state of this model's shape.
    std::string save_state(int32_t seq) const;
    // Tokens this context has evaluated over its life (prompt, drafts, rows of
    // every sequence): what a cache hit spares shows here.
    int64_t n_decoded() const { return n_decoded_.load(); }
    bool load_state(int32_t seq, const std::string& state, const std::vector<int32_t>& tokens);

private:
    void check_token(int32_t token) const;  // std::invalid_argument unless 0 <= token < n_vocab
    size_t checked_seq(int32_t seq) const;  // std::out_of_range unless 0 <= seq < n_seq
    static bool abort_requested(void* self);
    void launched();           // after each llama_decode: its simulated work is queued
    void wait_simulated() const;

    struct ModelFree { void operator()(llama_model* m) const; };
    struct ContextFree { void operator()(llama_context* c) const; };
    struct BatchStorage;
    struct BatchFree { void operator()(BatchStorage* b) const; };
    // Counts this model among the verbose ones for its lifetime (log filter).
    struct VerboseMark {
        explicit VerboseMark(bool on);
        ~VerboseMark();
        bool on;
    };

    ModelParams params_;
    VerboseMark verbose_;
    // Declared in the order they are created, so they are freed in reverse
    // (batch, context, model), also when the constructor throws halfway.
    std::unique_ptr<llama_model, ModelFree> model_;
    std::unique_ptr<llama_context, ContextFree> ctx_;
    std::unique_ptr<BatchStorage, BatchFree> batch_;  // one batch for the context's lifetime
    const llama_vocab* vocab_ = nullptr;
    int32_t n_vocab_ = 0;
    int32_t n_ctx_ = 0;
    int32_t n_batch_ = 0;
    int32_t n_seq_ = 1;
    mutable std::recursive_mutex mutex_;
    std::atomic<const std::atomic<bool>*> abort_flag_{nullptr};
    std::atomic<const void*> claim_{nullptr};
    int32_t flash_attn_ = -1;       // flash attention as run: 1 on, 0 off, -1 unknown
    std::vector<std::pair<std::string, double>> weight_buffers_;
    std::vector<std::vector<int32_t>> cached_;  // per sequence
    std::atomic<int64_t> n_decoded_{0};
    std::vector<int32_t> logit_rows_;            // batch row of logits(i) in the last decode
    double sim_latency_s_ = 0;                   // simulate_async (TEST-ONLY); 0: off
    bool sim_synced_ = true;
    mutable std::chrono::steady_clock::time_point sim_done_{};  // when the queued simulated work ends
    mutable std::once_flag infill_once_;
    mutable std::shared_ptr<const InfillVocab> infill_vocab_;
};

}  // namespace pyspec
