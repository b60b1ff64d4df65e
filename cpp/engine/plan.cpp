// Planning a round (step 1's first half): for each sequence, the bound of its
// draft this round (round_max), its drafter's source and its policy's length k.
// A sequence plans alone (its policy's next_length), or, when every drafting
// sequence's policy is a joint planner that agrees, the batch plans at once
// (policy.h, JointPlanner): one planner allots the decode's free rows to the
// best bids. The drafting itself is round.cpp's.
#include <algorithm>
#include <vector>

#include "engine/sequence.h"

namespace pyspec {

int32_t BatchSession::round_max(const Sequence& s, int32_t batch_room) const {
    // What this round allows: the context's room, the tokens left (the round
    // emits one more than it drafts) and the sequence's share of the batch.
    // The user's draft_max is not here: the policy holds it (policy.h).
    const int32_t room = target_.n_ctx() - static_cast<int32_t>(s.history.size());
    return std::max(0, std::min({batch_room, room - 1, s.max_tokens - s.generated() - 1}));
}

void BatchSession::begin_round(Sequence& s) {
    s.drafts.clear();
    s.plan = DraftPlan{};
    s.k = 0;
}

void BatchSession::plan_alone(Sequence& s, int32_t round_max, int32_t other_rows, int32_t other_seqs) {
    if (JointPlanner* planner = s.policy ? s.policy->as_planner() : nullptr) {
        // A batch-aware policy weighs the decode this sequence's rows join.
        planner->set_batch(other_rows, other_seqs);
        planner->set_remaining(s.max_tokens - s.generated());
    }
    if (round_max <= 0 || !s.drafter) return;  // plain this round
    // The drafter picks a source (a hybrid may offer another when the policy
    // declines the first) and the policy sizes it.
    LengthPolicy& policy = *s.policy;
    s.plan = s.drafter->choose(s.history, [&policy, round_max](const DraftPlan& p) {
        return policy.next_length(round_max, p);
    });
    s.k = std::max(0, std::min(s.plan.length, round_max));
}

bool BatchSession::plan_jointly(const std::vector<Sequence*>& active, int32_t batch_room) {
    // Several sequences share the decode and every one that may draft has a
    // policy that takes an allotted length: one of them allots the free rows
    // to the best bids. Otherwise each plans alone.
    if (active.size() < 2) return false;
    const int32_t others = static_cast<int32_t>(active.size()) - 1;
    JointPlanner* judge = nullptr;
    for (Sequence* s : active) {
        if (!s->drafter || round_max(*s, batch_room) <= 0) continue;
        JointPlanner* planner = s->policy->as_planner();
        if (!planner) return false;
        planner->set_batch(others, others);
        if (!planner->plans_jointly(s->drafter->model() != nullptr)) return false;
        if (!judge) judge = planner;
    }
    if (!judge) return false;
    std::vector<LengthBid> bids(active.size());
    std::vector<int32_t> bounds(active.size(), 0);
    for (size_t i = 0; i < active.size(); ++i) {
        Sequence& s = *active[i];
        const int32_t rm = bounds[i] = round_max(s, batch_room);
        begin_round(s);
        if (rm <= 0 || !s.drafter) continue;
        // The length choose() hears is the bid's longest, so that a drafter
        // with several sources keeps the one that bids.
        JointPlanner* planner = s.policy->as_planner();
        s.plan = s.drafter->choose(s.history, [&bids, i, rm, planner](const DraftPlan& p) {
            bids[i] = planner->bid(rm, p);
            return bids[i].longest;
        });
    }
    std::vector<int32_t> k = judge->allot_lengths(bids, target_.n_batch());
    k.resize(active.size(), 0);  // (it only declines uncalibrated, which plans_jointly excluded)
    int32_t rows = 0;
    for (int32_t ki : k) rows += 1 + ki;
    for (size_t i = 0; i < active.size(); ++i) {
        Sequence& s = *active[i];
        if (!s.policy || s.plan.length < 0) continue;
        s.plan.length = k[i];
        JointPlanner* planner = s.policy->as_planner();
        planner->set_batch(rows - 1 - k[i], others);
        planner->allotted(s.plan, k[i]);
        s.k = std::max(0, std::min(k[i], bounds[i]));
    }
    if (rows > static_cast<int32_t>(active.size())) ++bs_.joint_rounds;
    return true;
}

}  // namespace pyspec
