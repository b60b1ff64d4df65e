#include "drafters/suffix_drafter.h"

#include <algorithm>
#include <stdexcept>


namespace pyspec {

namespace {
// After memory was rebuilt, the matcher re-reads at most this many committed
// tokens: a longer match than that would only add evidence auto already caps.
constexpr size_t kRestream = 256;
}  // namespace

SuffixDrafter::SuffixDrafter(std::unique_ptr<Drafter> local, int32_t n_vocab)
    : local_(std::move(local)), n_vocab_(n_vocab) {
    if (!local_) throw std::invalid_argument("a suffix drafter needs a local lookup drafter");
}

bool SuffixDrafter::use_memory(std::shared_ptr<const SuffixStore> store) {
    store_ = std::move(store);
    forget_memory();
    followed_ = 0;
    epoch_ = store_ ? store_->epoch() : 0;
    return true;
}

void SuffixDrafter::forget_memory() {
    match_ = SuffixAutomaton::Match{};
    copy_.reset();
    proposed_from_ = -1;
    failed_.clear();
}

void SuffixDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool prefill) {
    local_->begin(prompt, sampling, prefill);
    forget_memory();
    followed_ = 0;
    planned_size_ = 0;
    memory_drafts_ = 0;
}

void SuffixDrafter::follow(const std::vector<int32_t>& history, const SuffixAutomaton& sam) {
    const size_t size = history.size();
    if (followed_ > size) {  // a shorter history: a new sequence without begin()
        forget_memory();
        followed_ = 0;
    }
    // The last memory draft rejected at its first token: that position does not continue this text.
    if (proposed_from_ >= 0 && proposed_at_size_ < size && proposed_at_size_ >= followed_ &&
        history[proposed_at_size_] != proposed_token_) {
        failed_.insert(proposed_from_);
    }
    proposed_from_ = -1;
    const std::vector<int32_t>& text = sam.text();
    for (size_t j = followed_; j < size; ++j) {
        const int32_t tok = history[j];
        sam.advance(match_, tok);
        if (copy_.at < 0) continue;
        copy_.step(static_cast<size_t>(copy_.at) < text.size() && text[static_cast<size_t>(copy_.at)] == tok);
    }
    followed_ = size;
}

int32_t SuffixDrafter::memory_source(const std::vector<int32_t>& history, const SuffixAutomaton& sam,
                                     int32_t* evidence, bool* reanchored) {
    const std::vector<int32_t>& text = sam.text();
    const int32_t n_text = static_cast<int32_t>(text.size());
    // A position proposes a token of this vocabulary (a memory shared across models may hold others).
    auto proposes = [&](int32_t c) {
        return c >= 0 && c < n_text && text[static_cast<size_t>(c)] >= 0 && text[static_cast<size_t>(c)] < n_vocab_;
    };
    if (copy_.at >= 0 && !proposes(copy_.at)) copy_.at = -1;  // the copied document ended
    if (copy_.at < 0) {
        int32_t m = 0;
        const int32_t c = copy_.find_near_anchor(text.data(), n_text, history.data(),
                                                 static_cast<int32_t>(history.size()), failed_, &m);
        if (proposes(c)) copy_.start(c, m, true);
    }
    if (copy_.at >= 0) {
        *evidence = copy_.run;
        *reanchored = copy_.reanchored;
        return copy_.at;
    }
    if (match_.len < kMinMatch) return -1;
    const SuffixAutomaton::Next next = sam.best_next(match_);
    if (!proposes(next.pos) || failed_.count(next.pos)) return -1;
    copy_.start(next.pos, match_.len, false);  // follow it from now on
    *reanchored = false;
    *evidence = match_.len + std::min(next.count - 1, match_.len);
    return next.pos;
}

DraftPlan SuffixDrafter::plan(const std::vector<int32_t>& history) {
    DraftPlan local = local_->plan(history);
    planned_memory_ = false;
    planned_size_ = history.size();
    if (!store_) return local;
    const auto lock = store_->read();
    if (store_->epoch_locked() != epoch_) {  // memory was rebuilt: its positions moved
        forget_memory();
        epoch_ = store_->epoch_locked();
        followed_ = history.size() > kRestream ? history.size() - kRestream : 0;
    }
    const SuffixAutomaton& sam = store_->automaton();
    follow(history, sam);
    const bool copying = copy_.at >= 0;
    int32_t evidence = 0;
    bool reanchored = false;
    const int32_t from = memory_source(history, sam, &evidence, &reanchored);
    if (from < 0 || evidence <= local.match_len) return local;
    DraftPlan p;
    p.source = DraftSource::kNgram;
    p.match_len = evidence;
    p.near_copy = reanchored;
    p.fresh = !copying;
    p.next_guess = sam.text()[static_cast<size_t>(from)];
    p.from_memory = true;
    planned_memory_ = true;
    planned_from_ = from;
    return p;
}

DraftPlan SuffixDrafter::choose(const std::vector<int32_t>& history, const LengthFor& length_for) {
    DraftPlan p = plan(history);
    p.length = p.match_len > 0 ? length_for(p) : -1;
    return p;
}

int32_t SuffixDrafter::draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                             std::vector<int32_t>& tokens, std::vector<Distribution>& q, DraftStopRule* stop) {
    if (planned_size_ != history.size()) plan(history);
    planned_size_ = 0;
    if (!planned_memory_) return local_->draft(history, max_n, rng, tokens, q, stop);
    // Copy the stored continuation (no stop rule: a one-hot q carries no belief).
    tokens.clear();
    const auto lock = store_->read();
    if (store_->epoch_locked() != epoch_) return 0;  // rebuilt since the plan: its position is gone
    const std::vector<int32_t>& text = store_->automaton().text();
    for (int32_t i = 0; i < max_n; ++i) {
        const size_t src = static_cast<size_t>(planned_from_ + i);
        if (src >= text.size() || text[src] < 0 || text[src] >= n_vocab_) break;  // the document ends
        q[static_cast<size_t>(i)].set_one_hot(text[src], n_vocab_);
        tokens.push_back(text[src]);
    }
    if (tokens.empty()) return 0;
    store_->touch(planned_from_);
    proposed_from_ = planned_from_;
    proposed_token_ = tokens[0];
    proposed_at_size_ = history.size();
    ++memory_drafts_;
    return static_cast<int32_t>(tokens.size());
}

}  // namespace pyspec
