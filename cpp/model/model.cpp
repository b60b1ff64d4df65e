#include "model/model.h"

#include <ggml-backend.h>
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "core/errors.h"
#include "core/tokens.h"
#include "core/utf8.h"
#include "model/cpu_kernels.h"
#include "model/devices.h"
#include "model/gguf_check.h"
#include "model/compute_thread.h"
#include "model/llama_log.h"

namespace pyspec {

// ---------------------------------------------------------------- loading

struct Model::BatchStorage {
    llama_batch batch;
    explicit BatchStorage(int32_t n) : batch(llama_batch_init(n, 0, 1)) {}
    ~BatchStorage() { llama_batch_free(batch); }
};

void Model::ModelFree::operator()(llama_model* m) const { llama_model_free(m); }
void Model::ContextFree::operator()(llama_context* c) const { llama_free(c); }
void Model::BatchFree::operator()(BatchStorage* b) const { delete b; }

Model::VerboseMark::VerboseMark(bool on_) : on(on_) {
    if (on) count_verbose_model(+1);
}
Model::VerboseMark::~VerboseMark() {
    if (on) count_verbose_model(-1);
}

namespace {

std::string with_llama_reason(std::string message) {
    const std::string reason = take_last_llama_error();
    if (!reason.empty()) message += " (llama.cpp: " + reason + ")";
    return message;
}

}  // namespace

void ModelParams::validate() const {
    if (n_ctx < 16) throw std::invalid_argument("n_ctx must be at least 16, got " + std::to_string(n_ctx));
    if (n_threads < 0) throw std::invalid_argument("n_threads must be >= 1 (0: all hardware threads), got " +
                                                   std::to_string(n_threads));
    if (n_batch < 1) throw std::invalid_argument("n_batch must be >= 1, got " + std::to_string(n_batch));
    if (flash_attn < -1 || flash_attn > 1) {
        throw std::invalid_argument("flash_attn must be -1 (auto), 0 (off) or 1 (on), got " + std::to_string(flash_attn));
    }
    if (n_seq_max < 1 || n_seq_max > kMaxSequences) {
        throw std::invalid_argument("n_seq_max must be in [1, " + std::to_string(kMaxSequences) + "], got " +
                                    std::to_string(n_seq_max));
    }
    if (n_seq_max > n_batch) {  // llama.cpp's worst-case graph gives every sequence a row of one batch (it aborts)
        throw std::invalid_argument("n_seq_max must be <= n_batch, got n_seq_max " + std::to_string(n_seq_max) +
                                    " and n_batch " + std::to_string(n_batch));
    }
    float share_sum = 0.0f;
    for (float share : tensor_split) {
        if (!std::isfinite(share) || share < 0.0f) {
            throw std::invalid_argument("tensor_split shares must be finite and >= 0, got " + std::to_string(share));
        }
        share_sum += share;
    }
    if (!tensor_split.empty() && share_sum <= 0.0f) throw std::invalid_argument("tensor_split shares are all 0");
    if (tensor_split.size() > llama_max_devices()) {
        throw std::invalid_argument("tensor_split has " + std::to_string(tensor_split.size()) +
                                    " shares; this build holds at most " + std::to_string(llama_max_devices()) +
                                    " devices");
    }
}

Model::Model(const ModelParams& params) : params_(params), verbose_(params.verbose) {
    params.validate();
    check_gguf_file(params.path);
    install_log_filter();
    check_gguf_metadata(params.path, false);
    take_last_llama_error();  // a stale message (or the check's own) must not become this load's reason

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = params.n_gpu_layers;
    mp.use_extra_bufts = params.repack;
    // Devices: the RPC workers, then the local accelerators (else llama.cpp's
    // default: the local ones; workers are never in ggml's list, devices.h).
    std::vector<BackendDevice> devices;
    if (!params.rpc.empty()) {
        devices = rpc_devices(params.rpc);
        for (BackendDevice dev : local_gpus()) devices.push_back(dev);
        if (params.tensor_split.size() > devices.size()) {
            throw std::invalid_argument("tensor_split has " + std::to_string(params.tensor_split.size()) +
                                        " shares for " + std::to_string(devices.size()) + " devices");
        }
        devices.push_back(nullptr);  // llama.cpp reads a NULL-terminated list
        mp.devices = devices.data();
    }
    std::vector<llama_model_tensor_buft_override> overrides;
    // The output layer's tensors, by name (a tied vocabulary's is token_embd's
    // duplicate), on the CPU: llama.cpp's n_gpu_layers would only ever keep the
    // *first* layers here.
    if (params.local_output) {
        overrides.push_back({"^(output|output_norm|token_embd)\\.weight$", ggml_backend_cpu_buffer_type()});
    }
    // Extra buffer types left out (AMX where it faults): llama.cpp can only turn
    // them all off, so the others are given back weight by weight. Offloaded
    // layers must not be pinned here, so with an accelerator or workers in play
    // the CPU's layers just go without (correct, a little slower).
    std::vector<BufferOverride> kept_extras;
    if (params.repack && has_extra_buffer_type(params.excluded_buffer_types)) {
        mp.use_extra_bufts = false;
        if (params.rpc.empty() && (params.n_gpu_layers == 0 || !has_local_gpu())) {
            kept_extras = overrides_without(params.path, params.excluded_buffer_types);
        }
        for (const BufferOverride& o : kept_extras) overrides.push_back({o.pattern.c_str(), o.buft});
    }
    if (!overrides.empty()) {
        overrides.push_back({nullptr, nullptr});  // llama.cpp reads a NULL-terminated list
        mp.tensor_buft_overrides = overrides.data();
    }
    std::vector<float> split(llama_max_devices(), 0.0f);  // llama.cpp reads llama_max_devices() shares
    std::copy(params.tensor_split.begin(), params.tensor_split.end(), split.begin());
    if (!params.tensor_split.empty()) mp.tensor_split = split.data();
    forget_weight_buffers();
    model_.reset(llama_model_load_from_file(params.path.c_str(), mp));
    weight_buffers_ = logged_weight_buffers();
    if (!model_) {
        throw InvalidModelError(with_llama_reason(
            "failed to load GGUF model " + params.path + ": the file is truncated or corrupt"));
    }
    // Rejected drafts are removed from the cache by position; recurrent state
    // cannot be rolled back that way, and would silently give wrong logits.
    if (llama_model_is_recurrent(model_.get()) || llama_model_is_hybrid(model_.get())) {
        throw InvalidModelError("unsupported model " + params.path +
                                ": its recurrent (or hybrid) memory cannot drop a rejected draft tail; "
                                "pyspec needs a transformer with a KV cache");
    }

    const int32_t n_threads = params.n_threads > 0
        ? params.n_threads
        : std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(std::max(params.n_ctx, 16));
    cp.n_batch = static_cast<uint32_t>(std::max(params.n_batch, 1));
    cp.n_ubatch = cp.n_batch;
    cp.n_seq_max = static_cast<uint32_t>(params.n_seq_max);
    // One cache for all sequences: a prompt copied to n samples shares its cells,
    // and sequences of uneven length split n_ctx as they grow.
    cp.kv_unified = true;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    cp.abort_callback = &Model::abort_requested;
    cp.abort_callback_data = this;
    // Flash attention: llama.cpp's choice unless asked for (on for the CPU). With
    // several sequences it is also the cheaper and the more stable one: its CPU
    // kernel skips masked cells, so a row costs its own sequence's cells, not the
    // whole unified cache's (8 rows over 4k cells, 1.5B Qwen, 2 cores: 278 ms
    // against 438 ms off); and a row's logits are bit-identical whatever the
    // other sequences hold, where without it they move (up to 0.33) with the
    // cache's extent (tests/test_model_sequences.py).
    const int32_t flash_attn = params.flash_attn;
    cp.flash_attn_type = static_cast<llama_flash_attn_type>(flash_attn);
    forget_flash_attn_choice();
    ctx_.reset(llama_init_from_model(model_.get(), cp));
    flash_attn_ = flash_attn >= 0 ? flash_attn : logged_flash_attn_choice();
    if (!ctx_) {
        throw InvalidModelError(with_llama_reason("failed to create a llama.cpp context for " + params.path));
    }
    vocab_ = llama_model_get_vocab(model_.get());
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    // GGUF strings are UTF-8 (any converter writes them so); llama.cpp does not
    // check. A token that is not would fail later, far from its cause (a Python
    // str of its text, an error message quoting it): refuse the file now.
    for (int32_t id = 0; id < n_vocab_; ++id) {
        const char* text = llama_vocab_get_text(vocab_, id);
        if (text != nullptr && !is_utf8(text)) {
            throw InvalidModelError("the vocabulary of " + params.path + " is corrupt: the text of token " +
                                    std::to_string(id) + " is not UTF-8");
        }
    }
    n_ctx_ = static_cast<int32_t>(llama_n_ctx(ctx_.get()));
    n_batch_ = static_cast<int32_t>(llama_n_batch(ctx_.get()));
    n_seq_ = static_cast<int32_t>(llama_n_seq_max(ctx_.get()));  // what the context really holds
    cached_.assign(static_cast<size_t>(n_seq_), {});
    batch_.reset(new BatchStorage(n_batch_));
}

Model::~Model() {
    // Freeing sends the workers "free" commands; to a worker that is gone,
    // ggml-rpc would abort the process. Such a model is left unfreed instead:
    // its layers lived on the worker, only its host-side parts leak.
    for (const auto& endpoint : params_.rpc) {
        if (!endpoint_reachable(endpoint, 1.0)) {
            (void)ctx_.release();
            (void)model_.release();
            break;
        }
    }
}

bool Model::abort_requested(void* self) {
    const std::atomic<bool>* flag = static_cast<Model*>(self)->abort_flag_.load();
    return flag != nullptr && flag->load(std::memory_order_relaxed);
}

size_t Model::checked_seq(int32_t seq) const {
    if (seq < 0 || seq >= n_seq_) {
        throw std::out_of_range("sequence " + std::to_string(seq) + " is outside [0, " + std::to_string(n_seq_) +
                                ") (raise n_seq_max)");
    }
    return static_cast<size_t>(seq);
}

void Model::check_token(int32_t token) const {
    if (token < 0 || token >= n_vocab_) {
        throw std::invalid_argument("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                                    std::to_string(n_vocab_) + ")");
    }
}

std::string Model::description() const {
    char buf[256];
    const int32_t n = llama_model_desc(model_.get(), buf, sizeof(buf));
    return n > 0 ? std::string(buf, std::min<size_t>(n, sizeof(buf) - 1)) : std::string();
}

uint64_t Model::n_params() const { return llama_model_n_params(model_.get()); }

int32_t Model::file_type() const { return static_cast<int32_t>(llama_model_ftype(model_.get())); }

// ---------------------------------------------------------------- tokenizer

namespace {

// llama.cpp's tokenizer throws std::out_of_range ("unordered_map::at") where a
// file's vocabulary lacks a token it needs (a byte token of SentencePiece's
// byte fallback, say): the file is at fault, so name it.
template <typename F>
auto vocab_call(const std::string& path, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::out_of_range& e) {
        throw InvalidModelError("the vocabulary of " + path + " lacks a token its tokenizer needs (llama.cpp: " +
                                e.what() + ")");
    }
}

}  // namespace

std::vector<int32_t> Model::tokenize(const std::string& text, bool add_special, bool parse_special) const {
    return vocab_call(params_.path, [&] {
        std::vector<int32_t> out(text.size() + 8);
        int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), out.data(),
                                   static_cast<int32_t>(out.size()), add_special, parse_special);
        if (n < 0) {
            if (n == INT32_MIN) throw std::length_error("text is too long to tokenize");
            out.resize(static_cast<size_t>(-n));
            n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), out.data(),
                               static_cast<int32_t>(out.size()), add_special, parse_special);
        }
        out.resize(static_cast<size_t>(std::max(n, 0)));
        return out;
    });
}

std::string Model::token_to_piece(int32_t token, bool special) const {
    check_token(token);
    return vocab_call(params_.path, [&] {
        char buf[256];
        int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, special);
        if (n >= 0) return std::string(buf, static_cast<size_t>(n));
        std::string big(static_cast<size_t>(-n), '\0');
        n = llama_token_to_piece(vocab_, token, big.data(), static_cast<int32_t>(big.size()), 0, special);
        big.resize(static_cast<size_t>(std::max(n, 0)));
        return big;
    });
}

std::string Model::detokenize(const std::vector<int32_t>& tokens, bool special) const {
    for (int32_t t : tokens) check_token(t);
    return vocab_call(params_.path, [&] {
        std::string out(tokens.size() * 8 + 16, '\0');
        int32_t n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                                     static_cast<int32_t>(out.size()), false, special);
        if (n < 0) {
            out.resize(static_cast<size_t>(-n));
            n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()), out.data(),
                                 static_cast<int32_t>(out.size()), false, special);
        }
        out.resize(static_cast<size_t>(std::max(n, 0)));
        return out;
    });
}

std::string Model::apply_chat_template(const std::vector<std::pair<std::string, std::string>>& messages,
                                       bool add_assistant) const {
    // No template in the file: llama.cpp's default, ChatML.
    const char* tmpl = llama_model_chat_template(model_.get(), nullptr);
    std::vector<llama_chat_message> chat;
    chat.reserve(messages.size());
    size_t total = 0;
    for (const auto& m : messages) {
        chat.push_back({m.first.c_str(), m.second.c_str()});
        total += m.first.size() + m.second.size();
    }
    std::string buf(2 * total + 256, '\0');
    int32_t n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(),
                                          static_cast<int32_t>(buf.size()));
    if (n > static_cast<int32_t>(buf.size())) {
        buf.resize(static_cast<size_t>(n));
        n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, buf.data(),
                                      static_cast<int32_t>(buf.size()));
    }
    if (n < 0) {
        throw InvalidModelError("llama.cpp does not support this model's chat template; use raw prompts");
    }
    buf.resize(static_cast<size_t>(n));
    return buf;
}

// ---------------------------------------------------------------- vocabulary

int32_t Model::vocab_type() const { return static_cast<int32_t>(llama_vocab_type(vocab_)); }
int32_t Model::bos() const { return llama_vocab_bos(vocab_); }
int32_t Model::eos() const { return llama_vocab_eos(vocab_); }
int32_t Model::eot() const { return llama_vocab_eot(vocab_); }
Model::FimTokens Model::fim_tokens() const {
    return {llama_vocab_fim_pre(vocab_), llama_vocab_fim_suf(vocab_), llama_vocab_fim_mid(vocab_),
            llama_vocab_fim_pad(vocab_), llama_vocab_fim_rep(vocab_), llama_vocab_fim_sep(vocab_)};
}
bool Model::add_bos() const { return llama_vocab_get_add_bos(vocab_); }
bool Model::add_eos() const { return llama_vocab_get_add_eos(vocab_); }
std::optional<std::string> Model::chat_template() const {
    const char* tmpl = llama_model_chat_template(model_.get(), nullptr);
    if (!tmpl) return std::nullopt;
    return std::string(tmpl);
}
bool Model::is_eog(int32_t token) const { return token >= 0 && token < n_vocab_ && llama_vocab_is_eog(vocab_, token); }
int32_t Model::token_attr(int32_t token) const {
    check_token(token);
    return static_cast<int32_t>(llama_vocab_get_attr(vocab_, token));
}

std::shared_ptr<const InfillVocab> Model::infill_vocab() const {
    std::call_once(infill_once_, [this] {
        auto v = std::make_shared<InfillVocab>();
        v->pieces.reserve(static_cast<size_t>(n_vocab_));
        v->eog.reserve(static_cast<size_t>(n_vocab_));
        for (int32_t t = 0; t < n_vocab_; ++t) {
            v->pieces.push_back(token_to_piece(t, false));
            v->eog.push_back(is_eog(t) ? 1 : 0);
        }
        v->end = eot() >= 0 ? eot() : eos();
        infill_vocab_ = std::move(v);
    });
    return infill_vocab_;
}

std::string Model::token_text(int32_t token) const {
    check_token(token);
    const char* t = llama_vocab_get_text(vocab_, token);
    return t ? std::string(t) : std::string();
}

// ---------------------------------------------------------------- decoding

void Model::decode(const int32_t* tokens, int32_t n, int32_t pos0, int32_t n_logits, int32_t seq) {
    if (n <= 0) throw std::invalid_argument("decode needs at least one token");
    if (n_logits < 0 || n_logits > n || n_logits > n_batch_) {
        throw std::invalid_argument("n_logits must be in [0, min(n, n_batch)]");
    }
    if (pos0 < 0 || static_cast<int64_t>(pos0) + n > n_ctx_) {
        throw ContextOverflowError("context overflow: " + std::to_string(pos0 + n) + " tokens do not fit in n_ctx=" +
                                   std::to_string(n_ctx_));
    }
    std::vector<int32_t>& cached = cached_[checked_seq(seq)];
    const auto held = lock();
    if (pos0 > static_cast<int32_t>(cached.size())) {
        throw std::invalid_argument("decode would leave a gap in the KV cache (pos0 past the cached tokens)");
    }
    truncate(pos0, seq);
    llama_batch& b = batch_->batch;
    // Chunk so that the last chunk holds every token whose logits we keep.
    int32_t done = 0;
    while (done < n) {
        int32_t remaining = n - done;
        int32_t chunk = std::min(remaining, n_batch_);
        if (remaining > n_batch_ && remaining - chunk < n_logits) chunk = remaining - n_logits;
        const int32_t first_logit = n - n_logits;  // global index of logits(0)
        b.n_tokens = chunk;
        for (int32_t i = 0; i < chunk; ++i) {
            const int32_t g = done + i;
            b.token[i] = tokens[g];
            b.pos[i] = pos0 + g;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = seq;
            b.logits[i] = g >= first_logit ? 1 : 0;
        }
        const int32_t rc = abort_requested(this) ? 2 : compute::run([&] { return llama_decode(ctx_.get(), b); });
        if (rc != 0) {
            // Leave the cache exactly as it was before this call.
            truncate(pos0, seq);
            if (rc == 2 && abort_requested(this)) throw Cancelled("cancelled");
            if (rc == 1) {
                throw ContextOverflowError(with_llama_reason("no KV-cache slot for the batch (context full)"));
            }
            throw DecodeError(with_llama_reason("llama_decode failed with code " + std::to_string(rc)));
        }
        launched();
        cached.insert(cached.end(), tokens + done, tokens + done + chunk);
        n_decoded_ += chunk;
        if (done + chunk == n) {
            logit_rows_.clear();
            for (int32_t r = chunk - n_logits; r < chunk; ++r) logit_rows_.push_back(r);
        }
        done += chunk;
    }
    if (sim_synced_) wait_for_work();
}

void Model::decode_rows(const Row* rows, int32_t n) {
    if (n <= 0) throw std::invalid_argument("decode_rows needs at least one row");
    if (n > n_batch_) {
        throw std::invalid_argument(std::to_string(n) + " rows do not fit one batch (n_batch " +
                                    std::to_string(n_batch_) + ")");
    }
    const auto held = lock();
    // Each sequence's rows must continue its cache in order: where it starts,
    // to restore it on failure, and where the next row must go.
    std::vector<int32_t> start(static_cast<size_t>(n_seq_), -1), next(static_cast<size_t>(n_seq_), -1);
    for (int32_t i = 0; i < n; ++i) {
        const Row& r = rows[i];
        const size_t s = checked_seq(r.seq);
        check_token(r.token);
        if (next[s] < 0) start[s] = next[s] = static_cast<int32_t>(cached_[s].size());
        if (r.pos != next[s]) {
            throw std::invalid_argument("row " + std::to_string(i) + " of sequence " + std::to_string(r.seq) +
                                        " is at position " + std::to_string(r.pos) + ", expected " +
                                        std::to_string(next[s]) + " (rows must continue the cached tokens)");
        }
        if (r.pos >= n_ctx_) {
            throw ContextOverflowError("context overflow: sequence " + std::to_string(r.seq) + " would reach " +
                                       std::to_string(r.pos + 1) + " tokens; n_ctx=" + std::to_string(n_ctx_));
        }
        ++next[s];
    }
    llama_batch& b = batch_->batch;
    b.n_tokens = n;
    std::vector<int32_t> logit_rows;
    for (int32_t i = 0; i < n; ++i) {
        b.token[i] = rows[i].token;
        b.pos[i] = rows[i].pos;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = rows[i].seq;
        b.logits[i] = rows[i].logits ? 1 : 0;
        if (rows[i].logits) logit_rows.push_back(i);
    }
    const int32_t rc = abort_requested(this) ? 2 : compute::run([&] { return llama_decode(ctx_.get(), b); });
    if (rc != 0) {
        for (int32_t s = 0; s < n_seq_; ++s) {
            if (start[static_cast<size_t>(s)] >= 0) truncate(start[static_cast<size_t>(s)], s);
        }
        if (rc == 2 && abort_requested(this)) throw Cancelled("cancelled");
        if (rc == 1) throw ContextOverflowError(with_llama_reason("no KV-cache slot for the batch (context full)"));
        throw DecodeError(with_llama_reason("llama_decode failed with code " + std::to_string(rc)));
    }
    launched();
    for (int32_t i = 0; i < n; ++i) cached_[static_cast<size_t>(rows[i].seq)].push_back(rows[i].token);
    n_decoded_ += n;
    logit_rows_ = std::move(logit_rows);
    if (sim_synced_) wait_for_work();
}

void Model::wait_for_work() const {
    llama_synchronize(ctx_.get());
    wait_simulated();
}

void Model::simulate_async(double latency_s, bool synced) {
    if (!(latency_s >= 0)) throw std::invalid_argument("latency_s must be >= 0");
    const auto held = lock();
    sim_latency_s_ = latency_s;
    sim_synced_ = synced;
    sim_done_ = std::chrono::steady_clock::now();
}

void Model::launched() {
    if (sim_latency_s_ <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    sim_done_ = std::max(sim_done_, now) + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(sim_latency_s_));
}

void Model::wait_simulated() const {
    if (sim_latency_s_ > 0) std::this_thread::sleep_until(sim_done_);
}

const float* Model::logits(int32_t row) const {
    if (row < 0 || row >= static_cast<int32_t>(logit_rows_.size())) {
        throw std::out_of_range("no logits kept for that row");
    }
    wait_simulated();  // (llama_get_logits_ith waits for the real work itself)
    const float* p = llama_get_logits_ith(ctx_.get(), logit_rows_[static_cast<size_t>(row)]);
    if (!p) throw DecodeError("llama.cpp returned no logits for row " + std::to_string(row));
    return p;
}

void Model::claim(const void* owner) {
    const void* expected = nullptr;
    if (!claim_.compare_exchange_strong(expected, owner) && expected != owner) {
        throw std::runtime_error("the model " + params_.path + " is in use by a batch session (a server's): its "
                                 "sequences cannot be shared; load the model again for other work");
    }
}

void Model::test_share_cell(int32_t src, int32_t dst, int32_t pos) {
    checked_seq(src);
    checked_seq(dst);
    const auto held = lock();
    llama_memory_seq_cp(llama_get_memory(ctx_.get()), src, dst, pos, pos + 1);
}

void Model::test_hide_cell(int32_t seq, int32_t pos) {
    checked_seq(seq);
    const auto held = lock();
    if (!llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, pos, pos + 1)) {
        throw DecodeError("llama.cpp could not remove position " + std::to_string(pos) + " of sequence " +
                          std::to_string(seq));
    }
}

void Model::truncate(int32_t pos, int32_t seq) {
    std::vector<int32_t>& cached = cached_[checked_seq(seq)];
    const auto held = lock();
    pos = std::max(pos, 0);
    if (pos < static_cast<int32_t>(cached.size())) cached.resize(static_cast<size_t>(pos));
    if (!llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, pos, -1)) {
        throw DecodeError("llama.cpp could not remove positions >= " + std::to_string(pos) + " of sequence " +
                          std::to_string(seq) + " from the cache of " + params_.path);
    }
}

void Model::copy_prefix(int32_t src, int32_t dst, int32_t n) {
    const std::vector<int32_t>& from = cached_[checked_seq(src)];
    checked_seq(dst);
    const auto held = lock();
    if (n < 0 || n > static_cast<int32_t>(from.size())) {
        throw std::invalid_argument("sequence " + std::to_string(src) + " holds " + std::to_string(from.size()) +
                                    " tokens; cannot copy " + std::to_string(n));
    }
    if (src == dst) {
        truncate(n, dst);
        return;
    }
    truncate(0, dst);
    if (n == 0) return;
    llama_memory_seq_cp(llama_get_memory(ctx_.get()), src, dst, 0, n);
    cached_[static_cast<size_t>(dst)].assign(from.begin(), from.begin() + n);
}

size_t Model::adopt_prefix(int32_t dst, const std::vector<int32_t>& tokens, size_t limit) {
    const auto held = lock();
    const auto shared = [&](int32_t j) { return common_prefix(cached_[static_cast<size_t>(j)], tokens, limit); };
    checked_seq(dst);
    int32_t src = dst;
    size_t best = shared(dst);
    for (int32_t j = 0; j < n_seq(); ++j) {
        const size_t c = j == dst ? 0 : shared(j);
        if (c > best) {
            best = c;
            src = j;
        }
    }
    copy_prefix(src, dst, static_cast<int32_t>(best));
    return best;
}

std::string Model::save_state(int32_t seq) const {
    checked_seq(seq);
    const auto held = lock();
    std::string out(llama_state_seq_get_size(ctx_.get(), seq), '\0');
    const size_t n = llama_state_seq_get_data(ctx_.get(), reinterpret_cast<uint8_t*>(out.data()), out.size(), seq);
    out.resize(n);
    return out;
}

bool Model::load_state(int32_t seq, const std::string& state, const std::vector<int32_t>& tokens) {
    const size_t j = checked_seq(seq);
    const auto held = lock();
    truncate(0, seq);
    if (state.empty() || tokens.empty()) return false;
    const size_t n = llama_state_seq_set_data(ctx_.get(), reinterpret_cast<const uint8_t*>(state.data()), state.size(),
                                              seq);
    // Trust the bytes only if they hold exactly positions 0..tokens-1 (a state of
    // another length, or none, would leave the record and the cells apart).
    if (n == 0 || pos_max(seq) != static_cast<int32_t>(tokens.size()) - 1) {
        truncate(0, seq);
        return false;
    }
    cached_[j] = tokens;
    return true;
}

int32_t Model::pos_max(int32_t seq) const {
    checked_seq(seq);
    const auto held = lock();
    return llama_memory_seq_pos_max(llama_get_memory(ctx_.get()), seq);
}

}  // namespace pyspec
