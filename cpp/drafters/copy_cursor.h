// A copy cursor: where in a source text the output is copying, for lookup
// drafters over their own text (NgramDrafter) and over memory (SuffixDrafter).
//
// Copy-with-edits output (corrections, refactors, "return the whole file with X
// changed") follows a source span, diverges at each edit, then copies on. So
// while the committed tokens follow the source, the cursor advances and its
// evidence (run) grows; at a divergence it records where the copy was (anchor).
// Re-anchoring then seeks the continuation near the anchor, since edited text
// resumes its source a little further on: the last 3, then 2, then 1 tokens of
// the output, matched in the window [anchor - kBefore, anchor + kAfter] of the
// source; the position nearest the anchor wins (a short match there beats a
// long one elsewhere), never one whose proposal was rejected outright.
// A copy re-anchored near where it diverged is the same copy resuming: it
// starts with half the evidence it had (carried), not from its few matched
// tokens, so that after an edit (or a JSON escape the output tokenizes
// differently from its source) long drafts resume once a token of the new
// position is confirmed (auto caps a re-anchored copy's first draft), instead
// of after another kLongCopy tokens. Halving at each divergence lets a copy
// that keeps diverging lose its evidence.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <unordered_set>

namespace pyspec {

struct CopyCursor {
    static constexpr int32_t kBefore = 4;   // the re-anchor window around where the copy diverged
    static constexpr int32_t kAfter = 64;   // (an edit may insert or delete a few dozen tokens)

    int32_t at = -1;          // source position the copy predicts next; -1: no copy
    int32_t anchor = -1;      // where the copy was when it last diverged; -1: nowhere
    int32_t run = 0;          // evidence: tokens matched when it started + tokens followed since
    int32_t carried = 0;      // half the run of the copy that last diverged (given to a re-anchor near it)
    bool reanchored = false;  // it started near a divergence (not by a fresh lookup)

    void reset() { *this = CopyCursor{}; }
    // `resumes`: the position lies near the anchor (the diverged copy goes on).
    void start(int32_t pos, int32_t evidence, bool resumes) {
        at = pos;
        run = evidence + (resumes ? carried : 0);
        reanchored = resumes;
    }
    // The output's next token did (or did not) follow the source at `at`.
    void step(bool followed) {
        if (followed) {
            ++at;
            ++run;
            return;
        }
        anchor = at;
        carried = run / 2;
        at = -1;
        run = 0;
        reanchored = false;
    }

    // Whether source position c lies in the re-anchor window (a match found
    // there by a drafter's longest-suffix lookup resumes the copy too; in
    // practice only at positions find_near_anchor skipped as rejected).
    bool near_anchor(int32_t c) const {
        return anchor >= 0 && c >= 0 && c >= anchor - kBefore && c <= anchor + kAfter;
    }

    // The continuation position c near the anchor (source[c - m, c) equals the
    // output's last m tokens, c < limit), or -1; sets *m. `suffix` holds the
    // output's last `suffix_len` tokens.
    int32_t find_near_anchor(const int32_t* source, int32_t limit, const int32_t* suffix, int32_t suffix_len,
                             const std::unordered_set<int32_t>& failed, int32_t* m) const {
        if (anchor < 0) return -1;
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
