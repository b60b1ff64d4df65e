// Consensus drafting over parallel samples of one prompt (Li et al.,
// "Speculative Decoding for Multi-Sample Inference", EMNLP Findings 2025):
// sample i drafts what its siblings wrote after the text i has just written.
// No draft model and no datastore: the siblings' own outputs are the source.
//
//   * A ConsensusPool holds every sibling's generated text and an index of its
//     n-grams (n_min..n_max tokens), updated as tokens are committed.
//   * For sample i, the longest suffix of its history that occurs in another
//     sibling's text is looked up; every occurrence votes for the token that
//     followed it. The token with the most votes wins (ties: the most recent
//     occurrence), and the draft copies that occurrence's continuation.
//   * Without a sibling match it falls back to the sample's own n-gram lookup
//     (prompt and own text: NgramDrafter, copy cursor included).
//
// Deterministic, so q is one-hot on each proposal and the engine's rule keeps
// the output lossless; which sibling text is copied depends only on committed
// tokens, never on the target's draws still to come.
#pragma once

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "drafters/drafter.h"
#include "drafters/ngram_drafter.h"
#include "drafters/ngram_index.h"

namespace pyspec {

class ConsensusPool {
public:
    ConsensusPool(int32_t n_seq, int32_t n_min = 2, int32_t n_max = 8);

    int32_t n_seq() const { return static_cast<int32_t>(texts_.size()); }
    // Sample `seq` starts over from `prompt` (its generated text is forgotten).
    void reset(int32_t seq, const std::vector<int32_t>& prompt);
    // Index what sample `seq` committed since the last call (history = prompt + output).
    void update(int32_t seq, const std::vector<int32_t>& history);

    // The most supported continuation of `history`'s longest suffix found in
    // another sample's output: that sample and the position of the continuation
    // in its text, or {-1, -1}. Sets *match_len and *votes.
    std::pair<int32_t, int32_t> best(int32_t seq, const std::vector<int32_t>& history, int32_t* match_len,
                                     int32_t* votes) const;
    const std::vector<int32_t>& text(int32_t seq) const { return texts_[static_cast<size_t>(seq)]; }

private:
    std::vector<std::vector<int32_t>> texts_;  // per sample: prompt + generated (as committed)
    std::vector<size_t> prompt_len_;           // where each sample's generated text begins
    std::vector<size_t> indexed_;              // n-grams ending before this position are indexed
    // An n-gram -> every (sample, position after it), oldest first.
    NgramIndex<std::vector<std::pair<int32_t, int32_t>>> index_;
};

class ConsensusDrafter : public LookupDrafter {
public:
    ConsensusDrafter(std::shared_ptr<ConsensusPool> pool, int32_t seq, int32_t n_vocab, int32_t n_min = 1,
                     int32_t n_max = 16);

    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) override;

    // Rounds whose draft came from a sibling (the rest: the own lookup, or none).
    int32_t sibling_drafts() const { return sibling_drafts_; }

private:
    DraftPlan lookup(const std::vector<int32_t>& history) override;
    int32_t draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                          std::vector<Distribution>& q, DraftStopRule* stop) override;

    std::shared_ptr<ConsensusPool> pool_;
    int32_t seq_;
    NgramDrafter own_;
    // The plan of the last plan() call: a sibling's text and where to copy from.
    int32_t from_seq_ = -1, from_pos_ = -1;
    int32_t sibling_drafts_ = 0;
};

}  // namespace pyspec
