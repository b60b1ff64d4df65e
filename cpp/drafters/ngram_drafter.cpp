#include "drafters/ngram_drafter.h"

#include <algorithm>

namespace pyspec {

NgramDrafter::NgramDrafter(int32_t n_vocab, int32_t n_min, int32_t n_max)
    : LookupDrafter(n_vocab), index_(n_min, n_max) {}

void NgramDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams&) {
    index_.clear();
    indexed_ = 0;
    index_up_to(prompt);
    copy_.reset();
    proposed_from_ = planned_from_ = -1;
    followed_ = prompt.size();
    failed_.clear();
    proposed_.clear();
    forget_plan();
}

void NgramDrafter::index_up_to(const std::vector<int32_t>& history) {
    index_.index(history, &indexed_, 0, [](int32_t& latest, int32_t next) { latest = next; });
}

int32_t NgramDrafter::find(const std::vector<int32_t>& history, int32_t* match_len) {
    index_up_to(history);
    const int32_t size = static_cast<int32_t>(history.size());
    int32_t found = -1;
    *match_len = 0;
    index_.longest_suffix(history, [&](int32_t n, const int32_t* suffix, int32_t next) {
        // Guard against hash collisions: the tokens must really match.
        if (next < n || next >= size || !std::equal(suffix, suffix + n, history.data() + next - n)) return false;
        *match_len = n;
        found = next;
        return true;
    });
    return found;
}

void NgramDrafter::follow(const std::vector<int32_t>& history) {
    const size_t size = history.size();
    if (followed_ > size) {  // a shorter history: a new sequence without begin(); start over on it
        begin(history, SamplingParams{});
        return;
    }
    // What became of the last proposal: rejected at its first token means that
    // source position does not continue this text.
    if (!proposed_.empty() && proposed_at_size_ < size && proposed_at_size_ >= followed_ &&
        history[proposed_at_size_] != proposed_[0]) {
        failed_.insert(proposed_from_);
    }
    proposed_.clear();
    for (size_t j = followed_; j < size; ++j) {
        if (copy_.at < 0) continue;
        copy_.step(static_cast<size_t>(copy_.at) < j && history[static_cast<size_t>(copy_.at)] == history[j]);
    }
    followed_ = size;
}

int32_t NgramDrafter::reanchor(const std::vector<int32_t>& history, int32_t* m) const {
    // The source precedes the suffix: its own text, up to its last token.
    const int32_t size = static_cast<int32_t>(history.size());
    return copy_.find_near_anchor(history.data(), size, history.data(), size, failed_, m);
}

DraftPlan NgramDrafter::lookup(const std::vector<int32_t>& history) {
    follow(history);
    DraftPlan p;
    p.source = DraftSource::kNgram;
    int32_t from = -1;
    if (copy_.at >= 0) {
        from = copy_.at;
        p.match_len = copy_.run;
    } else {
        int32_t m = 0;
        bool near = (from = reanchor(history, &m)) >= 0;
        if (!near) {
            from = find(history, &m);
            // In the window only at a position the re-anchor skipped (its proposal was
            // rejected once): the output has come back to it, so the copy resumes there.
            near = copy_.near_anchor(from);
        }
        if (from >= 0) copy_.start(from, m, near);  // follow it from now on
        p.fresh = from >= 0;
        p.match_len = from >= 0 ? m : 0;
    }
    p.near_copy = from >= 0 && copy_.reanchored;  // until the copy diverges again
    p.next_guess = from >= 0 ? history[static_cast<size_t>(from)] : -1;
    planned_from_ = from;
    return p;
}

int32_t NgramDrafter::draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng&,
                                    std::vector<int32_t>& tokens, std::vector<Distribution>& q, DraftStopRule*) {
    // No stop rule is asked: a lookup's one-hot q carries no belief (drafter.h).
    tokens.clear();
    const int32_t at = planned_from_;
    if (at < 0) return 0;
    const int32_t size = static_cast<int32_t>(history.size());
    for (int32_t i = 0; i < max_n; ++i) {
        // Past the end of history the copy continues from its own proposals,
        // which extends repeating patterns ("a b c a b c ...").
        const int32_t src = at + i;
        propose(src < size ? history[static_cast<size_t>(src)] : tokens[static_cast<size_t>(src - size)], tokens, q);
    }
    proposed_ = tokens;
    proposed_at_size_ = history.size();
    proposed_from_ = at;
    return static_cast<int32_t>(tokens.size());
}

}  // namespace pyspec
