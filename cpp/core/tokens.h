// Small helpers over token sequences, shared by the model wrapper, the drafters
// and the engine.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace pyspec {

// Length of the common prefix of a and b, at most `limit`.
inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                            size_t limit = std::numeric_limits<size_t>::max()) {
    const size_t n = std::min({a.size(), b.size(), limit});
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

// Length of the common prefix of a and b's tail from index `from` (0 past its end).
inline size_t common_prefix_at(const std::vector<int32_t>& a, const std::vector<int32_t>& b, size_t from) {
    if (from >= b.size()) return 0;
    const size_t n = std::min(a.size(), b.size() - from);
    size_t i = 0;
    while (i < n && a[i] == b[from + i]) ++i;
    return i;
}

// Hash of the n tokens at `tokens` (FNV-1a over the ids): the key of the
// n-gram indexes (prompt lookup, consensus). Matches are confirmed by comparing
// the tokens, so a collision costs a lookup, never a wrong draft.
inline uint64_t ngram_key(const int32_t* tokens, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < n; ++i) {
        h ^= static_cast<uint32_t>(tokens[i]);
        h *= 0x100000001b3ull;
    }
    return h;
}

}  // namespace pyspec
