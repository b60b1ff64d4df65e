// BatchSession's private parts, shared by the files of cpp/engine/: one
// sequence in flight, and the stop rule its drafter asks.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "model/text_stream.h"

namespace pyspec {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The policy as the drafter sees it: counts the drafts it ends, and in the
// test-only control mode replaces it by the forbidden discard-by-value rule.
class BatchSession::StopRule : public DraftStopRule {
public:
    StopRule(LengthPolicy* policy, double discard_below, GenerationStats& st)
        : policy_(policy), discard_below_(discard_below), st_(st) {}
    // Whether drafters need to consult (and compute beliefs for) this rule at all.
    bool active() const { return discard_below_ > 0 || (policy_ && policy_->stops_early()); }
    void begin_draft(int32_t length) { length_ = length; }
    bool stop_before(int32_t i, const Distribution& belief, int32_t known) override {
        if (discard_below_ > 0) return false;
        const bool stop = policy_ && policy_->stop_before(i, belief, known);
        st_.stops_before += stop;
        return stop;
    }
    bool stop_after(int32_t i, const Distribution& belief, int32_t token) override {
        const bool stop = discard_below_ > 0 ? belief.prob(token) < discard_below_
                                             : policy_ && policy_->stop_after(i, belief, token);
        st_.stops_after += stop && i + 1 < length_;  // only stops that shortened the draft
        return stop;
    }
    bool discards_test_only() const override { return discard_below_ > 0; }

private:
    LengthPolicy* policy_;
    double discard_below_;
    GenerationStats& st_;
    int32_t length_ = 0;
};

// One generation in flight: the committed sequence, what it produced, and the
// round in flight.
struct BatchSession::Sequence {
    Sequence(const SequenceSpec& spec, const TestControls& test, int32_t handle_, int32_t slot_)
        : handle(handle_), id(slot_), drafter(spec.policy ? spec.drafter : nullptr), policy(spec.policy),
          params(spec.params),
          history(spec.prompt),
          chunked(spec.chunked),
          rng(test.shared_stream ? spec.params.seed : sequence_seed(spec.params.seed, spec.stream)),
          pit_rng(~sequence_seed(spec.params.seed, spec.stream)),
          stream(spec.params.stop), max_tokens(spec.params.max_tokens),
          stop_rule(spec.policy, test.discard_below, result.stats),
          grammar(spec.params.grammar
                      ? std::make_unique<GrammarState>(spec.params.grammar, test.grammar != GrammarControl::kOff)
                      : nullptr) {}

    int32_t handle;                // what the caller knows it by
    int32_t id;                    // its slot = sequence id in the target's context
    Drafter* drafter;              // null: plain (a sequence without a policy does not draft)
    LengthPolicy* policy;          // null exactly when drafter is
    SequenceParams params;
    std::vector<int32_t> history;  // prompt + emitted tokens
    bool chunked;                  // SequenceSpec::chunked
    GenerateResult result;
    Rng rng;
    Rng pit_rng;                   // TestControls::pit's own stream: the probe draws nothing from rng
    TextStream stream;
    int32_t max_tokens;
    bool started = false;          // its prompt is in the cache: it generates
    bool done = false;
    bool cancel_requested = false;
    bool callback_stopped = false;
    bool joined = false;           // this round is its prompt's last decode (decode.cpp): plain, not its policy's
    int32_t prompt_decoded = 0;    // prompt tokens the target decoded for it (the rest were cached)
    Clock::time_point t_start = Clock::now(), t_first{};
    StopRule stop_rule;
    std::unique_ptr<GrammarState> grammar;  // its place in params.grammar; null: unconstrained

    // The round in flight.
    DraftPlan plan;                // its drafter's source, and the length its policy chose
    int32_t k = 0;                 // the draft length, within this round's round_max (plan.cpp)
    std::vector<int32_t> drafts;
    std::vector<Distribution> q;
    double draft_s = 0;
    int32_t first_row = 0;         // its first logits row in the target decode
    AcceptResult vr{0, -1};
    RoundReport report;            // what the round did, for its policy and statistics

    GenerationStats& stats() { return result.stats; }
    int32_t generated() const { return static_cast<int32_t>(result.tokens.size()); }
    int32_t n_prompt() const { return result.stats.n_prompt_tokens; }
    StopRule* stop() { return stop_rule.active() ? &stop_rule : nullptr; }
    bool speculative() const { return policy != nullptr; }  // drafts (else plain)
};

}  // namespace pyspec
