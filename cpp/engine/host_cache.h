// The prompt cache's host-memory tier (its tiers: the context's slots, this,
// and files on disk, pyspec/prefix.py; docs/server.md#prompt-cache).
// Conversations that no slot of the context holds any more, kept in host memory
// and put back into a slot when a request continues one: llama-server's "extra
// slots" (--cache-ram), with a byte bound the user sets and counters the user
// can see. An entry holds each model's cache of one sequence (llama.cpp's
// per-sequence state) with the tokens it covers: the target's and the draft
// model's together, so a restored conversation prefills on neither.
//
// Thread-safe: the session that owns the models fills and empties it between
// rounds; stats() may be read from any thread (a server's /metrics).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pyspec {

class Model;

class HostCache {
public:
    // One model's cache of one sequence.
    struct Part {
        Model* model = nullptr;
        std::vector<int32_t> tokens;  // what its cells hold, by position
        std::string state;            // Model::save_state
    };
    // parts[0] is the target's.
    struct Entry {
        std::vector<Part> parts;
        size_t bytes() const;
    };
    struct Stats {
        int64_t saved = 0;            // entries stored (a slot's cache evicted into host memory)
        int64_t restored = 0;         // entries put back into a slot
        int64_t restored_tokens = 0;  // prompt tokens those restores spared the target
        int64_t evicted = 0;          // entries dropped, least recently used first, to stay in the bound
        int64_t entries = 0;
        int64_t bytes = 0;
        int64_t capacity = 0;
    };

    // Entries shorter than this many target tokens are not worth a copy.
    static constexpr size_t kMinTokens = 64;

    explicit HostCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

    // Keep an entry (it replaces any entry whose target tokens it extends or
    // equals); older entries go to stay within the bound. False when the entry
    // alone is larger than the bound, or too short to keep.
    bool put(Entry entry);
    // How many of `prompt`'s tokens (at most `limit`) the best entry for `target`
    // covers; fetch() with the same arguments returns a copy of that entry and
    // makes it the most recently used. Entries stay: a conversation that goes
    // another way from a restored one (a shared system prompt, a retried turn)
    // leaves the original for the next.
    size_t best(const Model& target, const std::vector<int32_t>& prompt, size_t limit) const;
    Entry fetch(const Model& target, const std::vector<int32_t>& prompt, size_t limit);
    void note_restored(size_t tokens);
    void clear();
    // A copy of every entry, most recently stored first (to write them to disk).
    std::vector<Entry> entries() const;
    Stats stats() const;

private:
    std::list<Entry>::iterator find_best(const Model& target, const std::vector<int32_t>& prompt, size_t limit,
                                         size_t* common);  // lock held
    std::list<Entry>::const_iterator find_best(const Model& target, const std::vector<int32_t>& prompt, size_t limit,
                                               size_t* common) const {
        return const_cast<HostCache*>(this)->find_best(target, prompt, limit, common);
    }

    mutable std::mutex mutex_;
    size_t capacity_;
    size_t bytes_ = 0;
    std::list<Entry> entries_;  // most recently stored or fetched first
    Stats stats_;
};

}  // namespace pyspec
