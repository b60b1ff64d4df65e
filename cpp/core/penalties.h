// Logit biases and repetition penalties: the steps llama.cpp's sampler chains run
// before truncation and temperature (common_sampler's chain, and
// llama-cpp-python's: logit bias first, then penalties), here applied to a copy of
// one row's logits. compute_distribution() then runs the "Order of settings" of
// core/sampling.h on the result.
//
// The penalties look at a window of the tokens before the row: its last `last_n`
// tokens (-1: all of them; 0: penalties off), from the prompt's first token when
// `include_prompt` (llama-server and llama-cli accept the prompt into the sampler)
// or from the first generated token (llama-cpp-python's sampler sees only what it
// sampled). For a token seen c > 0 times there (llama_sampler_penalties_apply):
//
//     l = l > 0 ? l / repeat : l * repeat;   l -= c * frequency + presence;
//
// in float, as llama.cpp computes it. -inf stays -inf (a masked or forbidden token).
//
// Why speculation stays lossless with them: verification row i is the target's
// distribution after the prefix ending in drafts 0..i-1, so its window must hold
// those drafts (the engine builds it that way, cpp/engine/round.cpp). A window of
// the accepted prefix only would sample row i under the wrong history, which is
// exactly the TEST-ONLY control TestControls::penalties ("stale"; "last_draft": only
// draft i-1, wrong from row 2 on) that the χ² tests must catch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pyspec {

struct Penalties {
    float repeat = 1.0f;      // > 0; 1 = off
    float frequency = 0.0f;   // finite; 0 = off
    float presence = 0.0f;    // finite; 0 = off
    int32_t last_n = 64;      // window: -1 all tokens, 0 off
    bool include_prompt = true;
    // (token, bias) added to the logit before the penalties; -inf forbids the token.
    std::vector<std::pair<int32_t, float>> logit_bias;

    bool penalizes() const { return last_n != 0 && (repeat != 1.0f || frequency != 0.0f || presence != 0.0f); }
    bool active() const { return penalizes() || !logit_bias.empty(); }
    // std::invalid_argument for a repeat penalty <= 0 or not finite, a NaN or infinite
    // frequency/presence, last_n < -1, a bias that is NaN or +inf, or a biased token
    // outside [0, n_vocab) (n_vocab <= 0: ids are checked only for being >= 0).
    void validate(int32_t n_vocab = 0) const;
    // Where the window starts in a history whose first n_prompt tokens are the prompt,
    // when the row follows history_size tokens (the drafts before it included).
    size_t window_start(size_t n_prompt, size_t history_size) const;
};

// Writes logits + biases, penalised by the counts of `window` (n tokens), into out
// (resized to n_vocab). `counts` is scratch (one int per token id, left zeroed).
void apply_penalties(const float* logits, int32_t n_vocab, const Penalties& pen, const int32_t* window, size_t n,
                     std::vector<float>& out, std::vector<int32_t>& counts);

}  // namespace pyspec
