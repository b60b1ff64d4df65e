#include "drafters/suffix_automaton.h"

namespace pyspec {

SuffixAutomaton::SuffixAutomaton() { clear(); }

void SuffixAutomaton::clear() {
    text_.clear();
    states_.assign(1, State{});  // the root: the empty string
    edges_.clear();
    edge_of_.clear();
    last_ = 0;
}

int32_t SuffixAutomaton::next_state(int32_t state, int32_t token) const {
    const auto it = edge_of_.find(key(state, token));
    return it == edge_of_.end() ? -1 : edges_[static_cast<size_t>(it->second)].to;
}

void SuffixAutomaton::add_edge(int32_t from, int32_t token, int32_t to) {
    const auto [it, added] = edge_of_.emplace(key(from, token), static_cast<int32_t>(edges_.size()));
    if (!added) {  // redirect an existing transition (a clone takes it over)
        edges_[static_cast<size_t>(it->second)].to = to;
        return;
    }
    State& s = states_[static_cast<size_t>(from)];
    edges_.push_back(Edge{token, to, s.first_edge});
    s.first_edge = it->second;
}

void SuffixAutomaton::push(int32_t token) {
    const int32_t pos = static_cast<int32_t>(text_.size());
    text_.push_back(token);
    const int32_t cur = static_cast<int32_t>(states_.size());
    states_.push_back(State{states_[static_cast<size_t>(last_)].len + 1, -1, -1, 0, pos});
    int32_t p = last_;
    while (p >= 0 && next_state(p, token) < 0) {
        add_edge(p, token, cur);
        p = states_[static_cast<size_t>(p)].link;
    }
    if (p < 0) {
        states_[static_cast<size_t>(cur)].link = 0;
    } else {
        const int32_t q = next_state(p, token);
        if (states_[static_cast<size_t>(p)].len + 1 == states_[static_cast<size_t>(q)].len) {
            states_[static_cast<size_t>(cur)].link = q;
        } else {
            // q holds strings of several lengths, only the shorter of which now
            // also end here: split them off into a clone with q's transitions.
            const int32_t clone = static_cast<int32_t>(states_.size());
            State c = states_[static_cast<size_t>(q)];
            c.len = states_[static_cast<size_t>(p)].len + 1;
            c.first_edge = -1;
            states_.push_back(c);
            for (int32_t e = states_[static_cast<size_t>(q)].first_edge; e >= 0; e = edges_[static_cast<size_t>(e)].next) {
                const Edge edge = edges_[static_cast<size_t>(e)];
                add_edge(clone, edge.token, edge.to);
            }
            while (p >= 0 && next_state(p, token) == q) {
                add_edge(p, token, clone);
                p = states_[static_cast<size_t>(p)].link;
            }
            states_[static_cast<size_t>(q)].link = clone;
            states_[static_cast<size_t>(cur)].link = clone;
        }
    }
    last_ = cur;
    // The suffix-link path from cur: the classes whose endpos gains `pos`.
    int32_t walked = 0;
    for (int32_t v = cur; v > 0 && walked < kWalk; v = states_[static_cast<size_t>(v)].link, ++walked) {
        State& s = states_[static_cast<size_t>(v)];
        ++s.count;
        s.last_end = pos;
    }
}

void SuffixAutomaton::advance(Match& m, int32_t token) const {
    // Text appended since the last call may have split m's state (a clone took
    // its shorter strings): move to the class that now holds length m.len.
    while (m.state > 0 && m.len <= states_[static_cast<size_t>(states_[static_cast<size_t>(m.state)].link)].len) {
        m.state = states_[static_cast<size_t>(m.state)].link;
    }
    while (true) {
        const int32_t to = next_state(m.state, token);
        if (to >= 0) {
            m.state = to;
            ++m.len;
            return;
        }
        if (m.state == 0) {
            m.len = 0;
            return;
        }
        m.state = states_[static_cast<size_t>(m.state)].link;
        m.len = states_[static_cast<size_t>(m.state)].len;
    }
}

SuffixAutomaton::Next SuffixAutomaton::best_next(const Match& m) const {
    Next best;
    if (m.len == 0) return best;  // nothing matched: the root's children are every token
    for (int32_t e = states_[static_cast<size_t>(m.state)].first_edge; e >= 0; e = edges_[static_cast<size_t>(e)].next) {
        const Edge& edge = edges_[static_cast<size_t>(e)];
        if (edge.token < 0) continue;
        const State& to = states_[static_cast<size_t>(edge.to)];
        if (to.count > best.count || (to.count == best.count && to.last_end > best.pos)) {
            best = Next{edge.token, to.count, to.last_end};
        }
    }
    return best;
}

size_t SuffixAutomaton::bytes() const {
    // A node of the hash map: key, value, next pointer and the cached hash, plus its bucket.
    constexpr size_t kMapEntry = sizeof(uint64_t) + sizeof(int32_t) + 2 * sizeof(void*) + sizeof(void*);
    return text_.capacity() * sizeof(int32_t) + states_.capacity() * sizeof(State) +
           edges_.capacity() * sizeof(Edge) + edge_of_.size() * kMapEntry + edge_of_.bucket_count() * sizeof(void*);
}

}  // namespace pyspec
