// Draft-length policies: how many tokens to draft each round (0 = a plain
// decoding step), and whether to stop a draft early after a token. The engine
// reports every round back so adaptive policies can learn. The simple policies
// implement LengthPolicy alone; auto also plans with the batch (JointPlanner)
// and has the target's batch sizes timed before its first round (Calibrated).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
    double target_s = 0;   // seconds of the target decode that held this round's rows
    // Rows of that batch: drafted + 1, or more where other sequences (and prompt
    // chunks) shared the decode; 0 means drafted + 1.
    int32_t batch_rows = 0;
    // A plain round of a plan with a next_guess: whether the target's token was that
    // guess (1) or not (0), which is what accepting a one-token draft would have
    // shown (P = p(guess) either way); -1 otherwise.
    int32_t guess_hit = -1;
    // The round's whole wall time: drafting, the target decode, distributions,
    // the accept test and emitting (shared with the other sequences of its decode);
    // 0 when unknown.
    double round_s = 0;
};

// The longest draft any policy makes, and the largest draft_max any caller may
// ask for: the auto policy's tables, the statistics' per-position tables and a
// server's request limit are all sized by it. Python reads it as _core.MAX_DRAFT.
constexpr int32_t kMaxDraft = 63;

class JointPlanner;
class Calibrated;

// A length policy: how many tokens to draft each round, and (as a DraftStopRule,
// drafter.h) whether to end a draft early. This is all the simple policies
// implement. A policy that plans with the batch in view or wants the target
// timed implements JointPlanner or Calibrated too, and says so through
// as_planner() and as_calibrated(); the engine asks for them, never assumes them.
//
// The draft length, from the user to the round (engine/plan.cpp, BatchSession::plan_alone):
//   draft_max   the user's cap (PolicyParams::draft_max, or the policy's default),
//               which the policy keeps and never exceeds;
//   round_max   this round's bound: context room, tokens left, batch rows;
//   k           the length chosen, next_length(round_max, plan) in [0, round_max].
class LengthPolicy : public DraftStopRule {
public:
    virtual ~LengthPolicy() = default;
    virtual std::string name() const = 0;
    // The longest draft this policy makes (its fixed length, or its cap), <= kMaxDraft.
    virtual int32_t draft_max() const = 0;
    // A new generation starts (adaptive policies may weigh its evidence apart).
    virtual void begin_generation() {}
    // Draft length for the next round, in [0, min(round_max, draft_max())], given
    // where the draft comes from; 0 is a plain step.
    virtual int32_t next_length(int32_t round_max, const DraftPlan& plan) = 0;
    // Whether stop_before/stop_after can end a draft (drafters then compute a belief).
    virtual bool stops_early() const { return false; }
    // What the round did (after it was emitted).
    virtual void observe(const RoundReport& /*round*/) {}

    // The optional interfaces (null: this policy has none).
    virtual JointPlanner* as_planner() { return nullptr; }
    virtual Calibrated* as_calibrated() { return nullptr; }
};

// What a sequence's draft would be worth this round (JointPlanner::bid).
struct LengthBid {
    double alpha = 0;      // acceptance of each drafted token, given the earlier ones were accepted
    double cost = 0;       // drafter seconds per drafted token
    int32_t longest = 0;   // the longest draft it may make this round
};

// A policy that plans with the batch in view (auto): it hears who shares the
// round's target decode and how much is left to generate, judges whether a
// draft model may pay at all, and can have its lengths allotted jointly.
//
// Joint planning of a decode shared by several sequences (engine/plan.cpp, BatchSession::plan_jointly):
// alone, a sequence beside seven others can only reach the next cheap batch
// size (8 -> 16 rows on a CPU) by drafting eight tokens itself; eight sequences
// drafting one each fill the same rows and can pay where that cannot. So the
// session asks each planner for a bid (what each drafted token of its plan is
// worth), lets one planner allot the free rows to the best bids, and tells each
// its length (allotted) instead of asking next_length.
class JointPlanner {
public:
    virtual ~JointPlanner() = default;
    // Before next_length or bid: the decode this sequence's rows join also holds
    // `other_rows` rows of `other_seqs` other sequences (0, 0: alone).
    virtual void set_batch(int32_t other_rows, int32_t other_seqs) = 0;
    // Before next_length: at most this many tokens are left to generate
    // (max_tokens less those emitted), so that exploration a short answer
    // cannot pay back is not started.
    virtual void set_remaining(int32_t tokens) = 0;
    // Whether this policy's lengths may be allotted this round (`model`: the
    // sequence's drafter may draft from a draft model).
    virtual bool plans_jointly(bool model) const = 0;
    // Acceptance per drafted token, cost per drafted token, and the longest
    // draft this round (0: it would not draft).
    virtual LengthBid bid(int32_t round_max, const DraftPlan& plan) const = 0;
    // One length per bid, each sequence also holding its one committed row;
    // empty when this policy cannot allot.
    virtual std::vector<int32_t> allot_lengths(const std::vector<LengthBid>& bids, int32_t max_rows) const = 0;
    // The length allotted to this sequence's plan (in place of next_length).
    virtual void allotted(const DraftPlan& plan, int32_t k) = 0;
};

// A policy that wants target batch sizes timed (auto's cost model). The engine
// times them between rounds, never before the first token (engine/calibrate.cpp),
// and reports the seconds back; the sizes a batch asks for may exceed one
// sequence's draft_max + 1.
class Calibrated {
public:
    virtual ~Calibrated() = default;
    // Sizes (<= max_batch) still to be timed; empty once calibrated.
    virtual std::vector<int32_t> calibration_sizes(int32_t max_batch) = 0;
    // `fresh`: measured in this process (to keep on disk), not read from disk.
    virtual void calibrated(const std::vector<int32_t>& sizes, const std::vector<double>& seconds, bool fresh) = 0;
};

// A policy's settings. The policies themselves are described once, in
// docs/drafters.md (auto in docs/auto-policy.md).
struct PolicyParams {
    std::string name = "auto";   // one of policy_catalog()
    // The user's cap: the fixed length, or the adaptive policies' longest draft,
    // in [0, kMaxDraft]. Unset (Python: None) is the policy's own default, the
    // one sentinel for it; make_policy resolves it, once.
    std::optional<int32_t> draft_max;
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
