#include "constraint/grammar.h"

#include <dlfcn.h>
#include <llama.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/errors.h"
#include "model/model.h"

namespace pyspec {

// ---------------------------------------------------------------- the library

namespace llg {

const Api& Api::load(const std::string& path) {
    static std::mutex mutex;
    static Api api{};
    static std::string loaded;
    std::lock_guard<std::mutex> lock(mutex);
    if (!loaded.empty()) {
        if (path != loaded) {
            throw std::runtime_error("llguidance is already loaded from " + loaded + ", not " + path);
        }
        return api;
    }
    // Python has imported this module already: dlopen finds the same copy.
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error("cannot open llguidance's library " + path + ": " + dlerror());
    auto get = [&](auto& fn, const char* name) {
        void* sym = dlsym(lib, name);
        if (!sym) {
            throw std::runtime_error(std::string("llguidance's library ") + path + " lacks " + name +
                                     " (pyproject.toml pins the version pyspec was written for)");
        }
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
    };
    Api a{};
    get(a.new_tokenizer_v2, "llg_new_tokenizer_v2");
    get(a.free_tokenizer, "llg_free_tokenizer");
    get(a.constraint_init_set_defaults, "llg_constraint_init_set_defaults");
    get(a.new_matcher, "llg_new_matcher");
    get(a.matcher_get_error, "llg_matcher_get_error");
    get(a.matcher_get_mask_byte_size, "llg_matcher_get_mask_byte_size");
    get(a.matcher_compute_mask_into, "llg_matcher_compute_mask_into");
    get(a.matcher_consume_token, "llg_matcher_consume_token");
    get(a.matcher_rollback, "llg_matcher_rollback");
    get(a.matcher_compute_ff_tokens, "llg_matcher_compute_ff_tokens");
    get(a.matcher_validate_tokens, "llg_matcher_validate_tokens");
    get(a.matcher_is_accepting, "llg_matcher_is_accepting");
    get(a.matcher_is_stopped, "llg_matcher_is_stopped");
    get(a.clone_matcher, "llg_clone_matcher");
    get(a.free_matcher, "llg_free_matcher");
    get(a.get_version, "llg_get_version");
    api = a;
    loaded = path;
    return api;
}

}  // namespace llg

// ---------------------------------------------------------------- vocabulary

GrammarVocab::GrammarVocab(const Model& model, const std::string& library)
    : model_(model), api_(llg::Api::load(library)), n_vocab_(model.n_vocab()) {
    // Each token's bytes as the model writes them; a control token (nothing
    // written without `special`) is its text behind the special-token marker,
    // so that grammars can name it (<|im_end|>) but text never spells it.
    std::vector<uint32_t> lens(static_cast<size_t>(n_vocab_));
    std::string bytes;
    std::vector<uint32_t> eos_extra;
    for (int32_t id = 0; id < n_vocab_; ++id) {
        std::string piece = model.token_to_piece(id, false);
        if (piece.empty()) {
            std::string name = model.token_to_piece(id, true);
            if (name.empty()) name = "<[" + std::to_string(id) + "]>";
            piece = std::string(1, static_cast<char>(llg::kSpecialTokenMarker)) + name;
        }
        lens[static_cast<size_t>(id)] = static_cast<uint32_t>(piece.size());
        bytes += piece;
    }
    const int32_t eos = model.eos() >= 0 ? model.eos() : model.eot();
    for (int32_t id = 0; id < n_vocab_; ++id) {
        if (id != eos && model.is_eog(id)) eos_extra.push_back(static_cast<uint32_t>(id));
    }
    if (eos < 0) throw ConstraintError("the model has no end-of-generation token; a grammar needs one to end");
    llg::TokenizerInitV2 init{};
    init.struct_size = sizeof(init);
    init.vocab_size = static_cast<uint32_t>(n_vocab_);
    init.tok_eos = static_cast<uint32_t>(eos);
    init.token_lens = lens.data();
    init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
    init.tokenize_assumes_string = true;  // llama's tokenizers expect text
    init.tokenize_fn = &GrammarVocab::tokenize;
    init.tokenize_user_data = this;
    init.tok_eos_extra = eos_extra.data();
    init.tok_eos_extra_count = static_cast<uint32_t>(eos_extra.size());
    char err[1024] = {0};
    tokenizer_ = api_.new_tokenizer_v2(&init, err, sizeof(err));
    if (!tokenizer_) throw ConstraintError(std::string("llguidance could not read the model's vocabulary: ") + err);
}

GrammarVocab::~GrammarVocab() {
    if (tokenizer_) api_.free_tokenizer(tokenizer_);
}

std::string GrammarVocab::version() const { return api_.get_version(); }

size_t GrammarVocab::tokenize(const void* self, const uint8_t* bytes, size_t len, uint32_t* out, size_t cap) {
    // Called by llguidance (possibly on its own threads): no exception may leave.
    try {
        const auto* v = static_cast<const GrammarVocab*>(self);
        const std::vector<int32_t> t =
            v->model_.tokenize(std::string(reinterpret_cast<const char*>(bytes), len), false, false);
        for (size_t i = 0; i < t.size() && i < cap; ++i) out[i] = static_cast<uint32_t>(t[i]);
        return t.size();
    } catch (...) {
        return 0;
    }
}

// ---------------------------------------------------------------- grammar

namespace {

// llguidance's defaults, written into room for a larger struct: the library
// may know more fields than this header does.
llg::ConstraintInit constraint_init(const GrammarVocab& vocab) {
    alignas(llg::ConstraintInit) unsigned char room[1024] = {0};
    auto* init = reinterpret_cast<llg::ConstraintInit*>(room);
    vocab.api().constraint_init_set_defaults(init, vocab.tokenizer());
    llg::ConstraintInit out = *init;
    out.log_stderr_level = 0;  // errors come back as ConstraintError, not on stderr
    out.log_buffer_level = 0;
    out.limits.verbose_errors = false;  // a reason, not the parser's whole state
    return out;
}

}  // namespace

Grammar::Grammar(std::shared_ptr<const GrammarVocab> vocab, const std::string& kind, const std::string& text)
    : vocab_(std::move(vocab)), kind_(kind) {
    if (kind != "json_schema" && kind != "lark" && kind != "regex") {
        throw std::invalid_argument("grammar kind must be 'json_schema', 'lark' or 'regex', got '" + kind + "'");
    }
    const llg::ConstraintInit init = constraint_init(*vocab_);
    compiled_ = vocab_->api().new_matcher(&init, kind.c_str(), text.c_str());
    if (const char* err = vocab_->api().matcher_get_error(compiled_)) {
        const std::string msg = err;
        vocab_->api().free_matcher(compiled_);
        compiled_ = nullptr;
        throw ConstraintError(msg);
    }
}

Grammar::~Grammar() {
    if (compiled_) vocab_->api().free_matcher(compiled_);
}

llg::Matcher* Grammar::start() const {
    std::lock_guard<std::mutex> lock(clone_mutex_);
    return vocab_->api().clone_matcher(compiled_);
}

// ---------------------------------------------------------------- one sequence

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar, bool tolerant)
    : grammar_(std::move(grammar)), tolerant_(tolerant), api_(grammar_->vocab().api()), matcher_(grammar_->start()),
      n_vocab_(grammar_->vocab().n_vocab()),
      words_(api_.matcher_get_mask_byte_size(matcher_) / sizeof(uint32_t)) {}

GrammarState::~GrammarState() { api_.free_matcher(matcher_); }

void GrammarState::fail(const char* what) {
    const char* err = api_.matcher_get_error(matcher_);
    throw ConstraintError(std::string(what) + ": " + (err ? err : "llguidance gave no reason"));
}

const uint32_t* GrammarState::mask(int32_t i) {
    if (i < computed_) return masks_buf_.data() + static_cast<size_t>(i) * words_;
    if (i != pushed_ || i != computed_) throw std::logic_error("GrammarState::mask: position out of order");
    if (masks_buf_.size() < (static_cast<size_t>(i) + 1) * words_) {
        masks_buf_.resize((static_cast<size_t>(i) + 1) * words_);
    }
    uint32_t* dest = masks_buf_.data() + static_cast<size_t>(i) * words_;
    const auto t0 = std::chrono::steady_clock::now();
    if (api_.matcher_compute_mask_into(matcher_, dest, words_ * sizeof(uint32_t)) != 0) fail("the grammar failed");
    mask_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++masks_;
    ++computed_;
    return dest;
}

bool GrammarState::consume(int32_t token) {
    // A finished grammar allows only EOS, which ends the sequence: there is
    // nothing left to advance (llguidance refuses to consume past its end).
    if (api_.matcher_is_stopped(matcher_)) return false;
    if (tolerant_ && api_.matcher_validate_tokens(matcher_, reinterpret_cast<const uint32_t*>(&token), 1) != 1) {
        return false;
    }
    if (api_.matcher_consume_token(matcher_, static_cast<uint32_t>(token)) != 0) {
        fail("the grammar refused a token it allowed");
    }
    return true;
}

void GrammarState::push(int32_t token) {
    if (consume(token)) ++consumed_;
    ++pushed_;
}

int32_t GrammarState::forced(int32_t max_n, std::vector<int32_t>& out) {
    out.clear();
    if (max_n <= 0 || api_.matcher_is_stopped(matcher_)) return 0;
    if (ff_.size() < static_cast<size_t>(max_n)) ff_.resize(static_cast<size_t>(max_n));
    const int32_t n = api_.matcher_compute_ff_tokens(matcher_, ff_.data(), static_cast<size_t>(max_n));
    if (n < 0) fail("the grammar failed");
    for (int32_t i = 0; i < n && i < max_n; ++i) out.push_back(static_cast<int32_t>(ff_[static_cast<size_t>(i)]));
    return static_cast<int32_t>(out.size());
}

void GrammarState::commit(int32_t n_accepted, int32_t next) {
    if (n_accepted < 0 || n_accepted > pushed_) throw std::logic_error("GrammarState::commit: more accepted than pushed");
    // Drafts pushed after the grammar's end were never consumed.
    const int32_t drop = consumed_ - std::min(n_accepted, consumed_);
    if (drop > 0 && api_.matcher_rollback(matcher_, static_cast<size_t>(drop)) != 0) {
        fail("the grammar could not roll back");
    }
    consume(next);
    pushed_ = 0;
    consumed_ = 0;
    computed_ = 0;
}

}  // namespace pyspec
