// What one generation measured. The one schema of these numbers: Python reads
// the fields from the bound struct (pyspec/results.py adds only derived ones).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "policies/policy.h"

namespace pyspec {

struct GenerationStats {
    int32_t n_prompt_tokens = 0;
    int32_t n_cached_tokens = 0;   // prompt tokens found in the cache (not decoded for this sequence)
    int32_t n_prompt_decoded = 0;  // prompt tokens decoded for it (fewer than the rest if it ended first)
    int32_t n_generated = 0;
    double prompt_s = 0;      // prompt processing (target and drafter)
    double ttft_s = 0;        // call start -> first token sampled
    double decode_s = 0;      // first token -> last token
    double decode_tok_s = 0;  // (n_generated - 1) / decode_s
    int32_t rounds = 0;       // rounds (target decodes of its drafts)
    int32_t drafted = 0;
    int32_t accepted = 0;
    double draft_s = 0;       // drafter time (its decodes and sampling)
    double verify_s = 0;      // target decodes (public name kept: users read it; "target time")
    double overhead_s = 0;    // host work: distributions, the accept test, text, callbacks
    double calibrate_s = 0;   // timing the target's batch sizes between rounds for the policy (first uses only)
    std::vector<int32_t> drafted_at;   // per draft position 1..k: rounds that drafted it
    std::vector<int32_t> accepted_at;  // ... and accepted it
    std::vector<int32_t> length_hist;  // rounds by number of drafted tokens (index 0: plain steps)
    int32_t policy_plain = 0;          // rounds where the policy chose plain decoding (length 0)
    int32_t ngram_rounds = 0;          // rounds drafted by n-gram lookup (hybrid/ngram drafters)
    int32_t ngram_drafted = 0;         // ... their drafted tokens
    int32_t ngram_accepted = 0;        // ... and accepted ones
    int32_t ngram_reanchored = 0;      // n-gram rounds that drafted from a copy re-anchored after an edit
    int32_t memory_rounds = 0;         // n-gram rounds that copied from memory (suffix drafter)
    int32_t memory_drafted = 0;        // ... their drafted tokens
    int32_t memory_accepted = 0;       // ... and accepted ones
    int32_t ngram_guesses = 0;         // plain rounds that checked the n-gram's guess for free
    int32_t ngram_guess_hits = 0;      // ... and found it right
    int32_t stops_before = 0;          // drafts the stop rule ended before drawing a token
    int32_t stops_after = 0;           // ... and right after a token it kept, short of the length asked
    int32_t forced_rounds = 0;         // rounds that drafted text the grammar forces (constraint/grammar.h)
    int32_t forced_drafted = 0;        // ... their drafted tokens
    int32_t forced_accepted = 0;       // ... and accepted ones
    int32_t grammar_cuts = 0;          // lookup drafts cut before a token the grammar refuses
    int32_t draft_windows = 0;         // draft-model catch-ups that started over on a window (model_drafter.h)
    int32_t first_with_prompt = 0;     // 1: the first token came from the prompt's last decode (decode.cpp)
    int64_t masks = 0;                 // grammar masks computed (one per constrained position)
    double mask_s = 0;                 // ... and their seconds (part of overhead_s and draft_s)
    std::vector<double> pit;           // TEST-ONLY (TestControls::pit): each decided token's PIT under its row

    // Per-position tables sized for drafts of up to draft_max tokens.
    void reset_tables(int32_t draft_max) {
        drafted_at.assign(static_cast<size_t>(draft_max), 0);
        accepted_at.assign(static_cast<size_t>(draft_max), 0);
        length_hist.assign(static_cast<size_t>(draft_max) + 1, 0);
    }

    // Count one round: what was drafted from where, and how much the target accepted.
    void count_round(const RoundReport& r) {
        ++rounds;
        ngram_guesses += r.guess_hit >= 0;
        ngram_guess_hits += r.guess_hit > 0;
        policy_plain += r.plan.length == 0;
        drafted += r.drafted;
        accepted += r.accepted;
        draft_s += r.draft_s;
        verify_s += r.target_s;
        if (r.drafted < static_cast<int32_t>(length_hist.size())) ++length_hist[static_cast<size_t>(r.drafted)];
        for (int32_t i = 0; i < r.drafted; ++i) {
            ++drafted_at[static_cast<size_t>(i)];
            accepted_at[static_cast<size_t>(i)] += i < r.accepted;
        }
        if (r.plan.forced) {
            ++forced_rounds;
            forced_drafted += r.drafted;
            forced_accepted += r.accepted;
        } else if (r.drafted > 0 && r.plan.source == DraftSource::kNgram) {
            ++ngram_rounds;
            ngram_drafted += r.drafted;
            ngram_accepted += r.accepted;
            ngram_reanchored += r.plan.near_copy;
            if (r.plan.from_memory) {
                ++memory_rounds;
                memory_drafted += r.drafted;
                memory_accepted += r.accepted;
            }
        }
    }
};

}  // namespace pyspec
