// Drafters propose tokens for the target to verify. The engine owns the
// committed sequence; a drafter only reads it and keeps its own state in sync.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "rng.h"
#include "sampling.h"

namespace pyspec {

// Asked after each drafted token (0-based index i, its distribution q, the token)
// by length policies that stop early (svip keeps the token, confidence drops it).
enum class DraftStop { kContinue, kKeep, kDrop };
using DraftStopRule = std::function<DraftStop(int32_t i, const Distribution& q, int32_t token)>;

// Where a round's draft comes from (the hybrid drafter switches per round),
// and for n-gram drafts how long the matched n-gram is (0: no match).
enum class DraftSource { kModel = 0, kNgram = 1 };
struct DraftPlan {
    DraftSource source = DraftSource::kModel;
    int32_t match_len = 0;
};

class Drafter {
public:
    virtual ~Drafter() = default;

    // What the next draft() will use for this history (hybrid decides here, so
    // the length policy can choose a length for that source).
    virtual DraftPlan plan(const std::vector<int32_t>& /*history*/) { return {}; }

    // A new generation starts from `prompt` (the drafter may process it now).
    // `sampling` is the drafter's own sampling setting for this generation
    // (deterministic drafters ignore it: their q is one-hot on the proposal).
    virtual void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) = 0;

    // Propose up to max_n tokens that continue `history` (the committed sequence).
    // Writes the tokens into `tokens` and, for each, the distribution it was
    // sampled from into q[i] (q has room for max_n). Returns the number proposed.
    virtual int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                          std::vector<int32_t>& tokens, std::vector<Distribution>& q,
                          const DraftStopRule& stop) = 0;
};

// Length of the common prefix of a and b.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace pyspec
