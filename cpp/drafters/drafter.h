// Drafters propose tokens for the target to verify. The engine owns the
// committed sequence; a drafter only reads it and keeps its own state in sync.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/sampling.h"
#include "core/tokens.h"

namespace pyspec {

class Model;
class ModelDrafter;
class SuffixStore;

// How a draft may end early: the one place this rule is written down (SPEC,
// "Draft length may adapt"). Drafters ask, length policies answer.
//
//   stop_before(i, belief, known)  before token i is drawn. May use anything known
//       then: the distribution it would be drawn from, its maximum or entropy,
//       the position, earlier results. Ending here never draws token i.
//   stop_after(i, belief, token)   after token i was drawn. May use anything at
//       all, token included, but only to end the draft WITH that token kept.
//
// There is no third option: a drawn token is never discarded because of its
// value. The proposal would then follow q conditioned on "not discarded" while
// acceptance still divides by q, and the output would leave the target's law
// (p = (.5, .5), q = (.9, .1), drop when q(x) < .75: token 0 comes out 55 %).
//
// `belief` is the distribution the token is drawn from (q). A greedy drafter's q
// is one-hot and says nothing about confidence, so it passes its T = 1
// distribution under the same filters instead, and `known` = the token it will
// draw (the argmax, a function of q): llama.cpp's "drop a token whose
// probability is below p_min" is then exactly "stop before it", and lossless.
// When the token will be sampled, `known` is -1. Deterministic drafters (n-gram
// lookup) do not ask: their one-hot q carries no belief.
class DraftStopRule {
public:
    virtual ~DraftStopRule() = default;
    virtual bool stop_before(int32_t /*i*/, const Distribution& /*belief*/, int32_t /*known*/) { return false; }
    virtual bool stop_after(int32_t /*i*/, const Distribution& /*belief*/, int32_t /*token*/) { return false; }
    // TEST-ONLY negative control (never true in the product): a stop_after that
    // discards the drawn token, the biased rule described above.
    virtual bool discards_test_only() const { return false; }
};

// What the next draft is made of. The hybrid drafter switches source per round;
// match_len is the evidence behind an n-gram draft: the tokens matched, plus
// those the copy has followed since (0: nothing to propose); lag is how
// many committed tokens a model drafter must process before it can draft; length
// is the number of tokens to draft, chosen by the length policy (0: a plain step;
// -1: no draft was planned, or the source has nothing to propose).
enum class DraftSource { kModel = 0, kNgram = 1 };
struct DraftPlan {
    DraftSource source = DraftSource::kModel;
    int32_t match_len = 0;
    int32_t lag = 0;
    int32_t length = -1;
    bool near_copy = false;  // an n-gram draft re-anchored near where a copy diverged
    // An n-gram source found this round: the copy has not yet shown that it
    // continues (no token of it followed since it was found).
    bool fresh = false;
    // The token a draft from this plan would start with, where that is known
    // without drafting (deterministic drafters); -1 otherwise. A plain round then
    // still learns, for free, whether the draft would have been accepted.
    int32_t next_guess = -1;
    bool from_memory = false;  // the draft copies earlier text from memory (suffix_store.h)
    // The draft is text the grammar forces (constraint/grammar.h): no drafter
    // ran and no policy chose it; it costs nothing to make.
    bool forced = false;
};

// Asked by a drafter for the length of a draft from a given plan.
using LengthFor = std::function<int32_t(const DraftPlan&)>;

class Drafter {
public:
    virtual ~Drafter() = default;

    // What a draft from this drafter's (current) source would be for this history.
    virtual DraftPlan plan(const std::vector<int32_t>& history) = 0;
    // Plan the next draft and have `length_for` (the length policy) size it. A
    // drafter with several sources picks one here, and may offer another when
    // the policy declines the first; the next draft() uses the plan returned.
    virtual DraftPlan choose(const std::vector<int32_t>& history, const LengthFor& length_for) {
        DraftPlan p = plan(history);
        p.length = length_for(p);
        return p;
    }

    // A new generation starts from `prompt`. `sampling` is the drafter's own
    // sampling setting for this generation (deterministic drafters ignore it:
    // their q is one-hot on the proposal). A model drafter keeps what its cache
    // holds of the prompt and processes the rest only when it first drafts
    // (plan().lag says how far): the first token never waits for it.
    virtual void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) = 0;

    // Propose up to max_n tokens that continue `history` (the committed sequence).
    // Writes the tokens into `tokens` and, for each, the distribution it was
    // sampled from into q[i] (q has room for max_n). Returns the number proposed.
    // `stop` may be null (no early stop).
    virtual int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                          std::vector<int32_t>& tokens, std::vector<Distribution>& q,
                          DraftStopRule* stop) = 0;
    // The model this drafter decodes with (its context must be locked while it
    // drafts), or null for drafters that use none; and the sequence of that
    // model's context it uses (a batch gives each of its sequences its own).
    virtual Model* model() const { return nullptr; }
    virtual int32_t model_seq() const { return -1; }
    // When the plan chosen last (choose()) drafts from a model: the model
    // drafter that would draft it. The engine then drafts for every such
    // sequence of a batch together, one draft-model decode per position
    // (draft_together in model_drafter.h); null for other sources.
    virtual ModelDrafter* model_drafter() { return nullptr; }
    // The memory this drafter looks up from now on (null: none); false for
    // drafters that do not use memory. Set between generations.
    virtual bool use_memory(std::shared_ptr<const SuffixStore> /*store*/) { return false; }
};

// Lookup drafters (n-gram, consensus, suffix) copy earlier text: without a
// match there is nothing to propose, and the length policy is not asked. Each
// proposal's q is one-hot. The engine plans a round, then drafts it: draft()
// drafts what the last plan() chose when that plan was made for the same
// history, and plans again otherwise (a caller that drafts without planning).
class LookupDrafter : public Drafter {
public:
    explicit LookupDrafter(int32_t n_vocab) : n_vocab_(n_vocab) {}

    DraftPlan choose(const std::vector<int32_t>& history, const LengthFor& length_for) override {
        DraftPlan p = plan(history);
        p.length = p.match_len > 0 ? length_for(p) : -1;
        return p;
    }
    DraftPlan plan(const std::vector<int32_t>& history) final {
        DraftPlan p = lookup(history);
        planned_size_ = history.size();
        return p;
    }
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) final {
        if (planned_size_ != history.size()) plan(history);
        planned_size_ = 0;
        return draft_planned(history, max_n, rng, tokens, q, stop);
    }

protected:
    // plan() and draft() of each lookup drafter: find the source for this
    // history, and draft from the source found (as Drafter::plan and ::draft).
    virtual DraftPlan lookup(const std::vector<int32_t>& history) = 0;
    virtual int32_t draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                                  std::vector<int32_t>& tokens, std::vector<Distribution>& q,
                                  DraftStopRule* stop) = 0;
    // A new generation (or a new memory): the plan made before does not carry over.
    void forget_plan() { planned_size_ = 0; }
    // Append `token` to the draft, with its one-hot q.
    void propose(int32_t token, std::vector<int32_t>& tokens, std::vector<Distribution>& q) const {
        q[tokens.size()].set_one_hot(token, n_vocab_);
        tokens.push_back(token);
    }

    const int32_t n_vocab_;

private:
    size_t planned_size_ = 0;  // history size of the last plan() that no draft() has used yet; 0: none
};

}  // namespace pyspec
