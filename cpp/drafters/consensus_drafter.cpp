#include "drafters/consensus_drafter.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace pyspec {

ConsensusPool::ConsensusPool(int32_t n_seq, int32_t n_min, int32_t n_max)
    : n_min_(n_min), n_max_(n_max), texts_(static_cast<size_t>(std::max(n_seq, 0))),
      prompt_len_(texts_.size(), 0), indexed_(texts_.size(), 0) {
    if (n_seq < 1) throw std::invalid_argument("a consensus pool needs at least one sample");
    if (n_min < 1 || n_max < n_min || n_max > 16) {
        throw std::invalid_argument("n-gram sizes must satisfy 1 <= n_min <= n_max <= 16");
    }
    index_.resize(static_cast<size_t>(n_max - n_min + 1));
}

void ConsensusPool::reset(int32_t seq, const std::vector<int32_t>& prompt) {
    const size_t s = static_cast<size_t>(seq);
    // Drop the sample's entries from the index (a new generation of it).
    for (auto& m : index_) {
        for (auto it = m.begin(); it != m.end();) {
            auto& v = it->second;
            v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == seq; }), v.end());
            it = v.empty() ? m.erase(it) : std::next(it);
        }
    }
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
    // An n-gram of generated text ending at i is indexed once its next token
    // (i + 1) exists: it then votes for that token.
    for (size_t i = std::max(indexed_[s], prompt_len_[s]); i + 1 < text.size(); ++i) {
        for (int32_t n = n_min_; n <= n_max_; ++n) {
            if (i + 1 < static_cast<size_t>(n) || i + 1 - static_cast<size_t>(n) < prompt_len_[s]) break;
            const int32_t* start = text.data() + i + 1 - n;
            index_[static_cast<size_t>(n - n_min_)][ngram_key(start, n)].emplace_back(seq, static_cast<int32_t>(i + 1));
        }
    }
    if (text.size() > 0) indexed_[s] = std::max(indexed_[s], text.size() - 1);
}

std::pair<int32_t, int32_t> ConsensusPool::best(int32_t seq, const std::vector<int32_t>& history, int32_t* match_len,
                                                int32_t* votes) const {
    *match_len = *votes = 0;
    const int32_t size = static_cast<int32_t>(history.size());
    for (int32_t n = std::min(n_max_, size); n >= n_min_; --n) {
        const int32_t* suffix = history.data() + size - n;
        const auto& m = index_[static_cast<size_t>(n - n_min_)];
        const auto it = m.find(ngram_key(suffix, n));
        if (it == m.end()) continue;
        // Votes per continuation token; the most recent occurrence of each wins its ties.
        std::unordered_map<int32_t, std::pair<int32_t, std::pair<int32_t, int32_t>>> tally;
        for (const auto& [other, at] : it->second) {
            const std::vector<int32_t>& t = texts_[static_cast<size_t>(other)];
            if (other == seq || at >= static_cast<int32_t>(t.size())) continue;
            if (!std::equal(suffix, suffix + n, t.data() + at - n)) continue;  // a hash collision
            auto& entry = tally[t[static_cast<size_t>(at)]];
            ++entry.first;
            entry.second = {other, at};  // entries are oldest first: the last is the most recent
        }
        int32_t best_votes = 0;
        std::pair<int32_t, int32_t> where{-1, -1};
        for (const auto& [token, entry] : tally) {
            (void)token;
            if (entry.first > best_votes || (entry.first == best_votes && entry.second.second > where.second)) {
                best_votes = entry.first;
                where = entry.second;
            }
        }
        if (best_votes > 0) {
            *match_len = n;
            *votes = best_votes;
            return where;
        }
    }
    return {-1, -1};
}

ConsensusDrafter::ConsensusDrafter(std::shared_ptr<ConsensusPool> pool, int32_t seq, int32_t n_vocab, int32_t n_min,
                                   int32_t n_max)
    : pool_(std::move(pool)), seq_(seq), n_vocab_(n_vocab), own_(n_vocab, n_min, n_max) {
    if (!pool_ || seq < 0 || seq >= pool_->n_seq()) throw std::invalid_argument("sample index outside the pool");
}

void ConsensusDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool prefill) {
    pool_->reset(seq_, prompt);
    own_.begin(prompt, sampling, prefill);
    from_seq_ = from_pos_ = -1;
    planned_size_ = 0;
    sibling_drafts_ = 0;
}

DraftPlan ConsensusDrafter::plan(const std::vector<int32_t>& history) {
    pool_->update(seq_, history);
    int32_t match_len = 0, votes = 0;
    const auto [other, pos] = pool_->best(seq_, history, &match_len, &votes);
    from_seq_ = other;
    from_pos_ = pos;
    planned_size_ = history.size();
    if (other < 0) return own_.plan(history);
    DraftPlan p;
    p.source = DraftSource::kNgram;
    p.match_len = match_len + votes - 1;  // more siblings agreeing is more evidence, like a longer match
    p.next_guess = pool_->text(other)[static_cast<size_t>(pos)];
    return p;
}

int32_t ConsensusDrafter::draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                                std::vector<int32_t>& tokens, std::vector<Distribution>& q, DraftStopRule* stop) {
    if (planned_size_ != history.size()) plan(history);
    planned_size_ = 0;
    if (from_seq_ < 0) return own_.draft(history, max_n, rng, tokens, q, stop);
    // Copy the sibling's continuation (no stop rule: a one-hot q carries no belief).
    tokens.clear();
    const std::vector<int32_t>& t = pool_->text(from_seq_);
    for (int32_t i = 0; i < max_n && from_pos_ + i < static_cast<int32_t>(t.size()); ++i) {
        const int32_t tok = t[static_cast<size_t>(from_pos_ + i)];
        q[static_cast<size_t>(i)].set_one_hot(tok, n_vocab_);
        tokens.push_back(tok);
    }
    ++sibling_drafts_;
    return static_cast<int32_t>(tokens.size());
}

}  // namespace pyspec
