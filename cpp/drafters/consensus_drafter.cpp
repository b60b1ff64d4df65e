#include "drafters/consensus_drafter.h"

#include <algorithm>
#include <stdexcept>

namespace pyspec {

ConsensusPool::ConsensusPool(int32_t n_seq, int32_t n_min, int32_t n_max)
    : texts_(static_cast<size_t>(std::max(n_seq, 0))), prompt_len_(texts_.size(), 0), indexed_(texts_.size(), 0),
      index_(n_min, n_max) {
    if (n_seq < 1) throw std::invalid_argument("a consensus pool needs at least one sample");
}

void ConsensusPool::reset(int32_t seq, const std::vector<int32_t>& prompt) {
    const size_t s = static_cast<size_t>(seq);
    // Drop the sample's entries from the index (a new generation of it).
    index_.erase_if([&](auto& v) {
        v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == seq; }), v.end());
        return v.empty();
    });
    texts_.at(s) = prompt;
    prompt_len_[s] = indexed_[s] = prompt.size();
}

void ConsensusPool::update(int32_t seq, const std::vector<int32_t>& history) {
    const size_t s = static_cast<size_t>(seq);
    std::vector<int32_t>& text = texts_.at(s);
    // Committed tokens never change: only the new ones are appended (checked
    // where they join, which catches a sample that was not reset()).
    if (history.size() < text.size() || (!text.empty() && history[text.size() - 1] != text.back())) {
        throw std::logic_error("consensus pool: a sample's history is not a continuation of what it committed");
    }
    text.insert(text.end(), history.begin() + static_cast<std::ptrdiff_t>(text.size()), history.end());
    // Only generated text is indexed (from prompt_len): each n-gram votes for the token after it.
    index_.index(text, &indexed_[s], prompt_len_[s],
                 [seq](auto& occurrences, int32_t next) { occurrences.emplace_back(seq, next); });
}

std::pair<int32_t, int32_t> ConsensusPool::best(int32_t seq, const std::vector<int32_t>& history, int32_t* match_len,
                                                int32_t* votes) const {
    *match_len = *votes = 0;
    std::pair<int32_t, int32_t> where{-1, -1};
    index_.longest_suffix(history, [&](int32_t n, const int32_t* suffix, const auto& occurrences) {
        // Votes per continuation token; the most recent occurrence of each wins its ties.
        std::unordered_map<int32_t, std::pair<int32_t, std::pair<int32_t, int32_t>>> tally;
        for (const auto& [other, at] : occurrences) {
            const std::vector<int32_t>& t = texts_[static_cast<size_t>(other)];
            if (other == seq || at >= static_cast<int32_t>(t.size())) continue;
            if (!std::equal(suffix, suffix + n, t.data() + at - n)) continue;  // a hash collision
            auto& entry = tally[t[static_cast<size_t>(at)]];
            ++entry.first;
            entry.second = {other, at};  // entries are oldest first: the last is the most recent
        }
        for (const auto& [token, entry] : tally) {
            (void)token;
            if (entry.first > *votes || (entry.first == *votes && entry.second.second > where.second)) {
                *votes = entry.first;
                where = entry.second;
            }
        }
        if (*votes == 0) return false;
        *match_len = n;
        return true;
    });
    return where;
}

ConsensusDrafter::ConsensusDrafter(std::shared_ptr<ConsensusPool> pool, int32_t seq, int32_t n_vocab, int32_t n_min,
                                   int32_t n_max)
    : LookupDrafter(n_vocab), pool_(std::move(pool)), seq_(seq), own_(n_vocab, n_min, n_max) {
    if (!pool_ || seq < 0 || seq >= pool_->n_seq()) throw std::invalid_argument("sample index outside the pool");
}

void ConsensusDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) {
    pool_->reset(seq_, prompt);
    own_.begin(prompt, sampling);
    from_seq_ = from_pos_ = -1;
    forget_plan();
    sibling_drafts_ = 0;
}

DraftPlan ConsensusDrafter::lookup(const std::vector<int32_t>& history) {
    pool_->update(seq_, history);
    int32_t match_len = 0, votes = 0;
    const auto [other, pos] = pool_->best(seq_, history, &match_len, &votes);
    from_seq_ = other;
    from_pos_ = pos;
    if (other < 0) return own_.plan(history);
    DraftPlan p;
    p.source = DraftSource::kNgram;
    p.match_len = match_len + votes - 1;  // more siblings agreeing is more evidence, like a longer match
    p.next_guess = pool_->text(other)[static_cast<size_t>(pos)];
    return p;
}

int32_t ConsensusDrafter::draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                                        std::vector<int32_t>& tokens, std::vector<Distribution>& q,
                                        DraftStopRule* stop) {
    if (from_seq_ < 0) return own_.draft(history, max_n, rng, tokens, q, stop);
    // Copy the sibling's continuation (no stop rule: a one-hot q carries no belief).
    tokens.clear();
    const std::vector<int32_t>& t = pool_->text(from_seq_);
    for (int32_t i = 0; i < max_n && from_pos_ + i < static_cast<int32_t>(t.size()); ++i) {
        propose(t[static_cast<size_t>(from_pos_ + i)], tokens, q);
    }
    ++sibling_drafts_;
    return static_cast<int32_t>(tokens.size());
}

}  // namespace pyspec
