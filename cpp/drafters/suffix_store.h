// Memory: a bounded store of earlier texts (documents: a request's prompt and
// answer, a Python Model's earlier calls, a CLI --memory file) that suffix
// drafters look up, indexed by one suffix automaton over all of them.
//
//   * Documents are joined by a separator token (-1), which no query contains:
//     a match never spans two documents, and a copy stops at a document's end.
//   * The byte cap is kept by evicting the least recently used documents (used:
//     added, or copied from by a draft) until the store is at 3/4 of its cap,
//     and rebuilding the automaton over the rest; rebuilding costs O(what is
//     kept), so appends stay amortised O(1). Positions move on a rebuild: the
//     epoch changes, and drafters drop what they held.
//   * Many drafters read it at once (a shared lock) while the server adds a
//     finished request's text (an exclusive one).
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "drafters/suffix_automaton.h"

namespace pyspec {

class SuffixStore {
public:
    static constexpr int32_t kSeparator = -1;

    explicit SuffixStore(size_t cap_bytes);

    // Adds one document (empty ones are ignored); a document larger than the
    // cap keeps its end. Evicts as above.
    void add(const std::vector<int32_t>& tokens);
    void clear();

    size_t cap_bytes() const { return cap_; }
    size_t bytes() const;
    int64_t n_tokens() const;
    int32_t n_documents() const;
    uint64_t epoch() const;
    // The documents, least recently used first (what save/load round-trip).
    std::vector<std::vector<int32_t>> documents() const;

    // For drafters: hold read() while using automaton() and the positions it gives.
    std::shared_lock<std::shared_mutex> read() const { return std::shared_lock<std::shared_mutex>(mutex_); }
    const SuffixAutomaton& automaton() const { return sam_; }
    uint64_t epoch_locked() const { return epoch_; }
    // A draft copied from the document holding text position `pos` (under read()).
    void touch(int32_t pos) const;

private:
    struct Document {
        int32_t start;             // position of its first token in the automaton's text
        int32_t size;
        mutable int64_t used;      // tick of its last use (LRU)
    };
    size_t bytes_locked() const;
    void append_locked(const std::vector<int32_t>& tokens, int64_t used);
    void evict_locked();

    size_t cap_;
    mutable std::shared_mutex mutex_;
    mutable std::mutex touch_mutex_;  // use ticks change under a shared lock
    SuffixAutomaton sam_;
    std::vector<Document> docs_;      // in text order
    mutable int64_t tick_ = 0;
    uint64_t epoch_ = 0;
};

}  // namespace pyspec
