// Drafters propose tokens for the target to verify. The engine owns the
// committed sequence; a drafter only reads it and keeps its own state in sync.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "rng.h"
#include "sampling.h"

namespace pyspec {

// Asked after each drafted token by length policies that stop early (svip keeps
// the token, confidence drops it). `belief` is the drafter's distribution at that
// position: the one the token was sampled from, or, when the drafter decodes
// greedily (q is then one-hot and says nothing about confidence), its T = 1
// distribution under the same filters. Deterministic drafters pass their one-hot q.
enum class DraftStop { kContinue, kKeep, kDrop };
using DraftStopRule = std::function<DraftStop(int32_t i, const Distribution& belief, int32_t token)>;

// What the next draft would be made of. The hybrid drafter switches source per
// round; match_len is the n-gram match behind an n-gram draft (0: no match); lag
// is how many committed tokens a model drafter must process before it can draft.
enum class DraftSource { kModel = 0, kNgram = 1 };
struct DraftPlan {
    DraftSource source = DraftSource::kModel;
    int32_t match_len = 0;
    int32_t lag = 0;
    bool has_fallback = false;  // another source can draft if the policy declines this plan
};

class Drafter {
public:
    virtual ~Drafter() = default;

    // What the next draft() will use for this history, so that the length policy
    // can choose a length for that source.
    virtual DraftPlan plan(const std::vector<int32_t>& /*history*/) { return {}; }
    // Switch the next draft() to the fallback source (when plan().has_fallback).
    virtual DraftPlan fallback(const std::vector<int32_t>& history) { return plan(history); }

    // A new generation starts from `prompt`. `sampling` is the drafter's own
    // sampling setting for this generation (deterministic drafters ignore it:
    // their q is one-hot on the proposal). With `eager` a model drafter processes
    // the prompt now; otherwise its first draft catches up (plan().lag says how far).
    virtual void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool eager) = 0;

    // Propose up to max_n tokens that continue `history` (the committed sequence).
    // Writes the tokens into `tokens` and, for each, the distribution it was
    // sampled from into q[i] (q has room for max_n). Returns the number proposed.
    // `stop` may be empty (no early stop).
    virtual int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                          std::vector<int32_t>& tokens, std::vector<Distribution>& q,
                          const DraftStopRule& stop) = 0;
};

// Length of the common prefix of a and b.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace pyspec
