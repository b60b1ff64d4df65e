// Re-anchoring a copy after an edit: the one rule, for a drafter's own text
// (NgramDrafter) and for memory (SuffixDrafter). Copy-with-edits output leaves
// its source at an edit and resumes it a little further on, so after a
// divergence at source position `anchor`, the continuation is sought near it:
// the last 3, then 2, then 1 tokens of the output, matched in the window
// [anchor - kBefore, anchor + kAfter) of the source; the position nearest the
// anchor wins (a short match there beats a long one elsewhere), never one
// whose proposal was rejected outright in this generation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <unordered_set>

namespace pyspec {

struct Reanchor {
    static constexpr int32_t kBefore = 4;   // the window around where the copy diverged
    static constexpr int32_t kAfter = 64;   // (an edit may insert or delete a few dozen tokens)

    // The continuation position c (source[c - m, c) equals the output's last m
    // tokens, c < limit) nearest `anchor`, or -1; sets *m. `source` of `size`
    // tokens, `suffix` the output's last `suffix_len` tokens.
    static int32_t find(const int32_t* source, int32_t limit, const int32_t* suffix, int32_t suffix_len,
                        int32_t anchor, const std::unordered_set<int32_t>& failed, int32_t* m) {
        const int32_t lo = std::max(anchor - kBefore, 0);
        const int32_t hi = std::min(anchor + kAfter, limit - 1);
        for (int32_t n = std::min(3, suffix_len); n >= 1; --n) {
            const int32_t* tail = suffix + suffix_len - n;
            int32_t best = -1;
            for (int32_t c = std::max(lo, n); c <= hi; ++c) {
                if (!std::equal(tail, tail + n, source + c - n) || failed.count(c)) continue;
                if (best < 0 || std::abs(c - anchor) < std::abs(best - anchor)) best = c;
            }
            if (best >= 0) {
                *m = n;
                return best;
            }
        }
        return -1;
    }
};

}  // namespace pyspec
