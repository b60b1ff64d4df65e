// Suffix drafting: lookup in this text and in memory. Two sources, and the
// draft comes from the one with more evidence behind it:
//
//   local   this prompt and output (NgramDrafter: copy cursor, re-anchoring), or
//           in a batch also the other samples' texts (ConsensusDrafter);
//   memory  earlier texts of the process (SuffixStore: the server's requests, a
//           Model's earlier calls, a --memory file). The longest suffix of the
//           committed sequence that occurs there is kept up to date as tokens
//           are committed (SuffixAutomaton::advance: O(1) amortised per token);
//           where several tokens follow it, the most frequent wins, ties to the
//           most recent. Its evidence is the match length (at most 16), plus
//           the number of other occurrences that agree (at most doubling
//           it); auto maps evidence to acceptance as it does for n-gram
//           matches, and tokens followed since add to it.
//
// A memory draft copies from a position in a stored document and keeps a cursor
// on it, like the n-gram drafter's: while the output follows, the cursor
// advances and proposes what comes next in that document (even where the
// automaton's latest occurrence is elsewhere); after a divergence it re-anchors
// near where the copy was (copy_cursor.h), since edited text resumes its source
// nearby (copy_cursor.h). Deterministic: q is one-hot, and which text is copied depends only on
// committed tokens and on what memory held before the round.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_set>

#include "drafters/copy_cursor.h"
#include "drafters/drafter.h"
#include "drafters/suffix_store.h"

namespace pyspec {

class SuffixDrafter : public LookupDrafter {
public:
    // Memory matches shorter than this propose nothing (in a large store short
    // matches are everywhere and predict little).
    static constexpr int32_t kMinMatch = 2;
    // Evidence a matched prefix brings at most (as the n-gram drafter's n_max).
    static constexpr int32_t kPrefixEvidence = 16;

    SuffixDrafter(std::unique_ptr<Drafter> local, int32_t n_vocab);

    // Thread-safe: the store is taken at the next begin() or plan(), on the thread
    // that drafts (a decoder shared by threads sets it before its engine runs).
    bool use_memory(std::shared_ptr<const SuffixStore> store) override;
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) override;

    // Rounds since begin() whose draft came from memory.
    int32_t memory_drafts() const { return memory_drafts_; }

private:
    DraftPlan lookup(const std::vector<int32_t>& history) override;
    int32_t draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                          std::vector<Distribution>& q, DraftStopRule* stop) override;
    // Feed the committed tokens the memory cursor and matcher have not seen.
    void follow(const std::vector<int32_t>& history, const SuffixAutomaton& sam);
    // The memory position whose continuation would be proposed, or -1; sets
    // *evidence and *reanchored.
    int32_t memory_source(const std::vector<int32_t>& history, const SuffixAutomaton& sam, int32_t* evidence,
                          bool* reanchored, bool* fresh);
    void forget_memory();

    // The store use_memory() asked for, until the drafting thread takes it.
    void take_pending_store();

    std::unique_ptr<Drafter> local_;
    std::mutex pending_mutex_;
    bool has_pending_ = false;
    std::shared_ptr<const SuffixStore> pending_;
    std::shared_ptr<const SuffixStore> store_;
    uint64_t epoch_ = 0;                 // the store's epoch that positions below refer to
    SuffixAutomaton::Match match_;
    size_t followed_ = 0;                // history size the matcher and cursor have seen
    CopyCursor copy_;                    // copy_.at: the memory position the copy predicts next
    std::unordered_set<int32_t> failed_; // memory positions whose proposal was rejected outright
    int32_t proposed_from_ = -1;         // the last memory draft's start, and the history size then
    int32_t proposed_token_ = -1;
    size_t proposed_at_size_ = 0;
    // The plan chosen last: from memory (its position) or from the local source.
    bool planned_memory_ = false;
    int32_t planned_from_ = -1;
    int32_t memory_drafts_ = 0;
};

}  // namespace pyspec
