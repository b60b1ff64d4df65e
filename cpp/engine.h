// The generation loop, plain and speculative alike, for one sequence or many:
// prefill, then rounds of
//   1. draft:    each sequence's drafter proposes up to k tokens (k = 0: a plain step),
//   2. verify:   the target evaluates every sequence's [last committed token, drafts]
//                in ONE llama_decode (rows tagged with the sequence's id),
//   3. accept:   per sequence, the sampling core accepts a prefix and draws the next token,
//   4. roll back: per sequence, the target's KV cache drops the rejected tail,
// each followed by emitting the new tokens. A single generation is the batch of
// one: there is one loop. Runs without the GIL; Python sees it through a
// per-token callback.
//
// Sequence j of a batch is sequence j of the target's context and draws from its
// own random stream, derived from (seed, j) (j = 0 uses the seed itself, so a
// batch of one is the single-sequence generation): its output does not depend on
// which other sequences share the batch, apart from the kernels' rounding.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
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
    // TEST-ONLY negative control: every sequence of a batch draws from the one
    // stream of `seed` (correlated samples) instead of its own.
    bool test_shared_stream = false;
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
// The same for a batch: `seq` is the sequence's index in the batch. Returning
// false stops that sequence only.
using BatchTokenCallback = std::function<bool(int32_t seq, int32_t token, const std::string& text, bool drafted)>;

// One sequence of a batch. Drafters and adaptive policies keep per-sequence
// state, so each sequence has its own (null: plain decoding / no policy).
struct SequenceSpec {
    std::vector<int32_t> prompt;
    Drafter* drafter = nullptr;
    LengthPolicy* policy = nullptr;
};

// Figures of a whole batch (each sequence's own are in its GenerateResult).
struct BatchStats {
    int32_t n_seq = 0;
    int32_t rounds = 0;          // target decodes of the loop: one per round for all active sequences
    int64_t rows = 0;            // rows in those decodes
    int32_t max_rows = 0;        // the largest of them
    double prompt_s = 0;         // prefill of every sequence
    double decode_s = 0;         // from the first emitted token of any sequence to the end
    int64_t n_generated = 0;     // tokens, all sequences
    double aggregate_tok_s = 0;  // tokens after each sequence's first, per second of decode_s
};

// Seed of sequence j of a batch seeded with `seed` (j = 0: the seed itself).
uint64_t sequence_seed(uint64_t seed, int32_t j);

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

    // Many sequences, one target decode per round. Sequences whose prompts are
    // equal share one prefill (the cache cells are copied, not recomputed). The
    // target needs n_seq >= seqs.size(). Results come back in the order given.
    std::vector<GenerateResult> generate_batch(const std::vector<SequenceSpec>& seqs, const GenerateParams& params,
                                               const BatchTokenCallback& on_token, BatchStats* batch_stats = nullptr);

private:
    struct Sequence;
    class StopRule;

    void check(const std::vector<SequenceSpec>& seqs, const GenerateParams& params) const;
    // Process each prompt (all but its last token) on the target and the drafters,
    // and time the batch sizes the policies ask for.
    void prefill(std::deque<Sequence>& seqs, const GenerateParams& params, int32_t draft_max);
    // Step 1 of a round for one sequence: its drafter picks a source, its policy
    // a length, and the drafter proposes up to that many tokens.
    DraftPlan draft(Sequence& s, int32_t round_max);
    // One round of speculative sampling for every active sequence: draft,
    // verify (one batch), accept, roll back.
    void round(std::vector<Sequence*>& active, const GenerateParams& params, int32_t draft_max, BatchStats& bs);
    // Commit and stream a sequence's round, stopping at EOG, a stop string,
    // max_tokens or the callback's word.
    void emit(Sequence& s, const BatchTokenCallback& on_token);

    // One target batch: for each sequence, the uncommitted tail of its history
    // plus its drafts, keeping logits for the last token of history and every draft.
    int32_t decode_verification_batch(const std::vector<Sequence*>& active);
    // p[i] = the target's sampling distribution at logits row first_row + i.
    void target_distributions(int32_t first_row, int32_t n_rows, const SamplingParams& sampling);
    // Time the target batch sizes the policy asks for (none once it knows them:
    // Python hands it timings kept from earlier runs). Returns the seconds spent.
    double calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler, int32_t seq);

    Model& target_;
    Drafter* drafter_;                 // sequence 0's, for generate()
    std::vector<Model::Row> rows_;     // scratch: the verification batch
    std::vector<int32_t> batch_;       // scratch: calibration batches
    std::vector<Distribution> p_;
    SamplingWorkspace ws_;
};

}  // namespace pyspec
