// Prompt-lookup drafting: find the longest recent n-gram (n_max down to n_min
// tokens) that ends the committed sequence and occurred before, in the prompt or
// the generated text, and propose what followed it. Deterministic, so its q is
// one-hot on each proposal (the engine then accepts with probability p(x)).
// Lookups are O(1): one hash index per n, updated as tokens are committed.
#pragma once

#include <unordered_map>

#include "drafter.h"

namespace pyspec {

class NgramDrafter : public Drafter {
public:
    NgramDrafter(int32_t n_vocab, int32_t n_min = 1, int32_t n_max = 16);

    DraftPlan plan(const std::vector<int32_t>& history) override;
    // Without a match there is nothing to propose: the policy is not asked.
    DraftPlan choose(const std::vector<int32_t>& history, const LengthFor& length_for) override;
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool prefill) override;
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) override;

    // Position in `history` whose continuation the longest match proposes, or -1.
    int32_t find(const std::vector<int32_t>& history, int32_t* match_len);

private:
    void index_up_to(const std::vector<int32_t>& history);
    static uint64_t key(const int32_t* tokens, int32_t n);

    int32_t n_vocab_, n_min_, n_max_;
    // index_[n - n_min][hash of n tokens ending at i] = i + 1 (latest occurrence wins).
    std::vector<std::unordered_map<uint64_t, int32_t>> index_;
    size_t indexed_ = 0;   // n-grams ending before this position are indexed
    int32_t planned_at_ = -1;          // the lookup plan() made, reused by draft()
    size_t planned_size_ = 0;
};

}  // namespace pyspec
