// Draft-length policies: how many tokens to draft each round (0 = a plain
// decoding step), and whether to stop a draft early after a token. The engine
// reports every round back so adaptive policies can learn, and times the
// verification batch sizes a policy asks for before its first round.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "drafter.h"

namespace pyspec {

struct RoundReport {
    DraftPlan plan;
    int32_t drafted = 0;
    int32_t accepted = 0;
    double draft_s = 0;    // drafter time of this round (its catch-up on `plan.lag` tokens included)
    double verify_s = 0;   // target time of this round's batch (drafted + 1 tokens)
};

// A length policy is also the draft's stop rule (drafter.h says what a stop
// rule may and may not do).
class LengthPolicy : public DraftStopRule {
public:
    virtual ~LengthPolicy() = default;
    virtual std::string name() const = 0;
    // A new generation starts (adaptive policies may weigh its evidence apart).
    virtual void begin_generation() {}
    // Draft length for the next round, in [0, k_cap], given where the draft comes from.
    virtual int32_t next_length(int32_t k_cap, const DraftPlan& plan) = 0;
    // Whether stop_before/stop_after can end a draft (drafters then compute a belief).
    virtual bool stops_early() const { return false; }
    virtual void observe(const RoundReport& /*round*/) {}
    // Whether this policy may draft from `source` soon; when it says no for the
    // model, the drafter defers processing the prompt until it is asked to draft.
    virtual bool may_draft(DraftSource /*source*/) const { return true; }
    // Target batch sizes (<= max_batch) the policy wants timed before it drafts;
    // the engine times each and reports the seconds through calibrated().
    virtual std::vector<int32_t> calibration_sizes(int32_t /*max_batch*/) { return {}; }
    virtual void calibrated(const std::vector<int32_t>& /*sizes*/, const std::vector<double>& /*seconds*/) {}
};

struct PolicyParams {
    std::string name = "auto";   // fixed | heuristic | confidence | svip | auto
    int32_t k = 4;               // fixed length; cap of heuristic (which starts at min(4, k)), confidence, auto
    double p_min = 0.75;         // confidence: stop before a token the draft believes in < p_min
    double gamma = 0.15;         // svip: stop when sqrt(gamma * H) > h (token kept)
    double h = 0.3;
    int32_t cap = 40;            // svip's longest draft
};

// Throws std::invalid_argument for an unknown name or out-of-range parameters.
std::unique_ptr<LengthPolicy> make_policy(const PolicyParams& params);

// Expected tokens from a round drafting k tokens with per-position acceptance
// alpha[0..k-1] (each conditional on the previous ones accepted):
//   E(k) = 1 + sum_{i<k} prod_{j<=i} alpha[j].
double expected_tokens(const std::vector<double>& alpha, int32_t k);

}  // namespace pyspec
