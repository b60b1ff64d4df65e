// The generation loop, plain and speculative alike. One round:
//   1. the drafter proposes up to k tokens (k = 0: plain decoding),
//   2. the target evaluates [last committed token, drafts...] in ONE llama_decode,
//   3. the sampling core accepts a prefix and draws the next token,
//   4. the target's KV cache drops the rejected tail (the drafter syncs lazily).
// Runs without the GIL; Python sees it through a per-token callback.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "drafter.h"
#include "model.h"
#include "policy.h"
#include "rng.h"
#include "sampling.h"

namespace pyspec {

struct GenerateParams {
    int32_t max_tokens = 256;
    SamplingParams sampling;           // the target's settings: define the output distribution
    SamplingParams draft_sampling;     // the drafter's own settings (q); any choice stays lossless
    uint64_t seed = 0;
    std::vector<std::string> stop;
    int32_t draft_max = 0;             // cap on drafts per round (the policy picks <= this); 0 = plain
    VerifyVariant variant = VerifyVariant::kCorrect;  // others are test-only negative controls
    // TEST-ONLY negative control (0 = off): end a model draft by DISCARDING a drawn
    // token whose belief is below this, the biased rule drafter.h forbids.
    double test_discard_below = 0;
    // Target batch timings known from earlier runs (size, seconds), handed to a
    // policy that wants them instead of timing them again.
    std::vector<std::pair<int32_t, double>> known_batch_costs;
    // Checked between tokens and inside every llama_decode; set from another
    // thread to stop (stop_reason "cancelled", caches left consistent).
    const std::atomic<bool>* cancel = nullptr;
    // Let the drafter process the prompt on its own thread while the target does.
    // Worth it when the models run on different devices (GPU target, CPU draft);
    // on a CPU alone both would fight over the same cores.
    bool parallel_prefill = false;
};

struct GenerationStats {
    int32_t n_prompt_tokens = 0;
    int32_t n_generated = 0;
    double prompt_s = 0;      // prompt processing (target and drafter)
    double ttft_s = 0;        // call start -> first token sampled
    double decode_s = 0;      // first token -> last token
    double decode_tok_s = 0;  // (n_generated - 1) / decode_s
    int32_t rounds = 0;       // target passes (verification batches)
    int32_t drafted = 0;
    int32_t accepted = 0;
    double draft_s = 0;       // drafter time (its decodes and sampling)
    double verify_s = 0;      // target decodes
    double overhead_s = 0;    // host work: distributions, verification, text, callbacks
    double calibrate_s = 0;   // timing the target's batch sizes for the policy (first use only)
    std::vector<int32_t> drafted_at;   // per draft position 1..k: rounds that drafted it
    std::vector<int32_t> accepted_at;  // ... and accepted it
    std::vector<int32_t> length_hist;  // rounds by number of drafted tokens (index 0: plain steps)
    int32_t policy_plain = 0;          // rounds where the policy chose plain decoding (k = 0)
    int32_t ngram_rounds = 0;          // rounds drafted by n-gram lookup (hybrid/ngram drafters)
    int32_t ngram_drafted = 0;         // ... their drafted tokens
    int32_t ngram_accepted = 0;        // ... and accepted ones
    int32_t stops_before = 0;          // drafts the stop rule ended before drawing a token
    int32_t stops_after = 0;           // ... and right after a token it kept, short of the length asked
    // Target batch sizes timed for the policy in this call (size, seconds): new calibration.
    std::vector<std::pair<int32_t, double>> calibrated;
};

struct GenerateResult {
    std::vector<int32_t> tokens;
    std::string text;
    std::string stop_reason;  // "eog", "max_tokens", "stop", "context", "cancelled"
    GenerationStats stats;
};

// Called for every emitted token with the text that became safe to show
// (token -1 carries the final flush). `drafted` tells whether the token was a
// draft the target accepted. Return false to stop (stop_reason "cancelled").
using TokenCallback = std::function<bool(int32_t token, const std::string& text, bool drafted)>;

class Engine {
public:
    // drafter may be null (plain decoding only). Throws std::invalid_argument if
    // the drafter decodes with the target's own context.
    Engine(Model& target, Drafter* drafter);

    // policy may be null: then every round drafts params.draft_max tokens.
    // Holds the locks of the target's and the draft model's contexts for the
    // whole call, so engines sharing a model take turns.
    GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                            const TokenCallback& on_token, LengthPolicy* policy = nullptr);

private:
    // Decode the uncommitted tail of `history` plus `drafts` on the target in
    // one batch, keeping logits for the last token of history and every draft.
    void decode_verification_batch(const std::vector<int32_t>& history, const std::vector<int32_t>& drafts);
    // p[i] = the target's sampling distribution at logits row i.
    void target_distributions(int32_t n_rows, const SamplingParams& sampling);
    // Give the policy the target batch timings it asks for: known ones, or timed
    // now (reported in stats.calibrated). Returns the seconds spent timing.
    double calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler, const GenerateParams& params,
                     GenerationStats& st);

    Model& target_;
    Drafter* drafter_;
    std::vector<int32_t> batch_;       // scratch: the verification batch
    std::vector<int32_t> drafts_;
    std::vector<Distribution> p_, q_;
    SamplingWorkspace ws_;
};

}  // namespace pyspec
