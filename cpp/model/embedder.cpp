#include "model/embedder.h"

#include <llama.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "core/errors.h"
#include "model/devices.h"
#include "model/compute_thread.h"
#include "model/llama_log.h"

namespace pyspec {

struct Embedder::BatchStorage {
    llama_batch batch;
    explicit BatchStorage(int32_t n) : batch(llama_batch_init(n, 0, 1)) {}
    ~BatchStorage() { llama_batch_free(batch); }
};

void Embedder::ContextFree::operator()(llama_context* c) const { llama_free(c); }
void Embedder::BatchFree::operator()(BatchStorage* b) const { delete b; }

void EmbedderParams::validate() const {
    if (n_ctx < 1) throw std::invalid_argument("n_ctx must be >= 1, got " + std::to_string(n_ctx));
    if (n_batch < 0 || n_batch > n_ctx) {
        // The cache is cleared before each decode, so a decode needs n_batch cells, no more.
        throw std::invalid_argument("n_batch must be in [0, n_ctx] (0: n_ctx), got " + std::to_string(n_batch) +
                                    " with n_ctx " + std::to_string(n_ctx));
    }
    if (n_threads < 0) {
        throw std::invalid_argument("n_threads must be >= 1 (0: the model's), got " + std::to_string(n_threads));
    }
    if (flash_attn < -1 || flash_attn > 1) {
        throw std::invalid_argument("flash_attn must be -1 (auto), 0 (off) or 1 (on), got " +
                                    std::to_string(flash_attn));
    }
    if (pooling == LLAMA_POOLING_TYPE_RANK) {
        throw std::invalid_argument("pooling 4 (rank) scores query-document pairs with a reranker's head; it does "
                                    "not embed: give 1 (mean), 2 (cls), 3 (last), 0 (none) or -1 (the model's)");
    }
    if (pooling < LLAMA_POOLING_TYPE_UNSPECIFIED || pooling > LLAMA_POOLING_TYPE_LAST) {
        throw std::invalid_argument("pooling must be -1 (the model's), 0 (none), 1 (mean), 2 (cls) or 3 (last), "
                                    "got " + std::to_string(pooling));
    }
}

Embedder::Embedder(Model& model, const EmbedderParams& params) : model_(model), params_(params) {
    params.validate();
    take_last_llama_error();  // a stale message must not become this context's reason
    const int32_t n_ctx = params.n_ctx;
    const int32_t n_batch = params.n_batch > 0 ? params.n_batch : n_ctx;
    const int32_t model_threads = model.params().n_threads;
    n_threads_ = params.n_threads > 0 ? params.n_threads
               : model_threads > 0   ? model_threads
                                     : std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));

    llama_context_params cp = llama_context_default_params();
    cp.embeddings = true;
    cp.pooling_type = static_cast<enum llama_pooling_type>(params.pooling);
    cp.n_ctx = static_cast<uint32_t>(n_ctx);
    cp.n_batch = static_cast<uint32_t>(n_batch);
    // One micro-batch a decode: pooling is computed per micro-batch (header).
    cp.n_ubatch = cp.n_batch;
    // A sequence per row at most, and never past llama.cpp's limit. One unified
    // cache: the sequences of a decode share its cells, whatever their lengths.
    cp.n_seq_max = static_cast<uint32_t>(std::min<size_t>(static_cast<size_t>(n_batch),
                                                          llama_max_parallel_sequences()));
    cp.kv_unified = true;
    cp.n_threads = n_threads_;
    cp.n_threads_batch = n_threads_;
    cp.flash_attn_type = static_cast<llama_flash_attn_type>(params.flash_attn);
    cp.no_perf = true;
    cp.abort_callback = &Embedder::abort_requested;
    cp.abort_callback_data = this;
    ctx_.reset(llama_init_from_model(model.weights(), cp));
    if (!ctx_) {
        std::string message = "failed to create a llama.cpp embedding context for " + model.params().path;
        const std::string reason = take_last_llama_error();
        if (!reason.empty()) message += " (llama.cpp: " + reason + ")";
        throw InvalidModelError(message);
    }
    pooling_ = static_cast<int32_t>(llama_pooling_type(ctx_.get()));
    if (pooling_ == LLAMA_POOLING_TYPE_RANK) {
        throw std::invalid_argument("the model " + model.params().path + " pools by rank (a reranker: it scores "
                                    "pairs, it does not embed); give a pooling type: mean, cls, last or none");
    }
    n_embd_ = llama_model_n_embd_out(model.weights());
    n_ctx_ = static_cast<int32_t>(llama_n_ctx(ctx_.get()));
    n_batch_ = static_cast<int32_t>(llama_n_batch(ctx_.get()));
    n_seq_max_ = static_cast<int32_t>(llama_n_seq_max(ctx_.get()));
    // A learned position table ends at the training context (BERT's 512):
    // llama.cpp would read past it. RoPE models are only degraded there; the
    // bound costs them nothing an embedding would want.
    const int32_t n_train = llama_model_n_ctx_train(model.weights());
    max_tokens_ = std::min(n_batch_, n_ctx_);
    if (n_train > 0) max_tokens_ = std::min(max_tokens_, n_train);
    batch_.reset(new BatchStorage(n_batch_));
}

Embedder::~Embedder() {
    // As Model's: freeing a context whose buffers live on a lost RPC worker makes
    // ggml-rpc abort the process; such a context is left unfreed instead.
    for (const auto& endpoint : model_.params().rpc) {
        if (!endpoint_reachable(endpoint, 1.0)) {
            (void)ctx_.release();
            break;
        }
    }
}

bool Embedder::abort_requested(void* self) {
    const std::atomic<bool>* flag = static_cast<Embedder*>(self)->abort_flag_.load();
    return flag != nullptr && flag->load(std::memory_order_relaxed);
}

void Embedder::check(const std::vector<std::vector<int32_t>>& seqs) const {
    if (seqs.empty()) throw std::invalid_argument("embed needs at least one input");
    const int32_t n_vocab = model_.n_vocab();
    for (size_t i = 0; i < seqs.size(); ++i) {
        const auto& s = seqs[i];
        if (s.empty()) throw std::invalid_argument("input " + std::to_string(i) + " is empty (no tokens)");
        if (s.size() > static_cast<size_t>(max_tokens_)) {
            throw ContextOverflowError("input " + std::to_string(i) + " has " + std::to_string(s.size()) +
                                       " tokens; this embedder takes at most " + std::to_string(max_tokens_) +
                                       " per input (n_ctx " + std::to_string(n_ctx_) + ", n_batch " +
                                       std::to_string(n_batch_) + ")");
        }
        for (int32_t t : s) {
            if (t < 0 || t >= n_vocab) {
                throw std::invalid_argument("token id " + std::to_string(t) + " of input " + std::to_string(i) +
                                            " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
            }
        }
    }
}

std::vector<float> Embedder::embed(const std::vector<std::vector<int32_t>>& seqs, bool normalize,
                                   const std::atomic<bool>* cancel) {
    check(seqs);
    size_t rows = seqs.size();
    if (pooling_ == LLAMA_POOLING_TYPE_NONE) {
        rows = 0;
        for (const auto& s : seqs) rows += s.size();
    }
    std::vector<float> out(rows * static_cast<size_t>(n_embd_));

    const std::lock_guard<std::mutex> held(mutex_);
    abort_flag_.store(cancel);
    struct Unflag {  // the flag is the caller's: never polled after this call
        std::atomic<const std::atomic<bool>*>& f;
        ~Unflag() { f.store(nullptr); }
    } unflag{abort_flag_};

    // Greedy packing in order: a group ends where the next sequence would not fit.
    float* dst = out.data();
    size_t first = 0;
    while (first < seqs.size()) {
        size_t last = first;
        size_t tokens = 0;
        while (last < seqs.size() && last - first < static_cast<size_t>(n_seq_max_) &&
               tokens + seqs[last].size() <= static_cast<size_t>(n_batch_)) {
            tokens += seqs[last].size();
            ++last;
        }
        decode_group(seqs, first, last, dst);
        dst += (pooling_ == LLAMA_POOLING_TYPE_NONE ? tokens : last - first) * static_cast<size_t>(n_embd_);
        first = last;
    }

    if (normalize) {
        for (size_t r = 0; r < rows; ++r) {
            float* v = out.data() + r * static_cast<size_t>(n_embd_);
            double sum = 0.0;  // in double, as llama.cpp's common_embd_normalize
            for (int32_t k = 0; k < n_embd_; ++k) sum += static_cast<double>(v[k]) * v[k];
            const double scale = sum > 0.0 ? 1.0 / std::sqrt(sum) : 0.0;
            for (int32_t k = 0; k < n_embd_; ++k) v[k] = static_cast<float>(v[k] * scale);
        }
    }
    return out;
}

void Embedder::decode_group(const std::vector<std::vector<int32_t>>& seqs, size_t first, size_t last, float* out) {
    // No check of the cancel flag here: llama.cpp's abort callback polls it from the
    // graph's first node on, and a cancelled decode fails as any failed decode does.
    llama_memory_t mem = llama_get_memory(ctx_.get());  // none for an encoder (BERT): nothing to clear
    if (mem) llama_memory_clear(mem, true);
    llama_batch& b = batch_->batch;
    int32_t n = 0;
    for (size_t i = first; i < last; ++i) {
        const int32_t seq = static_cast<int32_t>(i - first);
        for (size_t p = 0; p < seqs[i].size(); ++p, ++n) {
            b.token[n] = seqs[i][p];
            b.pos[n] = static_cast<int32_t>(p);
            b.n_seq_id[n] = 1;
            b.seq_id[n][0] = seq;
            b.logits[n] = 1;  // every row an output: llama.cpp pools only over outputs
        }
    }
    b.n_tokens = n;
    const int32_t rc = compute::run([&] { return llama_decode(ctx_.get(), b); });
    if (rc != 0) {
        if (mem) llama_memory_clear(mem, true);
        if (rc == 2 && abort_requested(this)) throw Cancelled("cancelled");
        std::string message = "llama_decode failed with code " + std::to_string(rc) + " embedding " +
                              std::to_string(n) + " tokens of " + std::to_string(last - first) + " inputs";
        const std::string reason = take_last_llama_error();
        if (!reason.empty()) message += " (llama.cpp: " + reason + ")";
        throw DecodeError(message);
    }
    n_decoded_ += n;
    ++n_decodes_;
    const size_t width = static_cast<size_t>(n_embd_);
    if (pooling_ == LLAMA_POOLING_TYPE_NONE) {
        for (int32_t row = 0; row < n; ++row) {
            const float* v = llama_get_embeddings_ith(ctx_.get(), row);
            if (!v) throw DecodeError("llama.cpp returned no embedding for row " + std::to_string(row));
            std::copy(v, v + width, out + static_cast<size_t>(row) * width);
        }
    } else {
        for (size_t i = first; i < last; ++i) {
            const int32_t seq = static_cast<int32_t>(i - first);
            const float* v = llama_get_embeddings_seq(ctx_.get(), seq);
            if (!v) throw DecodeError("llama.cpp returned no pooled embedding for input " + std::to_string(i));
            std::copy(v, v + width, out + (i - first) * width);
        }
    }
}

}  // namespace pyspec
