#include "engine/host_cache.h"

#include "core/tokens.h"

namespace pyspec {

size_t HostCache::Entry::bytes() const {
    size_t n = 0;
    for (const Part& p : parts) n += p.state.size() + p.tokens.size() * sizeof(int32_t);
    return n;
}

bool HostCache::put(Entry entry) {
    if (entry.parts.empty() || entry.parts[0].tokens.size() < kMinTokens) return false;
    const size_t size = entry.bytes();
    const std::lock_guard<std::mutex> lock(mutex_);
    if (size > capacity_) return false;
    const std::vector<int32_t>& tokens = entry.parts[0].tokens;
    for (auto it = entries_.begin(); it != entries_.end();) {
        // An entry this one extends (or repeats) says nothing this one does not.
        const std::vector<int32_t>& old = it->parts[0].tokens;
        if (it->parts[0].model == entry.parts[0].model && old.size() <= tokens.size() &&
            common_prefix(old, tokens) == old.size()) {
            bytes_ -= it->bytes();
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
    while (!entries_.empty() && bytes_ + size > capacity_) {
        bytes_ -= entries_.back().bytes();
        entries_.pop_back();
        ++stats_.evicted;
    }
    bytes_ += size;
    entries_.push_front(std::move(entry));
    ++stats_.saved;
    return true;
}

std::list<HostCache::Entry>::iterator HostCache::find_best(const Model& target, const std::vector<int32_t>& prompt,
                                                               size_t limit, size_t* common) {
    auto best = entries_.end();
    *common = 0;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->parts[0].model != &target) continue;
        const size_t c = common_prefix(it->parts[0].tokens, prompt, limit);
        if (c > *common) {
            *common = c;
            best = it;
        }
    }
    return best;
}

size_t HostCache::best(const Model& target, const std::vector<int32_t>& prompt, size_t limit) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    size_t common = 0;
    find_best(target, prompt, limit, &common);
    return common;
}

HostCache::Entry HostCache::fetch(const Model& target, const std::vector<int32_t>& prompt, size_t limit) {
    const std::lock_guard<std::mutex> lock(mutex_);
    size_t common = 0;
    const auto it = find_best(target, prompt, limit, &common);
    if (it == entries_.end()) return {};
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front();
}

void HostCache::note_restored(size_t tokens) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.restored;
    stats_.restored_tokens += static_cast<int64_t>(tokens);
}

void HostCache::clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
    bytes_ = 0;
}

std::vector<HostCache::Entry> HostCache::entries() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return {entries_.begin(), entries_.end()};
}

HostCache::Stats HostCache::stats() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    Stats s = stats_;
    s.entries = static_cast<int64_t>(entries_.size());
    s.bytes = static_cast<int64_t>(bytes_);
    s.capacity = static_cast<int64_t>(capacity_);
    return s;
}

}  // namespace pyspec
