// The part of llguidance's C ABI that pyspec calls, declared from its
// documentation (llguidance.h of the version pinned in pyproject.toml). The
// PyPI wheel ships no header and no separate C library, but its native module
// (llguidance/_lib.abi3.so) exports these llg_* functions: pyspec opens that
// file (its path comes from Python) and resolves them by name, so masks are
// computed in llguidance's native code without Python in the loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyspec::llg {

struct Tokenizer;  // LlgTokenizer
struct Matcher;    // LlgMatcher

struct ParserLimits {  // LlgParserLimits; zero fields take the library's defaults
    size_t max_items_in_row;
    uint64_t initial_lexer_fuel;
    uint64_t step_lexer_fuel;
    size_t step_max_items;
    size_t max_lexer_states;
    size_t max_grammar_size;
    bool precompute_large_lexemes;
    bool verbose_errors;
};

struct ConstraintInit {  // LlgConstraintInit
    const Tokenizer* tokenizer;
    uint32_t log_buffer_level;
    uint32_t log_stderr_level;
    bool ff_tokens_ok;
    bool backtrack_ok;
    ParserLimits limits;
};

// Tokenizes `len` bytes (no BOS) into at most `cap` tokens; returns the full count.
using TokenizeFn = size_t (*)(const void* user, const uint8_t* bytes, size_t len, uint32_t* out, size_t cap);

struct TokenizerInitV2 {  // LlgTokenizerInitV2; struct_size makes it forward compatible
    size_t struct_size;
    uint32_t vocab_size;
    uint32_t tok_eos;
    const uint32_t* token_lens;
    const uint8_t* token_bytes;
    const char* tokenizer_json;
    bool tokenize_assumes_string;
    TokenizeFn tokenize_fn;
    bool use_approximate_greedy_tokenize_fn;
    const void* tokenize_user_data;
    const char* const* slices;
    const uint32_t* tok_eos_extra;
    uint32_t tok_eos_extra_count;
};

// Bytes that mark a special token's text in TokenizerInitV2::token_bytes.
constexpr uint8_t kSpecialTokenMarker = 0xFF;

// The functions, resolved from the library once (Api::load).
struct Api {
    Tokenizer* (*new_tokenizer_v2)(const TokenizerInitV2*, char* err, size_t err_len);
    void (*free_tokenizer)(Tokenizer*);
    void (*constraint_init_set_defaults)(ConstraintInit*, const Tokenizer*);
    Matcher* (*new_matcher)(const ConstraintInit*, const char* type, const char* data);
    const char* (*matcher_get_error)(Matcher*);
    size_t (*matcher_get_mask_byte_size)(const Matcher*);
    int32_t (*matcher_compute_mask_into)(Matcher*, uint32_t* dest, size_t byte_len);
    int32_t (*matcher_consume_token)(Matcher*, uint32_t token);
    int32_t (*matcher_rollback)(Matcher*, size_t n);
    int32_t (*matcher_compute_ff_tokens)(Matcher*, uint32_t* out, size_t cap);
    int32_t (*matcher_validate_tokens)(Matcher*, const uint32_t* tokens, size_t n);
    bool (*matcher_is_accepting)(Matcher*);
    bool (*matcher_is_stopped)(const Matcher*);
    Matcher* (*clone_matcher)(const Matcher*);
    void (*free_matcher)(Matcher*);
    const char* (*get_version)();

    // The functions of the library at `path` (loaded once per process; a second
    // call with another path is an error). std::runtime_error naming what is missing.
    static const Api& load(const std::string& path);
};

}  // namespace pyspec::llg
