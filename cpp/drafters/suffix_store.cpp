#include "drafters/suffix_store.h"

#include <algorithm>
#include <stdexcept>

namespace pyspec {

namespace {
// Below this a store cannot hold a useful document: refuse it as a setting.
constexpr size_t kMinCap = 64 * 1024;
}  // namespace

SuffixStore::SuffixStore(size_t cap_bytes) : cap_(cap_bytes) {
    if (cap_bytes < kMinCap) throw std::invalid_argument("a memory store needs a cap of at least 64 KiB");
}

size_t SuffixStore::bytes() const {
    auto lock = read();
    return bytes_locked();
}

size_t SuffixStore::bytes_locked() const { return sam_.bytes() + docs_.capacity() * sizeof(Document); }

int64_t SuffixStore::n_tokens() const {
    auto lock = read();
    int64_t n = 0;
    for (const Document& d : docs_) n += d.size;
    return n;
}

int32_t SuffixStore::n_documents() const {
    auto lock = read();
    return static_cast<int32_t>(docs_.size());
}

uint64_t SuffixStore::epoch() const {
    auto lock = read();
    return epoch_;
}

std::vector<std::vector<int32_t>> SuffixStore::documents() const {
    auto lock = read();
    std::lock_guard<std::mutex> ticks(touch_mutex_);
    std::vector<const Document*> order;
    for (const Document& d : docs_) order.push_back(&d);
    std::stable_sort(order.begin(), order.end(), [](const Document* a, const Document* b) { return a->used < b->used; });
    std::vector<std::vector<int32_t>> out;
    const std::vector<int32_t>& text = sam_.text();
    for (const Document* d : order) out.emplace_back(text.begin() + d->start, text.begin() + d->start + d->size);
    return out;
}

void SuffixStore::touch(int32_t pos) const {
    const auto it = std::upper_bound(docs_.begin(), docs_.end(), pos,
                                     [](int32_t p, const Document& d) { return p < d.start; });
    if (it == docs_.begin()) return;
    std::lock_guard<std::mutex> lock(touch_mutex_);
    std::prev(it)->used = ++tick_;
}

void SuffixStore::append_locked(const std::vector<int32_t>& tokens, int64_t used) {
    if (!docs_.empty()) sam_.push(kSeparator);
    const int32_t start = static_cast<int32_t>(sam_.text().size());
    for (int32_t t : tokens) sam_.push(t);
    docs_.push_back(Document{start, static_cast<int32_t>(tokens.size()), used});
}

void SuffixStore::add(const std::vector<int32_t>& tokens) {
    if (tokens.empty()) return;
    // Checked before any is stored: a refused document leaves nothing to copy.
    if (std::any_of(tokens.begin(), tokens.end(), [](int32_t t) { return t < 0; })) {
        throw std::invalid_argument("memory documents hold token ids (>= 0)");
    }
    std::unique_lock<std::shared_mutex> lock(mutex_);
    append_locked(tokens, ++tick_);
    if (bytes_locked() > cap_) evict_locked();
}

void SuffixStore::evict_locked() {
    // Keep the most recently used documents that fit in 3/4 of the cap, at the
    // bytes per token this store has shown (the automaton's size is linear in its text).
    const size_t per_token = std::max<size_t>(1, bytes_locked() / std::max<size_t>(1, sam_.text().size()));
    const size_t budget = cap_ / 4 * 3 / per_token;
    std::vector<size_t> order(docs_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return docs_[a].used > docs_[b].used; });
    std::vector<bool> keep(docs_.size(), false);
    std::vector<int32_t> tail;  // the newest document's end, when it alone exceeds the budget
    size_t kept = 0;
    for (size_t i : order) {
        const size_t n = static_cast<size_t>(docs_[i].size) + 1;
        if (kept + n > budget) {
            if (kept == 0 && budget > 1) {
                const std::vector<int32_t>& text = sam_.text();
                const int32_t end = docs_[i].start + docs_[i].size;
                tail.assign(text.begin() + end - static_cast<int32_t>(budget - 1), text.begin() + end);
            }
            break;
        }
        keep[i] = true;
        kept += n;
    }
    std::vector<std::pair<std::vector<int32_t>, int64_t>> kept_docs;
    const std::vector<int32_t>& text = sam_.text();
    for (size_t i = 0; i < docs_.size(); ++i) {
        if (!keep[i]) continue;
        kept_docs.emplace_back(std::vector<int32_t>(text.begin() + docs_[i].start,
                                                    text.begin() + docs_[i].start + docs_[i].size),
                               docs_[i].used);
    }
    if (!tail.empty()) kept_docs.emplace_back(std::move(tail), tick_);
    sam_ = SuffixAutomaton();  // releases the old automaton's memory
    docs_.clear();
    docs_.shrink_to_fit();
    for (const auto& [tokens, used] : kept_docs) append_locked(tokens, used);
    ++epoch_;
}

void SuffixStore::clear() {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    sam_ = SuffixAutomaton();
    docs_.clear();
    ++epoch_;
}

}  // namespace pyspec
