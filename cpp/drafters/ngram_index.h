// An index of a text's n-grams (n_min..n_max tokens, one hash map per n), as the
// lookup drafters keep it: NgramDrafter over its own text (the latest position
// after each n-gram), ConsensusPool over the siblings' texts (every occurrence).
// What a map entry holds is the owner's (Entry); the index writes the two walks
// both make: over the n-grams a text has gained, and over the suffixes of a
// history, longest first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "core/tokens.h"

namespace pyspec {

template <class Entry>
class NgramIndex {
public:
    NgramIndex(int32_t n_min, int32_t n_max) : n_min_(n_min), n_max_(n_max) {
        if (n_min < 1 || n_max < n_min || n_max > 16) {
            throw std::invalid_argument("n-gram sizes must satisfy 1 <= n_min <= n_max <= 16");
        }
        maps_.resize(static_cast<size_t>(n_max - n_min + 1));
    }

    void clear() {
        for (auto& m : maps_) m.clear();
    }

    // Index the n-grams of `text` that end at i >= max(*indexed, floor) and start
    // at or after `floor`: add(entry, i + 1) for each. An n-gram is indexed once
    // its next token (i + 1) exists, so a text's own suffix never matches itself.
    // *indexed then marks where the next call starts.
    template <class Add>
    void index(const std::vector<int32_t>& text, size_t* indexed, size_t floor, Add&& add) {
        for (size_t i = std::max(*indexed, floor); i + 1 < text.size(); ++i) {
            for (int32_t n = n_min_; n <= n_max_; ++n) {
                const size_t len = static_cast<size_t>(n);
                if (i + 1 < len || i + 1 - len < floor) break;
                add(maps_[static_cast<size_t>(n - n_min_)][ngram_key(text.data() + i + 1 - len, n)],
                    static_cast<int32_t>(i + 1));
            }
        }
        if (!text.empty()) *indexed = std::max(*indexed, text.size() - 1);
    }

    // Visit the suffixes of `history` found in the index, longest first:
    // visit(n, suffix, entry) returns true to stop there. Returns whether one did.
    // Keys are hashes: a visitor confirms the tokens before it trusts an entry.
    template <class Visit>
    bool longest_suffix(const std::vector<int32_t>& history, Visit&& visit) const {
        const int32_t size = static_cast<int32_t>(history.size());
        for (int32_t n = std::min(n_max_, size); n >= n_min_; --n) {
            const int32_t* suffix = history.data() + size - n;
            const auto& m = maps_[static_cast<size_t>(n - n_min_)];
            const auto it = m.find(ngram_key(suffix, n));
            if (it != m.end() && visit(n, suffix, it->second)) return true;
        }
        return false;
    }

    // Erase the entries for which drop(entry) is true (it may edit the entry first).
    template <class Drop>
    void erase_if(Drop&& drop) {
        for (auto& m : maps_) {
            for (auto it = m.begin(); it != m.end();) it = drop(it->second) ? m.erase(it) : std::next(it);
        }
    }

private:
    int32_t n_min_, n_max_;
    std::vector<std::unordered_map<uint64_t, Entry>> maps_;  // maps_[n - n_min][hash of n tokens]
};

}  // namespace pyspec
