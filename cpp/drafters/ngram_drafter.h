// Prompt-lookup drafting with a copy cursor. Copy-with-edits text (corrections,
// refactors, "return the whole file with X changed") follows a source span,
// diverges at each edit, then copies on. So the drafter keeps a cursor on the
// source position the output is copying:
//   * while the committed tokens follow it, the cursor advances and proposes what
//     comes next in the source (even where the latest occurrence of the last
//     n-gram is elsewhere: repeated lines do not derail it);
//   * after a divergence it re-anchors on the first tokens that match again near
//     where the copy was (a short match there beats a long one elsewhere);
//   * without a cursor it looks up the longest recent n-gram (n_max down to n_min
//     tokens) that ends the committed sequence and occurred before, in the prompt
//     or the generated text, and follows what came after it.
// A re-anchor never picks a source position whose proposal was rejected outright
// in this generation. (A plain lookup needs no such memory: after a rejection the
// output's own occurrence of the n-gram is the latest.) Deterministic, so q is one-hot on each proposal (the engine then accepts
// with probability p(x)). Lookups are O(1): one hash index per n, updated as
// tokens are committed.
#pragma once

#include <unordered_set>

#include "drafters/copy_cursor.h"
#include "drafters/drafter.h"
#include "drafters/ngram_index.h"

namespace pyspec {

class NgramDrafter : public LookupDrafter {
public:
    NgramDrafter(int32_t n_vocab, int32_t n_min = 1, int32_t n_max = 16);

    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) override;

    // Position in `history` whose continuation the longest match proposes, or -1
    // (the plain lookup, without the cursor).
    int32_t find(const std::vector<int32_t>& history, int32_t* match_len);

private:
    DraftPlan lookup(const std::vector<int32_t>& history) override;
    int32_t draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                          std::vector<Distribution>& q, DraftStopRule* stop) override;
    void index_up_to(const std::vector<int32_t>& history);
    // Bring the cursor up to date with the committed tokens, and learn what became
    // of the last proposal.
    void follow(const std::vector<int32_t>& history);
    // The source position nearest the old cursor that follows the last m tokens
    // (3, 2, then 1) and has not failed here, or -1; sets *m (copy_cursor.h).
    int32_t reanchor(const std::vector<int32_t>& history, int32_t* m) const;

    // An n-gram ending at i -> i + 1 (the latest occurrence wins).
    NgramIndex<int32_t> index_;
    size_t indexed_ = 0;   // n-grams ending before this position are indexed

    CopyCursor copy_;         // copy_.at: the position in history whose token the copy predicts next
    size_t followed_ = 0;     // history size the cursor is up to date with
    std::unordered_set<int32_t> failed_;  // source positions whose proposal was rejected outright
    std::vector<int32_t> proposed_;       // the last draft, and where it started
    size_t proposed_at_size_ = 0;
    int32_t proposed_from_ = -1;

    int32_t planned_from_ = -1;           // where the last plan copies from, or -1
};

}  // namespace pyspec
