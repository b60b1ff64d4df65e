// BatchSession's housekeeping: the models' locks, admitting sequences (checks,
// slots, the prefix cache), starting them once their prompt is in the cache,
// and what callers read between rounds.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/errors.h"
#include "engine/sequence.h"

namespace pyspec {

BatchSession::BatchSession(Engine& engine, const SessionParams& session, BatchTokenCallback on_token,
                           std::vector<Model*> draft_models, bool hold_locks, HostCache* host_cache)
    : target_(engine.target()), session_(session), on_token_(std::move(on_token)), hold_locks_(hold_locks),
      host_cache_(host_cache) {
    if (session_.prefill_chunk < 0) throw std::invalid_argument("prefill_chunk must be >= 0");
    if (!(session_.calibration_share >= 0)) {  // NaN too
        throw std::invalid_argument("calibration_share must be >= 0 (0: never time batch sizes between rounds)");
    }
    models_.push_back(&target_);
    for (Model* m : draft_models) {
        if (m == &target_) {
            throw std::invalid_argument("the draft model must be a separate Model from the target (its own context)");
        }
        if (m && std::find(models_.begin(), models_.end(), m) == models_.end()) models_.push_back(m);
    }
    std::sort(models_.begin(), models_.end());
    Locks held = lock_models();
    size_t claimed = 0;
    try {
        for (; claimed < models_.size(); ++claimed) models_[claimed]->claim(this);
    } catch (...) {
        while (claimed > 0) models_[--claimed]->unclaim(this);
        throw;
    }
    for (Model* m : models_) m->set_abort_flag(session_.cancel);
    slot_owner_.assign(static_cast<size_t>(target_.n_seq()), -1);
    slot_used_.assign(static_cast<size_t>(target_.n_seq()), 0);
    if (hold_locks_) locks_ = std::move(held);
}

BatchSession::~BatchSession() {
    Locks held = hold();
    for (Model* m : models_) {
        m->set_abort_flag(nullptr);
        m->unclaim(this);
    }
}

BatchSession::Locks BatchSession::lock_models() const {
    // One order (by address), so that sessions sharing models cannot deadlock.
    Locks locks;
    for (Model* m : models_) locks.emplace_back(m->mutex());
    return locks;
}

BatchSession::Locks BatchSession::hold() const { return hold_locks_ ? Locks{} : lock_models(); }

BatchSession::Sequence* BatchSession::find(int32_t handle) {
    for (Sequence& s : seqs_) {
        if (s.handle == handle && !s.done) return &s;
    }
    return nullptr;
}

void BatchSession::check(const SequenceSpec& spec) const {
    const SequenceParams& p = spec.params;
    p.sampling.validate();
    p.draft_sampling.validate();
    p.penalties.validate(target_.n_vocab());
    if (p.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
    if (spec.stream < 0) throw std::invalid_argument("stream must be >= 0");
    if (p.logprobs < -1) throw std::invalid_argument("logprobs must be -1 (none) or >= 0");
    // A sequence with a policy drafts; one without is plain and its drafter is not used.
    if (spec.policy && !spec.drafter) throw std::invalid_argument("a sequence with a length policy needs a drafter");
    if (spec.policy && target_.n_batch() < 2) {
        throw std::invalid_argument("speculative decoding needs the target's n_batch >= 2 (one batch holds the "
                                    "last token and the drafts); n_batch is " + std::to_string(target_.n_batch()));
    }
    if (spec.policy) {
        Model* m = spec.drafter->model();
        if (m == &target_) {
            throw std::invalid_argument("the draft model must be a separate Model from the target (its own context)");
        }
        if (m && std::find(models_.begin(), models_.end(), m) == models_.end()) {
            throw std::invalid_argument("the drafter's model was not given to the session (it must be locked)");
        }
        // Each sequence drafts in its own sequence of the draft model's context.
        if (m) {
            for (const Sequence& o : seqs_) {
                if (!o.done && o.drafter && o.drafter->model() == m &&
                    o.drafter->model_seq() == spec.drafter->model_seq()) {
                    throw std::invalid_argument("two sequences of a batch cannot draft in the same sequence (" +
                                                std::to_string(m->n_seq() > 1 ? spec.drafter->model_seq() : 0) +
                                                ") of the draft model's context: give each its own drafter "
                                                "(make_batch_drafters)");
                }
            }
        }
    }
    const std::vector<int32_t>& prompt = spec.prompt;
    if (prompt.empty()) throw std::invalid_argument("the prompt is empty (no tokens)");
    const int32_t n_prompt = static_cast<int32_t>(prompt.size());
    if (n_prompt >= target_.n_ctx()) {
        throw ContextOverflowError("prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                                   std::to_string(target_.n_ctx()) + " (raise n_ctx or shorten the prompt)");
    }
    for (int32_t t : prompt) {
        if (t < 0 || t >= target_.n_vocab()) {
            throw std::invalid_argument("prompt token " + std::to_string(t) + " is outside the vocabulary");
        }
    }
}

int32_t BatchSession::pick_slot(const std::vector<int32_t>& prompt) const {
    const Locks held = hold();
    // What taking slot j costs is what its cache holds beyond the prompt: the
    // prompt's own prefix is copied from wherever it is (adopt_prefix), so
    // choosing by the longest match alone would cut another conversation's
    // cache for the few tokens of a shared chat header.
    int32_t lossless = -1, similar = -1, lru = -1;
    size_t lossless_common = 0, similar_common = 0;
    for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
        const size_t jj = static_cast<size_t>(j);
        if (slot_owner_[jj] >= 0) continue;
        const std::vector<int32_t>& c = target_.cached(j);
        const size_t common = common_prefix(c, prompt);
        const size_t lost = c.size() - common;
        if (lost == 0 && (lossless < 0 || common > lossless_common)) {
            lossless = j;
            lossless_common = common;
        }
        // The conversation's own last turn (a retry, an answer the client cut short).
        if (common > lost && common > similar_common) {
            similar = j;
            similar_common = common;
        }
        if (lru < 0 || slot_used_[jj] < slot_used_[static_cast<size_t>(lru)]) lru = j;
    }
    if (lossless >= 0 && (similar < 0 || lossless_common >= similar_common)) return lossless;
    if (similar >= 0) return similar;
    return lossless >= 0 ? lossless : lru;
}

int32_t BatchSession::lru_cached_slot() const {
    int32_t best = -1;
    for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
        const size_t jj = static_cast<size_t>(j);
        if (slot_owner_[jj] >= 0 || target_.cached(j).empty()) continue;
        if (best < 0 || slot_used_[jj] < slot_used_[static_cast<size_t>(best)]) best = j;
    }
    return best;
}

void BatchSession::spill(int32_t slot) {
    if (!host_cache_ || target_.cached(slot).size() < HostCache::kMinTokens) return;
    // Each model's own cache of this slot (a draft model's sequence `slot`
    // mirrors the target's slot: SequenceSpec::slot).
    HostCache::Entry e;
    for (Model* m : models_) {
        if (m == &target_) {
            e.parts.insert(e.parts.begin(), {m, m->cached(slot), m->save_state(slot)});
        } else if (slot < m->n_seq() && !m->cached(slot).empty()) {
            e.parts.push_back({m, m->cached(slot), m->save_state(slot)});
        }
    }
    host_cache_->put(std::move(e));
}

void BatchSession::drop_cache(int32_t slot) {
    if (target_.cached(slot).empty()) return;
    spill(slot);
    for (Model* m : models_) {
        if (slot < m->n_seq()) m->truncate(0, slot);
    }
    ++bs_.cache_evictions;
}

void BatchSession::restore(int32_t slot, const std::vector<int32_t>& prompt) {
    if (!host_cache_) return;
    const size_t limit = prompt.size() - 1;  // the last prompt token is evaluated with the first round
    size_t have = 0;
    for (int32_t j = 0; j < target_.n_seq(); ++j) {
        have = std::max(have, common_prefix(target_.cached(j), prompt, limit));
    }
    // A restore copies the whole entry: worth it for a real part of a prompt.
    if (host_cache_->best(target_, prompt, limit) < have + HostCache::kMinTokens) return;
    const HostCache::Entry e = host_cache_->fetch(target_, prompt, limit);
    const HostCache::Part& t = e.parts[0];
    // The cells must fit beside the others: give up the least recently used
    // caches (into the host cache) until they do. Not for a state that fails
    // with room to spare (it does not fit this context): then the prompt is
    // prefilled as usual, and no other conversation is lost for it.
    while (!target_.load_state(slot, t.state, t.tokens)) {
        size_t held = 0;  // an upper bound: cells shared by several sequences count once per sequence
        for (int32_t j = 0; j < target_.n_seq(); ++j) held += target_.cached(j).size();
        const int32_t victim = lru_cached_slot();
        if (victim < 0 || held + t.tokens.size() <= static_cast<size_t>(target_.n_ctx())) return;
        drop_cache(victim);
    }
    for (size_t i = 1; i < e.parts.size(); ++i) {
        Model* m = e.parts[i].model;
        if (std::find(models_.begin(), models_.end(), m) == models_.end() || slot >= m->n_seq()) continue;
        m->truncate(0, slot);
        m->load_state(slot, e.parts[i].state, e.parts[i].tokens);  // on failure the drafter prefills it
    }
    host_cache_->note_restored(common_prefix(t.tokens, prompt, limit) - have);
}

int32_t BatchSession::add(const SequenceSpec& spec) {
    const Locks held = hold();
    check(spec);
    int32_t slot = spec.slot;
    if (slot < 0 && spec.policy && spec.drafter->model()) {
        // The target's slot follows the draft model's sequence, so that the two
        // caches hold the same conversation (a free slot only; else any).
        const int32_t d = spec.drafter->model_seq();
        if (d < target_.n_seq() && slot_owner_[static_cast<size_t>(d)] < 0) slot = d;
    }
    if (slot < 0) slot = pick_slot(spec.prompt);
    if (slot < 0) {
        throw std::length_error("all " + std::to_string(target_.n_seq()) + " sequences of the target's context are "
                                "in use (load it with a larger n_seq_max)");
    }
    if (slot >= target_.n_seq() || slot_owner_[static_cast<size_t>(slot)] >= 0) {
        throw std::invalid_argument("slot " + std::to_string(slot) + " is not a free sequence of the target's context");
    }
    // What the slot holds beyond the prompt is lost: into the host cache first.
    const size_t common = common_prefix(target_.cached(slot), spec.prompt);
    if (target_.cached(slot).size() - common >= HostCache::kMinTokens) spill(slot);
    restore(slot, spec.prompt);
    const int32_t handle = next_handle_++;
    seqs_.emplace_back(spec, session_.test, handle, slot);
    Sequence& s = seqs_.back();
    // The infill sampler reads each model's own vocabulary (a draft's may be padded larger).
    if (s.params.sampling.infill && !s.params.sampling.infill_vocab) {
        s.params.sampling.infill_vocab = target_.infill_vocab();
    }
    if (s.params.draft_sampling.infill && !s.params.draft_sampling.infill_vocab) {
        const Model* dm = s.drafter ? s.drafter->model() : nullptr;
        s.params.draft_sampling.infill_vocab = (dm ? dm : &target_)->infill_vocab();
    }
    slot_owner_[static_cast<size_t>(slot)] = handle;
    slot_used_[static_cast<size_t>(slot)] = ++tick_;
    GenerationStats& st = s.stats();
    st.n_prompt_tokens = static_cast<int32_t>(s.history.size());
    st.reset_tables(s.policy ? s.policy->draft_max() : 0);
    s.history.reserve(static_cast<size_t>(std::min<int64_t>(
        static_cast<int64_t>(s.history.size()) + s.max_tokens, target_.n_ctx())) + 1);
    s.result.stop_reason = "max_tokens";
    ++bs_.n_seq;
    // Its slot keeps at most the shared prefix (never more than all but the last
    // prompt token, which the first round evaluates with the first drafts).
    const size_t keep = std::min(common_prefix(target_.cached(slot), s.history), s.history.size() - 1);
    target_.truncate(static_cast<int32_t>(keep), slot);
    return handle;
}

void BatchSession::cancel(int32_t handle) {
    const Locks held = hold();
    if (Sequence* s = find(handle)) s->cancel_requested = true;
}

std::vector<TokenLogprobs> BatchSession::logprobs(int32_t handle, size_t start) {
    const Locks held = hold();
    const Sequence* s = find(handle);
    if (!s || start >= s->result.logprobs.size()) return {};
    return {s->result.logprobs.begin() + static_cast<std::ptrdiff_t>(start), s->result.logprobs.end()};
}

std::vector<std::pair<int32_t, GenerateResult>> BatchSession::take_finished() {
    const Locks held = hold();
    std::vector<std::pair<int32_t, GenerateResult>> out;
    out.swap(finished_);
    // Finished sequences are no longer needed (their results moved out).
    while (!seqs_.empty() && seqs_.front().done) seqs_.pop_front();
    return out;
}

void BatchSession::release_cache() {
    const Locks held = hold();
    for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
        if (slot_owner_[static_cast<size_t>(j)] < 0) drop_cache(j);
    }
}

int32_t BatchSession::free_slots() const {
    return static_cast<int32_t>(std::count(slot_owner_.begin(), slot_owner_.end(), -1));
}

int32_t BatchSession::n_active() const {
    int32_t n = 0;
    for (const Sequence& s : seqs_) n += !s.done && s.started;
    return n;
}

int32_t BatchSession::n_waiting() const {
    int32_t n = 0;
    for (const Sequence& s : seqs_) n += !s.done && !s.started;
    return n;
}

std::pair<int32_t, int32_t> BatchSession::kv_cells() const {
    int32_t running = 0, all = 0;
    for (int32_t j = 0; j < target_.n_seq(); ++j) all += static_cast<int32_t>(target_.cached(j).size());
    for (const Sequence& s : seqs_) {
        if (!s.done && s.started) running += static_cast<int32_t>(target_.cached(s.id).size());
    }
    return {running, all};
}

int32_t BatchSession::cached_slots() const {
    int32_t n = 0;
    for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
        n += slot_owner_[static_cast<size_t>(j)] < 0 && !target_.cached(j).empty();
    }
    return n;
}

BatchStats BatchSession::stats() const {
    BatchStats bs = bs_;
    if (any_token_) {
        bs.decode_s = std::chrono::duration<double>(last_token_ - first_token_).count();
        int64_t after_first = after_first_;
        for (const Sequence& s : seqs_) {
            if (!s.done) after_first += std::max(0, s.generated() - 1);
        }
        if (bs.decode_s > 0) bs.aggregate_tok_s = static_cast<double>(after_first) / bs.decode_s;
    }
    return bs;
}

void BatchSession::reuse_prefix(Sequence& s) {
    // The prompt's last token is evaluated with the first round (its logits).
    target_.adopt_prefix(s.id, s.history, s.history.size() - 1);
}

bool BatchSession::waits_for_prefix(const Sequence& s) const {
    // Worth a round's wait: a sequence ahead, still waiting itself, will hold
    // more of this prompt than this slot has, and its cells are then copied
    // instead of computed (n samples of one prompt prefill once). A short
    // shared prefix (a BOS token, a chat header) is not worth the delay.
    constexpr size_t kMinShared = 32;
    const size_t want = s.history.size() - 1;
    const size_t have = target_.cached(s.id).size();
    for (const Sequence& o : seqs_) {
        if (&o == &s) break;
        if (o.done || o.started) continue;
        const size_t c = std::min(common_prefix(o.history, s.history), want);
        if (c > have && (c == want || c - have >= kMinShared)) return true;
    }
    return false;
}

void BatchSession::start_ready() {
    for (Sequence& s : seqs_) {
        if (s.done || s.started || waits_for_prefix(s)) continue;
        reuse_prefix(s);
        if (target_.cached(s.id).size() >= s.history.size() - 1) {
            start(s);
        }
    }
}

void BatchSession::start(Sequence& s) {
    const std::vector<int32_t>& prompt = s.history;
    if (s.speculative()) {
        if (JointPlanner* planner = s.policy->as_planner()) planner->set_remaining(s.max_tokens);
        s.drafter->begin(prompt, s.params.draft_sampling);
    }
    if (s.policy) s.policy->begin_generation();
    s.stats().prompt_s = since(s.t_start);
    s.stats().n_cached_tokens = std::max(0, static_cast<int32_t>(prompt.size()) - 1 - s.prompt_decoded);
    s.stats().n_prompt_decoded = static_cast<int32_t>(prompt.size()) - s.stats().n_cached_tokens;  // the last with round 1
    bs_.cached_tokens += s.stats().n_cached_tokens;
    // What this session has timed already; the rest is timed between rounds.
    if (Calibrated* c = s.policy ? s.policy->as_calibrated() : nullptr) offer_timings(s, *c);
    s.started = true;
    // max_tokens 0 is a client's warm-up: the prompt is now cached (all but its last
    // token, which a round evaluates with the first drafts), and nothing is sampled.
    if (s.max_tokens == 0) finish(s, "max_tokens");
}

}  // namespace pyspec
