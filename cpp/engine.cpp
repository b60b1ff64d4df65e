#include "engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <stdexcept>
#include <thread>

#include "errors.h"
#include "model_drafter.h"
#include "text_stream.h"

namespace pyspec {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

// The policy as the drafter sees it: counts the drafts it ends, and in the
// test-only control mode replaces it by the forbidden discard-by-value rule.
class BatchSession::StopRule : public DraftStopRule {
public:
    StopRule(LengthPolicy* policy, double discard_below, GenerationStats& st)
        : policy_(policy), discard_below_(discard_below), st_(st) {}
    // Whether drafters need to consult (and compute beliefs for) this rule at all.
    bool active() const { return discard_below_ > 0 || (policy_ && policy_->stops_early()); }
    void begin_draft(int32_t length) { length_ = length; }
    bool stop_before(int32_t i, const Distribution& belief, int32_t known) override {
        if (discard_below_ > 0) return false;
        const bool stop = policy_ && policy_->stop_before(i, belief, known);
        st_.stops_before += stop;
        return stop;
    }
    bool stop_after(int32_t i, const Distribution& belief, int32_t token) override {
        const bool stop = discard_below_ > 0 ? belief.prob(token) < discard_below_
                                             : policy_ && policy_->stop_after(i, belief, token);
        st_.stops_after += stop && i + 1 < length_;  // only stops that shortened the draft
        return stop;
    }
    bool discards_test_only() const override { return discard_below_ > 0; }

private:
    LengthPolicy* policy_;
    double discard_below_;
    GenerationStats& st_;
    int32_t length_ = 0;
};


uint64_t sequence_seed(uint64_t seed, int32_t j) {
    if (j == 0) return seed;
    // splitmix64 of (seed, j): streams of different j are unrelated, and a
    // sequence's stream does not depend on how many others share its batch.
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(j + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

Engine::Engine(Model& target, Drafter* drafter) : target_(target), drafter_(drafter) {
    if (drafter_ && drafter_->model() == &target_) {
        throw std::invalid_argument("the draft model must be a separate Model from the target (its own context)");
    }
}

// One generation in flight: the committed sequence, what it produced, and the
// round being verified.
struct BatchSession::Sequence {
    Sequence(const SequenceSpec& spec, int32_t handle_, int32_t slot_)
        : handle(handle_), id(slot_), drafter(spec.drafter), policy(spec.policy), params(spec.params),
          history(spec.prompt),
          rng(spec.params.test_shared_stream ? spec.params.seed : sequence_seed(spec.params.seed, spec.stream)),
          stream(spec.params.stop), max_tokens(spec.params.max_tokens),
          stop_rule(spec.policy, spec.params.test_discard_below, result.stats) {}

    int32_t handle;                // what the caller knows it by
    int32_t id;                    // its slot = sequence id in the target's context
    Drafter* drafter;
    LengthPolicy* policy;
    GenerateParams params;
    std::vector<int32_t> history;  // prompt + emitted tokens
    GenerateResult result;
    Rng rng;
    TextStream stream;
    int32_t max_tokens;
    bool started = false;          // its prompt is in the cache: it generates
    bool done = false;
    bool cancel_requested = false;
    bool callback_stopped = false;
    bool prompt_begun = false;     // a chunk of its prompt was scheduled (or copied)
    Clock::time_point t_start = Clock::now(), t_first{};
    StopRule stop_rule;
    // The drafter processing the prompt on its own thread (parallel_prefill).
    std::thread drafter_prefill;
    std::exception_ptr drafter_error;

    // The round in flight.
    DraftPlan plan;
    std::vector<int32_t> drafts;
    std::vector<Distribution> q;
    double draft_s = 0;
    int32_t first_row = 0;         // its first logits row in the verification batch
    VerifyResult vr{0, -1};
    RoundReport report;            // what the round did, for its policy and statistics

    GenerationStats& stats() { return result.stats; }
    int32_t generated() const { return static_cast<int32_t>(result.tokens.size()); }
    int32_t n_prompt() const { return result.stats.n_prompt_tokens; }
    StopRule* stop() { return stop_rule.active() ? &stop_rule : nullptr; }
    bool uses_drafter(int32_t draft_max) const { return drafter && draft_max > 0; }
    void join_drafter() {
        if (drafter_prefill.joinable()) drafter_prefill.join();
    }
    // A new round: no drafts yet; the drafter picks a source and hears its
    // length from `length_for` (the policy's next_length, or a joint plan's bid).
    void start_round(int32_t round_max, const LengthFor& length_for) {
        drafts.clear();
        plan = DraftPlan{};
        if (round_max > 0 && drafter) plan = drafter->choose(history, length_for);
    }
};

BatchSession::BatchSession(Engine& engine, const GenerateParams& shared, BatchTokenCallback on_token,
                           std::vector<Model*> draft_models, bool hold_locks)
    : e_(engine), target_(engine.target_), shared_(shared), on_token_(std::move(on_token)), hold_locks_(hold_locks) {
    if (shared_.draft_max < 0) throw std::invalid_argument("draft_max must be >= 0");
    if (shared_.prefill_chunk < 0) throw std::invalid_argument("prefill_chunk must be >= 0");
    if (shared_.draft_max > 0 && target_.n_batch() < 2) {
        throw std::invalid_argument("speculative decoding needs the target's n_batch >= 2 (one batch holds the "
                                    "last token and the drafts); n_batch is " + std::to_string(target_.n_batch()));
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
    for (Model* m : models_) m->set_abort_flag(shared_.cancel);
    slot_owner_.assign(static_cast<size_t>(target_.n_seq()), -1);
    if (hold_locks_) locks_ = std::move(held);
}

BatchSession::~BatchSession() {
    Locks held = hold();
    for (Sequence& s : seqs_) s.join_drafter();
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
    const GenerateParams& p = spec.params;
    p.sampling.validate();
    p.draft_sampling.validate();
    if (p.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
    if (spec.stream < 0) throw std::invalid_argument("stream must be >= 0");
    if (p.logprobs < -1) throw std::invalid_argument("logprobs must be -1 (none) or >= 0");
    if (shared_.draft_max > 0 && !spec.drafter) throw std::invalid_argument("draft_max > 0 needs a drafter");
    if (spec.drafter && shared_.draft_max > 0) {
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
    // A free slot whose kept cells share the longest prefix with the prompt (a
    // chat's next turn finds its own); else the one keeping the fewest cells.
    int32_t best = -1;
    size_t best_common = 0, best_cached = 0;
    for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
        if (slot_owner_[static_cast<size_t>(j)] >= 0) continue;
        const std::vector<int32_t>& c = target_.cached(j);
        const size_t common = common_prefix(c, prompt);
        if (best < 0 || common > best_common || (common == best_common && c.size() < best_cached)) {
            best = j;
            best_common = common;
            best_cached = c.size();
        }
    }
    return best;
}

int32_t BatchSession::add(const SequenceSpec& spec) {
    const Locks held = hold();
    check(spec);
    const int32_t slot = pick_slot(spec.prompt);
    if (slot < 0) {
        throw std::length_error("all " + std::to_string(target_.n_seq()) + " sequences of the target's context are "
                                "in use (load it with a larger n_seq_max)");
    }
    const int32_t handle = next_handle_++;
    seqs_.emplace_back(spec, handle, slot);
    Sequence& s = seqs_.back();
    slot_owner_[static_cast<size_t>(slot)] = handle;
    GenerationStats& st = s.stats();
    st.n_prompt_tokens = static_cast<int32_t>(s.history.size());
    st.reset_tables(shared_.draft_max);
    s.history.reserve(static_cast<size_t>(std::min<int64_t>(
        static_cast<int64_t>(s.history.size()) + s.max_tokens, target_.n_ctx())) + 1);
    s.result.stop_reason = "max_tokens";
    ++bs_.n_seq;
    // Its slot keeps at most the shared prefix (never more than all but the last
    // prompt token, which the first round evaluates with the first drafts).
    target_.truncate(static_cast<int32_t>(std::min(common_prefix(target_.cached(slot), s.history),
                                                   s.history.size() - 1)), slot);
    if (s.max_tokens == 0) finish(s, "max_tokens");
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

void BatchSession::release_cache() {
    const Locks held = hold();
    for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
        if (slot_owner_[static_cast<size_t>(j)] < 0 && !target_.cached(j).empty()) target_.truncate(0, j);
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

void BatchSession::start(Sequence& s) {
    const std::vector<int32_t>& prompt = s.history;
    const int32_t draft_max = shared_.draft_max;
    if (s.drafter_prefill.joinable()) {
        s.join_drafter();
        if (s.drafter_error) std::rethrow_exception(s.drafter_error);
    } else if (s.uses_drafter(draft_max)) {
        if (s.policy) s.policy->set_remaining(s.max_tokens);
        // A policy that will not draft from the model soon spares it the prompt.
        const bool prefill_draft = !s.policy || s.policy->may_draft(DraftSource::kModel);
        s.drafter->begin(prompt, s.params.draft_sampling, prefill_draft);
    }
    if (s.policy) s.policy->begin_generation();
    s.stats().prompt_s = since(s.t_start);
    if (s.uses_drafter(draft_max) && s.policy) {
        // Alone, a round holds up to draft_max + 1 rows; in a context of several
        // sequences, up to that many per sequence (batch-aware policies use those sizes).
        const int32_t room = target_.n_ctx() - static_cast<int32_t>(prompt.size()) + 1;
        const int32_t rows = std::min(target_.n_batch(), (draft_max + 1) * target_.n_seq());
        s.stats().calibrate_s = calibrate(*s.policy, std::min(rows, room), prompt.back(), s.id);
    }
    s.started = true;
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
            s.prompt_begun = true;
            start(s);
        }
    }
}

void BatchSession::add_prompt_rows(int32_t budget) {
    for (Sequence& s : seqs_) {
        if (budget <= 0) break;
        if (s.done || s.started || waits_for_prefix(s)) continue;
        if (!s.prompt_begun) {
            s.prompt_begun = true;
            if (s.uses_drafter(shared_.draft_max) && shared_.parallel_prefill &&
                (!s.policy || s.policy->may_draft(DraftSource::kModel))) {
                Sequence* sp = &s;
                s.drafter_prefill = std::thread([sp] {
                    try {
                        sp->drafter->begin(sp->history, sp->params.draft_sampling, true);
                    } catch (...) {
                        sp->drafter_error = std::current_exception();
                    }
                });
            }
        }
        const int32_t want = static_cast<int32_t>(s.history.size()) - 1;
        int32_t pos = static_cast<int32_t>(target_.cached(s.id).size());
        const int32_t n = std::min(budget, want - pos);
        for (int32_t i = 0; i < n; ++i, ++pos) {
            e_.rows_.push_back({s.id, pos, s.history[static_cast<size_t>(pos)], false});
        }
        budget -= n;
    }
}

int32_t BatchSession::round_max(const Sequence& s, int32_t draft_cap) const {
    const int32_t room = target_.n_ctx() - static_cast<int32_t>(s.history.size());
    return std::max(0, std::min({draft_cap, room - 1, s.max_tokens - s.generated() - 1}));
}

bool BatchSession::plan_jointly(const std::vector<Sequence*>& active, int32_t draft_cap) {
    // Several sequences share the decode and every one that may draft has a
    // policy that takes an allotted length (policy.h): one of them allots the
    // free rows to the best bids. Otherwise each plans alone (draft_all).
    if (active.size() < 2) return false;
    const int32_t others = static_cast<int32_t>(active.size()) - 1;
    LengthPolicy* judge = nullptr;
    for (Sequence* s : active) {
        if (!s->drafter || round_max(*s, draft_cap) <= 0) continue;
        if (!s->policy) return false;
        s->policy->set_batch(others, others);
        if (!s->policy->plans_jointly(s->drafter->model() != nullptr)) return false;
        if (!judge) judge = s->policy;
    }
    if (!judge) return false;
    std::vector<LengthBid> bids(active.size());
    for (size_t i = 0; i < active.size(); ++i) {
        Sequence* s = active[i];
        const int32_t rm = round_max(*s, draft_cap);
        // The length choose() hears is the bid's longest, so that a drafter
        // with several sources keeps the one that bids.
        LengthPolicy* policy = s->policy;
        s->start_round(rm, [&bids, i, rm, policy](const DraftPlan& p) {
            bids[i] = policy->bid(rm, p);
            return bids[i].longest;
        });
    }
    std::vector<int32_t> k = judge->allot_lengths(bids, target_.n_batch());
    k.resize(active.size(), 0);  // (it only declines uncalibrated, which plans_jointly excluded)
    int32_t rows = 0;
    for (int32_t ki : k) rows += 1 + ki;
    for (size_t i = 0; i < active.size(); ++i) {
        Sequence* s = active[i];
        if (!s->policy || s->plan.length < 0) continue;
        s->plan.length = k[i];
        s->policy->set_batch(rows - 1 - k[i], others);
        s->policy->allotted(s->plan, k[i]);
    }
    if (rows > static_cast<int32_t>(active.size())) ++bs_.joint_rounds;
    return true;
}

void BatchSession::draft_all(const std::vector<Sequence*>& active, int32_t draft_cap) {
    // Sequences drafting from a draft model this round draft together (one
    // draft-model decode per position for all of them); the rest on their own.
    std::vector<ModelDraftJob> jobs;
    std::vector<Sequence*> job_seqs;
    const int32_t others = static_cast<int32_t>(active.size()) - 1;
    const bool joint = plan_jointly(active, draft_cap);
    int32_t planned_drafts = 0;  // drafts of the sequences planned so far this round
    for (Sequence* s : active) {
        const auto t = Clock::now();
        const int32_t rm = round_max(*s, draft_cap);
        if (!joint) {
            // Batch-aware policies weigh the decode this sequence's rows join.
            if (s->policy) {
                s->policy->set_batch(others + planned_drafts, others);
                s->policy->set_remaining(s->max_tokens - s->generated());
            }
            LengthPolicy* policy = s->policy;
            s->start_round(rm, [policy, rm](const DraftPlan& p) {
                return policy ? policy->next_length(rm, p) : rm;
            });
        }
        if (rm > 0 && s->drafter) {
            const int32_t k = std::min(s->plan.length, rm);
            planned_drafts += std::max(k, 0);
            StopRule* stop = s->stop();
            if (stop) stop->begin_draft(k);
            if (k > 0) {
                if (static_cast<int32_t>(s->q.size()) < k) s->q.resize(static_cast<size_t>(k));
                if (ModelDrafter* md = s->drafter->model_drafter()) {
                    jobs.push_back({md, &s->history, k, &s->rng, &s->drafts, &s->q, stop});
                    job_seqs.push_back(s);
                } else {
                    s->drafter->draft(s->history, k, s->rng, s->drafts, s->q, stop);
                }
            }
        }
        s->draft_s = since(t);
    }
    while (!jobs.empty()) {  // one group per draft model (a batch normally has one)
        Model* m = jobs.front().drafter->model();
        std::vector<ModelDraftJob> group, rest;
        std::vector<Sequence*> group_seqs, rest_seqs;
        for (size_t i = 0; i < jobs.size(); ++i) {
            const bool same = jobs[i].drafter->model() == m;
            (same ? group : rest).push_back(jobs[i]);
            (same ? group_seqs : rest_seqs).push_back(job_seqs[i]);
        }
        const auto t = Clock::now();
        bs_.draft_decodes += draft_together(group);
        // The shared decodes' time, split among the sequences that drafted in them.
        const double share = since(t) / static_cast<double>(group.size());
        for (Sequence* s : group_seqs) s->draft_s += share;
        jobs.swap(rest);
        job_seqs.swap(rest_seqs);
    }
}

int32_t BatchSession::add_verification_rows(const std::vector<Sequence*>& active) {
    std::vector<Model::Row>& rows = e_.rows_;
    int32_t n_logits = 0;
    for (Sequence* s : active) {
        // The cache holds the committed tokens but the last, which is (re)evaluated
        // with the drafts. (A longer uncommitted tail, which only a cache changed
        // behind the engine's back could leave, is caught up on its own first.)
        const size_t last = s->history.size() - 1;
        const size_t keep = std::min(common_prefix(target_.cached(s->id), s->history), last);
        if (keep < last) {
            target_.decode(s->history.data() + keep, static_cast<int32_t>(last - keep), static_cast<int32_t>(keep), 0,
                           s->id);
        }
        target_.truncate(static_cast<int32_t>(last), s->id);
        int32_t pos = static_cast<int32_t>(last);
        rows.push_back({s->id, pos++, s->history[last], true});
        for (int32_t t : s->drafts) rows.push_back({s->id, pos++, t, true});
        s->first_row = n_logits;
        n_logits += static_cast<int32_t>(s->drafts.size()) + 1;
    }
    return static_cast<int32_t>(rows.size());
}

void BatchSession::decode_round(std::vector<Sequence*>& active) {
    const int32_t n_batch = target_.n_batch();
    while (true) {
        e_.rows_.clear();
        const int32_t verify_rows = add_verification_rows(active);
        int32_t budget = n_batch - verify_rows;
        if (!active.empty() && shared_.prefill_chunk > 0) budget = std::min(budget, shared_.prefill_chunk);
        add_prompt_rows(budget);
        const int32_t n = static_cast<int32_t>(e_.rows_.size());
        if (n == 0) return;
        try {
            target_.decode_rows(e_.rows_.data(), n);
            bs_.prompt_rows += n - verify_rows;
            return;
        } catch (const ContextOverflowError&) {
            // The unified cache is full. Free cells in order of what they cost to
            // lose: prefix caches of finished sequences, then this round's drafts
            // and prompt rows, then the sequence holding the most cells ends
            // ("context"); its cells go back to the others.
            bool freed = false;
            for (int32_t j = 0; j < static_cast<int32_t>(slot_owner_.size()); ++j) {
                if (slot_owner_[static_cast<size_t>(j)] < 0 && !target_.cached(j).empty()) {
                    target_.truncate(0, j);
                    freed = true;
                }
            }
            if (freed) continue;
            bool had_drafts = false;
            for (Sequence* s : active) {
                had_drafts |= !s->drafts.empty();
                s->drafts.clear();
            }
            if (had_drafts) continue;
            Sequence* biggest = nullptr;
            for (Sequence* s : active) {
                if (!biggest || s->history.size() > biggest->history.size()) biggest = s;
            }
            if (!biggest) {
                // Only prompt rows, and nothing else holds cells: a waiting prompt
                // cannot fit beside the others; it ends.
                for (Sequence& s : seqs_) {
                    if (!s.done && !s.started) {
                        finish(s, "context");
                        break;
                    }
                }
                if (n_waiting() == 0) return;
                continue;
            }
            finish(*biggest, "context");
            target_.truncate(0, biggest->id);
            active.erase(std::find(active.begin(), active.end(), biggest));
        }
    }
}

void BatchSession::target_distributions(int32_t first_row, int32_t n_rows, const SamplingParams& sampling) {
    std::vector<Distribution>& p = e_.p_;
    const int32_t n_vocab = target_.n_vocab();
    if (static_cast<int32_t>(p.size()) < n_rows) p.resize(static_cast<size_t>(n_rows));
    for (int32_t i = 0; i < n_rows; ++i) {
        try {
            compute_distribution(target_.logits(first_row + i), n_vocab, sampling, p[static_cast<size_t>(i)], e_.ws_);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the target model produced invalid logits: ") + e.what());
        }
    }
}

double BatchSession::calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler, int32_t seq) {
    const std::vector<int32_t> sizes = policy.calibration_sizes(max_batch);
    if (sizes.empty()) return 0;
    // The sequences of a session share the target: its timings are measured once.
    if (std::all_of(sizes.begin(), sizes.end(), [&](int32_t n) { return timings_.count(n) > 0; })) {
        std::vector<double> known;
        for (int32_t n : sizes) known.push_back(timings_[n]);
        policy.calibrated(sizes, known);
        return 0;
    }
    // Time each batch size twice (the faster run counts: noise only adds time)
    // at the position the first verification batch will use, then drop it again.
    const auto t0 = Clock::now();
    std::vector<double> best(sizes.size(), -1.0);
    const int32_t pos = static_cast<int32_t>(target_.cached(seq).size());
    std::vector<int32_t>& batch = e_.batch_;
    for (int rep = 0; rep < 2; ++rep) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            const int32_t n = sizes[i];
            if (n < 1 || pos + n > target_.n_ctx() || n > target_.n_batch()) continue;
            batch.assign(static_cast<size_t>(n), filler);
            const auto t1 = Clock::now();
            target_.decode(batch.data(), n, pos, n, seq);
            const double t = since(t1);
            target_.truncate(pos, seq);
            if (best[i] < 0 || t < best[i]) best[i] = t;
        }
    }
    policy.calibrated(sizes, best);
    for (size_t i = 0; i < sizes.size(); ++i) {
        if (best[i] > 0) timings_[sizes[i]] = best[i];
    }
    return since(t0);
}

void BatchSession::emit(Sequence& s) {
    GenerateResult& r = s.result;
    const VerifyResult& vr = s.vr;
    for (int32_t i = 0; i <= vr.n_accepted && !s.done; ++i) {
        const bool drafted = i < vr.n_accepted;
        const int32_t token = drafted ? s.drafts[static_cast<size_t>(i)] : vr.next_token;
        if (s.params.logprobs >= 0) {
            // Row first_row + i scored the position of emitted token i (its logits
            // stay in place until the next decode).
            r.logprobs.push_back(token_logprobs(target_.logits(s.first_row + i), target_.n_vocab(), token,
                                                s.params.logprobs));
        }
        s.history.push_back(token);
        r.tokens.push_back(token);
        const auto now = Clock::now();
        if (r.tokens.size() == 1) {
            s.t_first = now;
            r.stats.ttft_s = std::chrono::duration<double>(s.t_first - s.t_start).count();
            if (!any_token_) first_token_ = now;
            any_token_ = true;
        }
        last_token_ = now;
        if (target_.is_eog(token)) {
            finish(s, "eog");
            break;
        }
        const std::string delta = s.stream.push(target_.token_to_piece(token));
        const bool keep_going = !on_token_ || on_token_(s.handle, token, delta, drafted);
        if (s.stream.stopped()) {
            finish(s, "stop");
        } else if (!keep_going) {
            s.callback_stopped = true;
            finish(s, "cancelled");
        } else if (s.generated() >= s.max_tokens) {
            finish(s, "max_tokens");
        }
    }
}

void BatchSession::finish(Sequence& s, const char* reason) {
    s.done = true;
    s.result.stop_reason = reason;
    s.join_drafter();
    // A stop inside a round leaves drafts past the last emitted token in the
    // cache; drop them so the cache holds exactly the committed sequence (all
    // of the prompt is then kept: a retry or a chat's next turn reuses it).
    target_.truncate(std::min(static_cast<int32_t>(s.history.size()) - 1,
                              static_cast<int32_t>(target_.cached(s.id).size())), s.id);
    const std::string tail = s.stream.finish();
    // A callback that asked to stop is not called again.
    if (!tail.empty() && on_token_ && !s.callback_stopped && s.result.stop_reason != "cancelled") {
        on_token_(s.handle, -1, tail, false);
    }
    s.result.text = s.stream.text();
    GenerationStats& st = s.stats();
    st.n_generated = s.generated();
    if (!s.started) st.prompt_s = since(s.t_start);
    if (st.n_generated > 0) {
        st.decode_s = since(s.t_first);
        if (st.n_generated > 1 && st.decode_s > 0) st.decode_tok_s = (st.n_generated - 1) / st.decode_s;
        bs_.n_generated += st.n_generated;
        after_first_ += st.n_generated - 1;
    }
    slot_owner_[static_cast<size_t>(s.id)] = -1;
    finished_.emplace_back(s.handle, std::move(s.result));
}

void BatchSession::cancel_all() {
    // Every decode that was cut short restored its cache; keep what was committed.
    for (Sequence& s : seqs_) {
        if (!s.done) finish(s, "cancelled");
    }
}

std::vector<std::pair<int32_t, GenerateResult>> BatchSession::take_finished() {
    const Locks held = hold();
    std::vector<std::pair<int32_t, GenerateResult>> out;
    out.swap(finished_);
    // Finished sequences are no longer needed (their results moved out).
    while (!seqs_.empty() && seqs_.front().done) seqs_.pop_front();
    return out;
}

// One round of Leviathan et al.'s Algorithm 1 (and Chen et al.'s) for every
// active sequence: the only place the algorithm lives; everything around it
// streams, counts, schedules prompts and stops.
bool BatchSession::step() {
    const Locks held = hold();
    try {
        if (shared_.cancel && shared_.cancel->load()) throw Cancelled("cancelled");
        start_ready();
        const int32_t n_ctx = target_.n_ctx();
        std::vector<Sequence*> active;
        bool waiting = false;
        for (Sequence& s : seqs_) {
            if (s.done) continue;
            if (s.cancel_requested) {
                finish(s, "cancelled");
            } else if (!s.started) {
                waiting = true;
            } else if (static_cast<int32_t>(s.history.size()) >= n_ctx) {
                finish(s, "context");  // room: positions up to n_ctx - 1
            } else {
                active.push_back(&s);
            }
        }
        if (active.empty() && !waiting) return false;
        const auto t = Clock::now();
        double timed = 0;
        for (Sequence* s : active) timed += s->stats().draft_s + s->stats().verify_s;
        // 1. Draft: per sequence, the drafter picks a source, the policy a length
        //    (0: a plain step), and the drafter proposes that many tokens x_i ~ q_i.
        //    Every sequence's rows must fit one target batch.
        const int32_t n_active = static_cast<int32_t>(active.size());
        const int32_t draft_cap = n_active ? std::min(shared_.draft_max, target_.n_batch() / n_active - 2) : 0;
        draft_all(active, draft_cap);
        // 2. Verify: the target scores every sequence's [last committed token,
        //    drafts] in one batch (plus a chunk of waiting prompts).
        const auto tv = Clock::now();
        decode_round(active);
        const double verify_s = since(tv);
        const int32_t decode_rows = static_cast<int32_t>(e_.rows_.size());  // verification and prompt rows
        if (active.empty()) {
            bs_.prompt_s += verify_s;
        } else {
            int32_t rows = 0;
            for (Sequence* s : active) rows += static_cast<int32_t>(s->drafts.size()) + 1;
            ++bs_.rounds;
            bs_.rows += rows;
            bs_.max_rows = std::max(bs_.max_rows, rows);
        }
        for (Sequence* s : active) {
            // 3. Accept draft i with probability min(1, p_i / q_i) until one fails, then
            //    draw one more token: from (p - q)+ after a rejection, from p_n if all passed.
            const int32_t n = static_cast<int32_t>(s->drafts.size());
            target_distributions(s->first_row, n + 1, s->params.sampling);
            s->vr = verify(e_.p_.data(), s->q.data(), s->drafts.data(), n, s->rng, shared_.variant);
            // 4. Roll back: the sequence's cache keeps its committed tokens and the accepted drafts.
            target_.truncate(static_cast<int32_t>(s->history.size()) + s->vr.n_accepted, s->id);
            s->report = RoundReport{s->plan, n, s->vr.n_accepted, s->draft_s, verify_s, decode_rows,
                                    n == 0 && s->plan.next_guess >= 0 ? s->vr.next_token == s->plan.next_guess : -1};
            s->stats().count_round(s->report);  // (before emit: a sequence that finishes hands its stats over)
        }
        for (Sequence* s : active) emit(*s);
        // The policy hears the round with its whole wall time (drafting, decode,
        // distributions, verification, emitting): what the clock judges choices by.
        const double round_s = since(t);
        for (Sequence* s : active) {
            s->report.round_s = round_s;
            if (s->policy) s->policy->observe(s->report);
        }
        // Host work of the round (sampling, emitting), shared among its sequences.
        if (!active.empty()) {
            double now_timed = 0;
            for (Sequence* s : active) now_timed += s->stats().draft_s + s->stats().verify_s;
            const double overhead = since(t) - (now_timed - timed) / static_cast<double>(active.size());
            for (Sequence* s : active) s->stats().overhead_s += overhead;
        }
        start_ready();
        return true;
    } catch (const Cancelled&) {
        cancel_all();
        return false;
    }
}

GenerateResult Engine::generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                                const TokenCallback& on_token, LengthPolicy* policy) {
    BatchTokenCallback cb;
    if (on_token) cb = [&](int32_t, int32_t token, const std::string& text, bool drafted) {
        return on_token(token, text, drafted);
    };
    std::vector<GenerateResult> out = generate_batch({SequenceSpec{prompt, drafter_, policy}}, params, cb);
    return std::move(out[0]);
}

std::vector<GenerateResult> Engine::generate_batch(const std::vector<SequenceSpec>& specs,
                                                   const GenerateParams& params, const BatchTokenCallback& on_token,
                                                   BatchStats* batch_stats) {
    if (specs.empty()) throw std::invalid_argument("no sequences to generate");
    const int32_t n_seq = static_cast<int32_t>(specs.size());
    if (n_seq > std::min(target_.n_seq(), target_.n_batch())) {
        throw std::invalid_argument(std::to_string(n_seq) + " sequences, but the target's context holds " +
                                    std::to_string(target_.n_seq()) + " and one batch " +
                                    std::to_string(target_.n_batch()) + " rows (load it with n_seq_max >= " +
                                    std::to_string(n_seq) + ")");
    }
    std::vector<Model*> draft_models;
    for (const SequenceSpec& spec : specs) {
        if (spec.drafter && params.draft_max > 0 && spec.drafter->model()) draft_models.push_back(spec.drafter->model());
    }
    BatchSession session(*this, params, on_token, draft_models);
    for (int32_t j = 0; j < n_seq; ++j) {
        SequenceSpec spec = specs[static_cast<size_t>(j)];
        spec.params = params;
        spec.stream = j;
        session.add(spec);
    }
    // One call uses only its own sequences: the rest give their cells back.
    session.release_cache();
    while (session.step()) {
    }
    std::vector<GenerateResult> out(specs.size());
    for (auto& [handle, result] : session.take_finished()) out[static_cast<size_t>(handle)] = std::move(result);
    if (batch_stats) *batch_stats = session.stats();
    return out;
}

}  // namespace pyspec
