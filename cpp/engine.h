// The generation loop, plain and speculative alike: prefill, then rounds of
//   1. draft:    the drafter proposes up to k tokens (k = 0: a plain step),
//   2. verify:   the target evaluates [last committed token, drafts] in ONE llama_decode,
//   3. accept:   the sampling core accepts a prefix and draws the next token,
//   4. roll back: the target's KV cache drops the rejected tail (the drafter syncs lazily),
// each followed by emitting the new tokens. Runs without the GIL; Python sees it
// through a per-token callback.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "drafter.h"
#include "model.h"
#include "policy.h"
#include "sampling.h"
#include "stats.h"

namespace pyspec {

struct GenerateParams {
    int32_t max_tokens = 256;
    SamplingParams sampling;           // the target's settings: define the output distribution
    SamplingParams draft_sampling;     // the drafter's own settings (q); any choice stays lossless
    uint64_t seed = 0;
    std::vector<std::string> stop;
    int32_t draft_max = 0;             // the longest draft of any round (the policy picks <= this); 0 = plain
    VerifyVariant variant = VerifyVariant::kCorrect;  // others are test-only negative controls
    // TEST-ONLY negative control (0 = off): end a model draft by DISCARDING a drawn
    // token whose belief is below this, the biased rule drafter.h forbids.
    double test_discard_below = 0;
    // Let the drafter process the prompt on its own thread while the target does.
    // Worth it when the models run on different devices (GPU target, CPU draft);
    // on a CPU alone both would fight over the same cores.
    bool parallel_prefill = false;
    // Checked between tokens and inside every llama_decode; set from another
    // thread to stop (stop_reason "cancelled", caches left consistent).
    const std::atomic<bool>* cancel = nullptr;
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
    struct Sequence;
    class StopRule;

    void check(const std::vector<int32_t>& prompt, const GenerateParams& params) const;
    // Process the prompt (all but its last token) on the target and the drafter,
    // and time the batch sizes the policy asks for.
    void prefill(const std::vector<int32_t>& prompt, const GenerateParams& params, LengthPolicy* policy,
                 int32_t draft_max, GenerationStats& st);
    // Step 1 of a round: the drafter picks a source, the policy a length, and the
    // drafter proposes up to that many tokens into drafts_ (and their q into q_).
    DraftPlan draft(Sequence& s, LengthPolicy* policy, StopRule* stop, int32_t round_max);
    // One round of speculative sampling: draft, verify, accept, roll back.
    VerifyResult round(Sequence& s, const GenerateParams& params, LengthPolicy* policy, StopRule* stop,
                       int32_t round_max);
    // Commit and stream the round's tokens, stopping at EOG, a stop string,
    // max_tokens or the callback's word.
    void emit(Sequence& s, const VerifyResult& vr, const TokenCallback& on_token);

    // Decode the uncommitted tail of `history` plus `drafts` on the target in
    // one batch, keeping logits for the last token of history and every draft.
    void decode_verification_batch(const std::vector<int32_t>& history, const std::vector<int32_t>& drafts);
    // p[i] = the target's sampling distribution at logits row i.
    void target_distributions(int32_t n_rows, const SamplingParams& sampling);
    // Time the target batch sizes the policy asks for (none once it knows them:
    // Python hands it timings kept from earlier runs). Returns the seconds spent.
    double calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler);

    Model& target_;
    Drafter* drafter_;
    std::vector<int32_t> batch_;       // scratch: the verification batch
    std::vector<int32_t> drafts_;
    std::vector<Distribution> p_, q_;
    SamplingWorkspace ws_;
};

}  // namespace pyspec
