// An online suffix automaton over a token string (Blumer et al. 1985): the
// smallest automaton that accepts every substring of the text. Each state is a
// class of substrings that end at the same set of positions (their endpos).
//
//   push(token)       appends one token: amortised O(1) (new states, transitions
//                     and clones are at most 2n, 3n and n in total), plus the
//                     occurrence update below, bounded by kWalk states.
//   advance(m, t)     streams a query: after feeding it a sequence, `m` holds the
//                     longest suffix of that sequence that occurs in the text (its
//                     state and length), amortised O(1) per token; so a lookup
//                     costs O(tokens since the last one), never a rescan.
//   best_next(m)      the continuation of the match: among the tokens that follow
//                     it in the text, the most frequent, ties to the most recent;
//                     where that token's latest occurrence is (copy from there).
//
// Occurrences: the states on the suffix-link path from the newest state are
// exactly those whose endpos gains the new position, so push() counts it there
// and records it as their latest end. The walk stops after kWalk states: on
// very repetitive text the shortest classes then keep an older (still real)
// latest end and an undercount. Nothing ever reads a position that is not a
// true occurrence, so drafts stay copies of real text either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pyspec {

class SuffixAutomaton {
public:
    // The longest suffix of a streamed query that occurs in the text.
    struct Match {
        int32_t state = 0;
        int32_t len = 0;
    };
    // What follows a match: the token, how often the match is followed by it,
    // and the position of its latest occurrence (text()[pos] == token), or pos -1.
    struct Next {
        int32_t token = -1;
        int32_t count = 0;
        int32_t pos = -1;
    };

    static constexpr int32_t kWalk = 256;

    SuffixAutomaton();

    void push(int32_t token);
    void clear();

    void advance(Match& m, int32_t token) const;
    // Tokens below 0 (document separators) are never proposed.
    Next best_next(const Match& m) const;

    const std::vector<int32_t>& text() const { return text_; }
    // Bytes held by the automaton and its text (an estimate of the heap it uses).
    size_t bytes() const;

private:
    struct State {
        int32_t len = 0;
        int32_t link = -1;
        int32_t first_edge = -1;  // this state's transitions, as a list through Edge::next
        int32_t count = 0;        // |endpos|, kept up to kWalk links deep
        int32_t last_end = -1;    // latest end position
    };
    struct Edge {
        int32_t token;
        int32_t to;
        int32_t next;
    };

    static uint64_t key(int32_t state, int32_t token) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(token);
    }
    int32_t next_state(int32_t state, int32_t token) const;
    void add_edge(int32_t from, int32_t token, int32_t to);

    std::vector<int32_t> text_;
    std::vector<State> states_;
    std::vector<Edge> edges_;
    std::unordered_map<uint64_t, int32_t> edge_of_;  // (state, token) -> index in edges_
    int32_t last_ = 0;
};

}  // namespace pyspec
