// Constrained generation: a grammar that decides, after every prefix, which
// tokens may come next. The grammar engine is llguidance (JSON schema, Lark,
// regex), called through its C ABI (llguidance_abi.h); nothing here parses.
//
// ========================= The constrained target =========================
// This is the one place the rule is written down; the engine and the tests
// refer here. Under a constraint, the distribution the output must follow at
// each position is the target's logits with every token the grammar forbids
// after the accepted prefix set to -inf, then the sampling chain of
// sampling.h ("Order of settings") on what is left: p restricted to the
// allowed tokens and renormalised (the truncations then act on the allowed
// tokens only). EOS is allowed exactly where the grammar accepts.
//
// Speculation stays lossless against that target because every distribution
// the accept test sees obeys the same rule:
//   - the target's p at draft position i is masked with the grammar's state
//     after drafts 0..i-1 (pushed before; GrammarState::mask(i));
//   - a draft model samples from its q masked the same way (those masks are
//     needed for p anyway, so masking q is free, and it raises acceptance); the
//     q the accept test divides by is the masked q the token was drawn from;
//   - a deterministic draft (lookup, or forced text) is cut before its first
//     token the grammar refuses: such a token would be rejected with certainty
//     (masked p is 0 there) and the residual would be masked p itself, which is
//     what the bonus sample after the cut draws from;
//   - text the grammar forces is proposed as a draft (one-hot q) and verified
//     like any other: the forced *string* is fixed, its *tokenization* is not.
// After the accept test the grammar keeps the accepted drafts and the next
// token and rolls back the rest (GrammarState::commit).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "constraint/llguidance_abi.h"
#include "core/row.h"

namespace pyspec {

class Model;

// llguidance's view of a model's vocabulary (token bytes, EOS tokens, and the
// model's tokenizer for forced text): built once per model, about a second
// at 152k tokens. The model must outlive it.
class GrammarVocab {
public:
    // `library`: the path of llguidance's native module (pyspec/constraints.py, library_path, finds it).
    GrammarVocab(const Model& model, const std::string& library);
    ~GrammarVocab();
    GrammarVocab(const GrammarVocab&) = delete;
    GrammarVocab& operator=(const GrammarVocab&) = delete;

    int32_t n_vocab() const { return n_vocab_; }
    const llg::Api& api() const { return api_; }
    const llg::Tokenizer* tokenizer() const { return tokenizer_; }
    std::string version() const;

private:
    static size_t tokenize(const void* self, const uint8_t* bytes, size_t len, uint32_t* out, size_t cap);

    const Model& model_;
    const llg::Api& api_;
    int32_t n_vocab_;
    llg::Tokenizer* tokenizer_ = nullptr;
};

// A compiled grammar: the state every sequence that follows it starts from.
// Shared by the sequences of a batch and the requests of a server.
class Grammar {
public:
    // kind: "json_schema", "lark" or "regex" (llguidance's formats). Throws
    // ConstraintError with llguidance's message when the text does not compile.
    Grammar(std::shared_ptr<const GrammarVocab> vocab, const std::string& kind, const std::string& text);
    ~Grammar();
    Grammar(const Grammar&) = delete;
    Grammar& operator=(const Grammar&) = delete;

    const GrammarVocab& vocab() const { return *vocab_; }
    const std::string& kind() const { return kind_; }
    // A matcher at the start (a copy of the compiled one).
    llg::Matcher* start() const;

private:
    std::shared_ptr<const GrammarVocab> vocab_;
    std::string kind_;
    llg::Matcher* compiled_ = nullptr;
    mutable std::mutex clone_mutex_;
};

// One sequence's place in its grammar, and the round protocol of the engine
// (the constrained target above):
//   mask(i)         the allowed tokens at draft position i; i == pushed(): the
//                   state after the i drafts of this round pushed so far;
//   push(token)     a draft token (allowed by mask(pushed())) joins the state;
//   forced(max, out) the tokens the grammar forces from here (before any push);
//   commit(n, next) the round's accept test kept n drafts and drew `next`.
// Masks of a round are kept, so the target's rows reuse the draft's.
class GrammarState {
public:
    // tolerant: TEST-ONLY (engine.h, TestControls::grammar): a refused token is
    // skipped instead of failing.
    explicit GrammarState(std::shared_ptr<const Grammar> grammar, bool tolerant = false);
    ~GrammarState();
    GrammarState(const GrammarState&) = delete;
    GrammarState& operator=(const GrammarState&) = delete;

    int32_t n_vocab() const { return n_vocab_; }
    int32_t pushed() const { return pushed_; }
    const uint32_t* mask(int32_t i);
    static bool allows(const uint32_t* mask, int32_t token) { return mask_allows(mask, token); }
    void push(int32_t token);
    int32_t forced(int32_t max_n, std::vector<int32_t>& out);
    void commit(int32_t n_accepted, int32_t next);

    // What it cost: masks computed, and their seconds.
    int64_t masks() const { return masks_; }
    double mask_s() const { return mask_s_; }

private:
    [[noreturn]] void fail(const char* what);
    bool consume(int32_t token);  // false: the grammar had ended (only EOS was allowed)

    std::shared_ptr<const Grammar> grammar_;
    bool tolerant_;
    const llg::Api& api_;
    llg::Matcher* matcher_;
    int32_t n_vocab_;
    size_t words_;                  // 32-bit words per mask
    std::vector<uint32_t> masks_buf_;  // mask i at [i * words_, (i + 1) * words_)
    int32_t computed_ = 0;          // masks 0..computed_-1 of this round are in masks_buf_
    int32_t pushed_ = 0;
    int32_t consumed_ = 0;          // of the pushed drafts, those the matcher advanced over
    std::vector<uint32_t> ff_;
    int64_t masks_ = 0;
    double mask_s_ = 0;
};

// mask_logits: core/row.h.

}  // namespace pyspec
