// Draft-length policies: how many tokens to draft each round (0 = a plain
// decoding step), and whether to stop a draft early after a token. The engine
// reports every round back so adaptive policies can learn, and times the
// verification batch sizes a policy asks for before its first round.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "drafters/drafter.h"

namespace pyspec {

// What one round did, as the engine reports it to the policy and the statistics.
struct RoundReport {
    DraftPlan plan;
    int32_t drafted = 0;
    int32_t accepted = 0;
    double draft_s = 0;    // drafter time of this round (its catch-up on `plan.lag` tokens included)
    double verify_s = 0;   // target time of this round's batch
    // Rows of that batch: drafted + 1, or more where other sequences (and prompt
    // chunks) shared the decode; 0 means drafted + 1.
    int32_t batch_rows = 0;
    // A plain round of a plan with a next_guess: whether the target's token was that
    // guess (1) or not (0), which is what accepting a one-token draft would have
    // shown (P = p(guess) either way); -1 otherwise.
    int32_t guess_hit = -1;
    // The round's whole wall time: drafting, the target decode, distributions,
    // verification and emitting (shared with the other sequences of its decode);
    // 0 when unknown.
    double round_s = 0;
};

// What a sequence's draft would be worth this round (LengthPolicy::bid).
struct LengthBid {
    double alpha = 0;      // acceptance of each drafted token, given the earlier ones were accepted
    double cost = 0;       // drafter seconds per drafted token
    int32_t longest = 0;   // the longest draft it may make this round
};

// A length policy is also the draft's stop rule (drafter.h says what a stop
// rule may and may not do).
class LengthPolicy : public DraftStopRule {
public:
    virtual ~LengthPolicy() = default;
    virtual std::string name() const = 0;
    // The longest draft this policy asks for (its fixed length, or its cap).
    virtual int32_t draft_max() const = 0;
    // A new generation starts (adaptive policies may weigh its evidence apart).
    virtual void begin_generation() {}
    // Draft length for the next round, in [0, round_max] (what fits this round: context,
    // max_tokens, the engine's draft_max), given where the draft comes from.
    virtual int32_t next_length(int32_t round_max, const DraftPlan& plan) = 0;
    // Whether stop_before/stop_after can end a draft (drafters then compute a belief).
    virtual bool stops_early() const { return false; }
    virtual void observe(const RoundReport& /*round*/) {}
    // Before next_length in a batch: the decode this sequence's rows join will
    // also hold `other_rows` rows of `other_seqs` other sequences (0, 0: alone).
    virtual void set_batch(int32_t /*other_rows*/, int32_t /*other_seqs*/) {}
    // Before next_length: at most this many tokens are left to generate
    // (max_tokens less those emitted), so that exploration a short answer
    // cannot pay back is not started.
    virtual void set_remaining(int32_t /*tokens*/) {}
    // Joint planning of a decode shared by several sequences (BatchSession).
    // Alone, a sequence beside seven others can only reach the next cheap batch
    // size (8 -> 16 rows on a CPU) by drafting eight tokens itself; eight
    // sequences drafting one each fill the same rows and can pay where that
    // cannot. So the session asks each policy for a bid (what each drafted
    // token of its plan is worth), lets one policy allot the free rows to the
    // best bids (allot_lengths), and tells each its length (allotted) instead
    // of asking next_length.
    //   plans_jointly(model)  whether this policy's lengths may be allotted this
    //       round (`model`: the sequence's drafter may draft from a draft model);
    //   bid(round_max, plan)  acceptance per drafted token, cost per drafted
    //       token, and the longest draft this round (0: it would not draft);
    //   allot_lengths(bids, max_rows)  one length per bid, each sequence also
    //       holding its one committed row; empty when this policy cannot allot.
    virtual bool plans_jointly(bool /*model*/) const { return false; }
    virtual LengthBid bid(int32_t /*round_max*/, const DraftPlan& /*plan*/) const { return {}; }
    virtual std::vector<int32_t> allot_lengths(const std::vector<LengthBid>& /*bids*/, int32_t /*max_rows*/) const {
        return {};
    }
    virtual void allotted(const DraftPlan& /*plan*/, int32_t /*k*/) {}
    // Whether this policy may draft from `source` soon; when it says no for the
    // model, the drafter defers processing the prompt until it is asked to draft.
    virtual bool may_draft(DraftSource /*source*/) const { return true; }
    // Target batch sizes (<= max_batch: a batch of several sequences asks for more
    // than one sequence's draft_max + 1) the policy wants timed before it drafts;
    // the engine times each and reports the seconds through calibrated().
    virtual std::vector<int32_t> calibration_sizes(int32_t /*max_batch*/) { return {}; }
    virtual void calibrated(const std::vector<int32_t>& /*sizes*/, const std::vector<double>& /*seconds*/) {}
};

// A policy's settings. The policies themselves are described once, in the README.
struct PolicyParams {
    std::string name = "auto";   // one of policy_catalog()
    int32_t draft_max = -1;      // fixed length, or cap of the adaptive policies; -1: the policy's default
    double p_min = 0.75;         // confidence: stop before a token the draft believes in < p_min
    double gamma = 0.15;         // svip: stop when sqrt(gamma * H) > h (token kept)
    double h = 0.3;
};

struct PolicyInfo {
    const char* name;
    int32_t default_draft_max;   // SVIP's paper caps drafts at 40
    const char* summary;         // one line, for --help
};
// Every policy, the default ("auto") last.
const std::vector<PolicyInfo>& policy_catalog();

// Throws std::invalid_argument for an unknown name or out-of-range parameters.
std::unique_ptr<LengthPolicy> make_policy(const PolicyParams& params);

// Expected tokens from a round drafting k tokens with per-position acceptance
// alpha[0..k-1] (each conditional on the previous ones accepted):
//   E(k) = 1 + sum_{i<k} prod_{j<=i} alpha[j].
double expected_tokens(const std::vector<double>& alpha, int32_t k);
// ... with the same alpha at every position: 1 + alpha + ... + alpha^k.
double expected_tokens(double alpha, int32_t k);

}  // namespace pyspec
