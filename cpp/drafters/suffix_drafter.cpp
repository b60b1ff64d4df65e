#include "drafters/suffix_drafter.h"

#include <algorithm>
#include <stdexcept>

namespace pyspec {

namespace {
// After memory was rebuilt, the matcher re-reads at most this many committed
// tokens: a longer match would add no evidence (kPrefixEvidence caps it).
constexpr size_t kRestream = 256;
}  // namespace

SuffixDrafter::SuffixDrafter(std::unique_ptr<Drafter> local, int32_t n_vocab)
    : LookupDrafter(n_vocab), local_(std::move(local)) {
    if (!local_) throw std::invalid_argument("a suffix drafter needs a local lookup drafter");
}

bool SuffixDrafter::use_memory(std::shared_ptr<const SuffixStore> store) {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_ = std::move(store);
    has_pending_ = true;
    return true;
}

void SuffixDrafter::take_pending_store() {
    {
        std::lock_guard<std::mutex> lock(pending_mutex_);
        if (!has_pending_) return;
        store_ = std::move(pending_);
        pending_.reset();
        has_pending_ = false;
    }
    forget_memory();
    followed_ = 0;
    forget_plan();
    epoch_ = store_ ? store_->epoch() : 0;
}

void SuffixDrafter::forget_memory() {
    match_ = SuffixAutomaton::Match{};
    copy_.reset();
    proposed_from_ = -1;
    failed_.clear();
}

void SuffixDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) {
    take_pending_store();
    local_->begin(prompt, sampling);
    forget_memory();
    followed_ = 0;
    forget_plan();
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
                                     int32_t* evidence, bool* reanchored, bool* fresh) {
    const std::vector<int32_t>& text = sam.text();
    const int32_t n_text = static_cast<int32_t>(text.size());
    // A position proposes a token of this vocabulary (a memory shared across models may hold others).
    auto proposes = [&](int32_t c) {
        return c >= 0 && c < n_text && text[static_cast<size_t>(c)] >= 0 && text[static_cast<size_t>(c)] < n_vocab_;
    };
    if (copy_.at >= 0 && !proposes(copy_.at)) copy_.at = -1;  // the copied document ended
    *fresh = copy_.at < 0;  // whatever is proposed below was found this round
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
    // The matched prefix counts up to kPrefixEvidence: a retried request matches its
    // whole prompt, yet its new answer may leave the old one within a few tokens.
    // Long drafts must be earned by tokens followed (auto's long copies).
    const int32_t prefix = std::min(match_.len, kPrefixEvidence);
    // Rarely in the window: the re-anchor above takes any position there that
    // was not rejected and proposes a token of this vocabulary.
    *reanchored = copy_.near_anchor(next.pos);  // the diverged copy resumes (copy_cursor.h)
    copy_.start(next.pos, prefix, *reanchored);  // follow it from now on
    *evidence = copy_.run + std::min(next.count - 1, prefix);
    return next.pos;
}

DraftPlan SuffixDrafter::lookup(const std::vector<int32_t>& history) {
    take_pending_store();
    DraftPlan local = local_->plan(history);
    planned_memory_ = false;
    if (!store_) return local;
    const auto lock = store_->read();
    if (store_->epoch_locked() != epoch_) {  // memory was rebuilt: its positions moved
        forget_memory();
        epoch_ = store_->epoch_locked();
        followed_ = history.size() > kRestream ? history.size() - kRestream : 0;
    }
    const SuffixAutomaton& sam = store_->automaton();
    follow(history, sam);
    int32_t evidence = 0;
    bool reanchored = false, fresh = false;
    const int32_t from = memory_source(history, sam, &evidence, &reanchored, &fresh);
    if (from < 0 || evidence <= local.match_len) return local;
    DraftPlan p;
    p.source = DraftSource::kNgram;
    p.match_len = evidence;
    p.near_copy = reanchored;
    p.fresh = fresh;
    p.next_guess = sam.text()[static_cast<size_t>(from)];
    p.from_memory = true;
    planned_memory_ = true;
    planned_from_ = from;
    return p;
}

int32_t SuffixDrafter::draft_planned(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                                     std::vector<int32_t>& tokens, std::vector<Distribution>& q, DraftStopRule* stop) {
    if (!planned_memory_) return local_->draft(history, max_n, rng, tokens, q, stop);
    // Copy the stored continuation (no stop rule: a one-hot q carries no belief).
    tokens.clear();
    const auto lock = store_->read();
    if (store_->epoch_locked() != epoch_) return 0;  // rebuilt since the plan: its position is gone
    const std::vector<int32_t>& text = store_->automaton().text();
    for (int32_t i = 0; i < max_n; ++i) {
        const size_t src = static_cast<size_t>(planned_from_ + i);
        if (src >= text.size() || text[src] < 0 || text[src] >= n_vocab_) break;  // the document ends
        propose(text[src], tokens, q);
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
