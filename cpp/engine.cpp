#include "engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <stdexcept>
#include <thread>

#include "errors.h"
#include "text_stream.h"

namespace pyspec {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

// The policy as the drafter sees it: counts the drafts it ends, and in the
// test-only control mode replaces it by the forbidden discard-by-value rule.
class Engine::StopRule : public DraftStopRule {
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

namespace {

// Points the models' abort callbacks at a cancel flag for one call.
class AbortScope {
public:
    AbortScope(const std::atomic<bool>* flag, std::vector<Model*> models) : models_(std::move(models)) {
        for (Model* m : models_) m->set_abort_flag(flag);
    }
    ~AbortScope() {
        for (Model* m : models_) m->set_abort_flag(nullptr);
    }
    AbortScope(const AbortScope&) = delete;
    AbortScope& operator=(const AbortScope&) = delete;

private:
    std::vector<Model*> models_;
};

}  // namespace

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
struct Engine::Sequence {
    Sequence(const SequenceSpec& spec, int32_t id_, const GenerateParams& params)
        : id(id_), drafter(spec.drafter), policy(spec.policy), history(spec.prompt),
          rng(params.test_shared_stream ? params.seed : sequence_seed(params.seed, id_)), stream(params.stop),
          max_tokens(params.max_tokens),
          stop_rule(spec.policy, params.test_discard_below, result.stats) {}

    int32_t id;                    // index in the batch = sequence id in the target's context
    Drafter* drafter;
    LengthPolicy* policy;
    std::vector<int32_t> history;  // prompt + emitted tokens
    GenerateResult result;
    Rng rng;
    TextStream stream;
    int32_t max_tokens;
    bool done = false;
    bool callback_stopped = false;
    Clock::time_point t_start = Clock::now(), t_first{};
    StopRule stop_rule;

    // The round in flight.
    DraftPlan plan;
    std::vector<int32_t> drafts;
    std::vector<Distribution> q;
    double draft_s = 0;
    int32_t first_row = 0;         // its first logits row in the verification batch
    VerifyResult vr{0, -1};

    GenerationStats& stats() { return result.stats; }
    int32_t generated() const { return static_cast<int32_t>(result.tokens.size()); }
    StopRule* stop() { return stop_rule.active() ? &stop_rule : nullptr; }
};

int32_t Engine::decode_verification_batch(const std::vector<Sequence*>& active) {
    rows_.clear();
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
        rows_.push_back({s->id, pos++, s->history[last], true});
        for (int32_t t : s->drafts) rows_.push_back({s->id, pos++, t, true});
        s->first_row = n_logits;
        n_logits += static_cast<int32_t>(s->drafts.size()) + 1;
    }
    target_.decode_rows(rows_.data(), static_cast<int32_t>(rows_.size()));
    return static_cast<int32_t>(rows_.size());
}

void Engine::target_distributions(int32_t first_row, int32_t n_rows, const SamplingParams& sampling) {
    const int32_t n_vocab = target_.n_vocab();
    if (static_cast<int32_t>(p_.size()) < n_rows) p_.resize(static_cast<size_t>(n_rows));
    for (int32_t i = 0; i < n_rows; ++i) {
        try {
            compute_distribution(target_.logits(first_row + i), n_vocab, sampling, p_[static_cast<size_t>(i)], ws_);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the target model produced invalid logits: ") + e.what());
        }
    }
}

double Engine::calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler, int32_t seq) {
    const std::vector<int32_t> sizes = policy.calibration_sizes(max_batch);
    if (sizes.empty()) return 0;
    // Time each batch size twice (the faster run counts: noise only adds time)
    // at the position the first verification batch will use, then drop it again.
    const auto t0 = Clock::now();
    std::vector<double> best(sizes.size(), -1.0);
    const int32_t pos = static_cast<int32_t>(target_.cached(seq).size());
    for (int rep = 0; rep < 2; ++rep) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            const int32_t n = sizes[i];
            if (n < 1 || pos + n > target_.n_ctx() || n > target_.n_batch()) continue;
            batch_.assign(static_cast<size_t>(n), filler);
            const auto t1 = Clock::now();
            target_.decode(batch_.data(), n, pos, n, seq);
            const double t = since(t1);
            target_.truncate(pos, seq);
            if (best[i] < 0 || t < best[i]) best[i] = t;
        }
    }
    policy.calibrated(sizes, best);
    return since(t0);
}

void Engine::check(const std::vector<SequenceSpec>& seqs, const GenerateParams& params) const {
    params.sampling.validate();
    params.draft_sampling.validate();
    if (params.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
    if (params.draft_max < 0) throw std::invalid_argument("draft_max must be >= 0");
    if (seqs.empty()) throw std::invalid_argument("no sequences to generate");
    if (static_cast<int32_t>(seqs.size()) > std::min(target_.n_seq(), target_.n_batch())) {
        throw std::invalid_argument(std::to_string(seqs.size()) + " sequences, but the target's context holds " +
                                    std::to_string(target_.n_seq()) + " (load it with n_seq_max >= " +
                                    std::to_string(seqs.size()) + ")");
    }
    if (params.draft_max > 0 && target_.n_batch() < 2) {
        throw std::invalid_argument("speculative decoding needs the target's n_batch >= 2 (one batch holds the "
                                    "last token and the drafts); n_batch is " + std::to_string(target_.n_batch()));
    }
    for (const SequenceSpec& spec : seqs) {
        if (params.draft_max > 0 && !spec.drafter) throw std::invalid_argument("draft_max > 0 needs a drafter");
        if (spec.drafter && spec.drafter->model() == &target_) {
            throw std::invalid_argument("the draft model must be a separate Model from the target (its own context)");
        }
        // A model drafter decodes sequence 0 of its own context: one sequence at a time.
        if (seqs.size() > 1 && params.draft_max > 0 && spec.drafter->model()) {
            throw std::invalid_argument("a draft model drafts one sequence at a time (for now): use the n-gram "
                                        "drafter for batches");
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
}

void Engine::prefill(std::deque<Sequence>& seqs, const GenerateParams& params, int32_t draft_max) {
    const auto t0 = Clock::now();
    // Sequences this call does not use give their cells back (the cache is shared).
    for (int32_t j = static_cast<int32_t>(seqs.size()); j < target_.n_seq(); ++j) {
        if (!target_.cached(j).empty()) target_.truncate(0, j);
    }
    for (Sequence& s : seqs) {
        const std::vector<int32_t>& prompt = s.history;
        // The target's cache takes all of the prompt but the last token, which the
        // first round evaluates together with the first drafts. A prefix the
        // sequence already holds from the previous call (a chat's earlier turns)
        // is reused; a prompt an earlier sequence of this batch has is copied.
        size_t reuse = std::min(common_prefix(target_.cached(s.id), prompt), prompt.size() - 1);
        for (const Sequence& o : seqs) {
            if (o.id >= s.id) break;
            if (o.history.size() == prompt.size() && o.history == prompt && reuse < prompt.size() - 1) {
                target_.copy_prefix(o.id, s.id, static_cast<int32_t>(prompt.size() - 1));
                reuse = prompt.size() - 1;
                break;
            }
        }
        target_.truncate(static_cast<int32_t>(reuse), s.id);
        const bool use_drafter = s.drafter && draft_max > 0;
        // A policy that will not draft from the model soon spares it the prompt.
        const bool prefill_draft = !s.policy || s.policy->may_draft(DraftSource::kModel);
        std::exception_ptr drafter_error;
        std::thread drafter_prefill;
        if (use_drafter && params.parallel_prefill && prefill_draft) {
            drafter_prefill = std::thread([&] {
                try {
                    s.drafter->begin(prompt, params.draft_sampling, true);
                } catch (...) {
                    drafter_error = std::current_exception();
                }
            });
        }
        try {
            if (prompt.size() - 1 > reuse) {
                target_.decode(prompt.data() + reuse, static_cast<int32_t>(prompt.size() - 1 - reuse),
                               static_cast<int32_t>(reuse), 0, s.id);
            }
        } catch (...) {
            if (drafter_prefill.joinable()) drafter_prefill.join();
            throw;
        }
        if (drafter_prefill.joinable()) {
            drafter_prefill.join();
            if (drafter_error) std::rethrow_exception(drafter_error);
        } else if (use_drafter) {
            s.drafter->begin(prompt, params.draft_sampling, prefill_draft);
        }
        if (s.policy) s.policy->begin_generation();
        if (use_drafter && s.policy) {
            const int32_t room = target_.n_ctx() - static_cast<int32_t>(prompt.size()) + 1;
            s.stats().calibrate_s = calibrate(*s.policy, std::min(draft_max + 1, room), prompt.back(), s.id);
        }
    }
    const double prompt_s = since(t0);
    for (Sequence& s : seqs) s.stats().prompt_s = prompt_s;
}

DraftPlan Engine::draft(Sequence& s, int32_t round_max) {
    s.drafts.clear();
    if (round_max <= 0 || !s.drafter) return {};
    LengthPolicy* policy = s.policy;
    const DraftPlan plan = s.drafter->choose(s.history, [&](const DraftPlan& p) {
        return policy ? policy->next_length(round_max, p) : round_max;
    });
    const int32_t k = std::min(plan.length, round_max);
    StopRule* stop = s.stop();
    if (stop) stop->begin_draft(k);
    if (k > 0) {
        if (static_cast<int32_t>(s.q.size()) < k) s.q.resize(static_cast<size_t>(k));
        s.drafts.resize(static_cast<size_t>(s.drafter->draft(s.history, k, s.rng, s.drafts, s.q, stop)));
    }
    return plan;
}

// One round of Leviathan et al.'s Algorithm 1 (and Chen et al.'s) for every
// active sequence: the only place the algorithm lives; everything around it
// streams, counts and stops.
void Engine::round(std::vector<Sequence*>& active, const GenerateParams& params, int32_t draft_max,
                   BatchStats& bs) {
    // 1. Draft: per sequence, the drafter picks a source, the policy a length
    //    (0: a plain step), and the drafter proposes that many tokens x_i ~ q_i.
    for (Sequence* s : active) {
        const auto t = Clock::now();
        const int32_t room = target_.n_ctx() - static_cast<int32_t>(s->history.size());
        const int32_t round_max = std::max(0, std::min({draft_max, room - 1, s->max_tokens - s->generated() - 1}));
        s->plan = draft(*s, round_max);
        s->draft_s = since(t);
    }
    // 2. Verify: the target scores every sequence's [last committed token, drafts]
    //    in one batch.
    auto t = Clock::now();
    const int32_t rows = decode_verification_batch(active);
    const double verify_s = since(t);
    ++bs.rounds;
    bs.rows += rows;
    bs.max_rows = std::max(bs.max_rows, rows);
    for (Sequence* s : active) {
        // 3. Accept draft i with probability min(1, p_i / q_i) until one fails, then
        //    draw one more token: from (p - q)+ after a rejection, from p_n if all passed.
        const int32_t n = static_cast<int32_t>(s->drafts.size());
        target_distributions(s->first_row, n + 1, params.sampling);
        s->vr = verify(p_.data(), s->q.data(), s->drafts.data(), n, s->rng, params.variant);
        // 4. Roll back: the sequence's cache keeps its committed tokens and the accepted drafts.
        target_.truncate(static_cast<int32_t>(s->history.size()) + s->vr.n_accepted, s->id);
        const int32_t guess_hit = n == 0 && s->plan.next_guess >= 0 ? s->vr.next_token == s->plan.next_guess : -1;
        const RoundReport report{s->plan, n, s->vr.n_accepted, s->draft_s, verify_s, guess_hit};
        if (s->policy) s->policy->observe(report);
        s->stats().count_round(report);
    }
}

void Engine::emit(Sequence& s, const BatchTokenCallback& on_token) {
    GenerateResult& r = s.result;
    const VerifyResult& vr = s.vr;
    for (int32_t i = 0; i <= vr.n_accepted && !s.done; ++i) {
        const bool drafted = i < vr.n_accepted;
        const int32_t token = drafted ? s.drafts[static_cast<size_t>(i)] : vr.next_token;
        s.history.push_back(token);
        r.tokens.push_back(token);
        if (r.tokens.size() == 1) {
            s.t_first = Clock::now();
            r.stats.ttft_s = std::chrono::duration<double>(s.t_first - s.t_start).count();
        }
        if (target_.is_eog(token)) {
            r.stop_reason = "eog";
            s.done = true;
            break;
        }
        const std::string delta = s.stream.push(target_.token_to_piece(token));
        const bool keep_going = !on_token || on_token(s.id, token, delta, drafted);
        if (s.stream.stopped()) {
            r.stop_reason = "stop";
            s.done = true;
        } else if (!keep_going) {
            r.stop_reason = "cancelled";
            s.callback_stopped = s.done = true;
        } else if (s.generated() >= s.max_tokens) {
            s.done = true;
        }
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
    check(specs, params);
    // Every context this call decodes with is ours until it returns, locked in
    // one order (by address) so that engines sharing models cannot deadlock.
    std::vector<Model*> models{&target_};
    for (const SequenceSpec& spec : specs) {
        Model* m = spec.drafter && params.draft_max > 0 ? spec.drafter->model() : nullptr;
        if (m && std::find(models.begin(), models.end(), m) == models.end()) models.push_back(m);
    }
    std::sort(models.begin(), models.end());
    std::vector<std::unique_lock<std::recursive_mutex>> locks;
    for (Model* m : models) locks.emplace_back(m->mutex());
    const AbortScope abort_scope(params.cancel, models);

    // The verification batch must fit in one llama_decode.
    const int32_t n_seq = static_cast<int32_t>(specs.size());
    const int32_t draft_max = std::max(0, std::min(params.draft_max, target_.n_batch() / n_seq - 2));
    const int32_t n_ctx = target_.n_ctx();

    std::deque<Sequence> seqs;  // never moved: each sequence's stop rule points into its stats
    for (int32_t j = 0; j < n_seq; ++j) {
        seqs.emplace_back(specs[static_cast<size_t>(j)], j, params);
        Sequence& s = seqs.back();
        GenerationStats& st = s.stats();
        st.n_prompt_tokens = static_cast<int32_t>(s.history.size());
        st.reset_tables(draft_max);
        s.history.reserve(static_cast<size_t>(std::min<int64_t>(
            static_cast<int64_t>(s.history.size()) + params.max_tokens, n_ctx)) + 1);
        s.result.stop_reason = "max_tokens";
        s.done = params.max_tokens == 0;
    }
    BatchStats bs;
    bs.n_seq = n_seq;
    const auto t0 = Clock::now();
    std::vector<Sequence*> active;
    try {
        prefill(seqs, params, draft_max);
        bs.prompt_s = since(t0);
        while (true) {
            if (params.cancel && params.cancel->load()) throw Cancelled("cancelled");
            active.clear();
            for (Sequence& s : seqs) {
                // Room: positions up to n_ctx - 1 and at most max_tokens tokens in total.
                if (!s.done && static_cast<int32_t>(s.history.size()) >= n_ctx) {
                    s.result.stop_reason = "context";
                    s.done = true;
                }
                if (!s.done) active.push_back(&s);
            }
            if (active.empty()) break;
            const auto t = Clock::now();
            double timed = 0;
            for (Sequence* s : active) timed += s->stats().draft_s + s->stats().verify_s;
            round(active, params, draft_max, bs);
            for (Sequence* s : active) emit(*s, on_token);
            // Host work of the round (sampling, emitting), shared among its sequences.
            double now_timed = 0;
            for (Sequence* s : active) now_timed += s->stats().draft_s + s->stats().verify_s;
            const double overhead = (since(t) - (now_timed - timed) / static_cast<double>(active.size()));
            for (Sequence* s : active) s->stats().overhead_s += overhead;
        }
    } catch (const Cancelled&) {
        // Every decode that was cut short restored its cache; keep what was committed.
        for (Sequence& s : seqs) {
            if (!s.done) s.result.stop_reason = "cancelled";
        }
    }
    std::vector<GenerateResult> out;
    out.reserve(seqs.size());
    Clock::time_point first_token{};
    bool any_token = false;
    for (Sequence& s : seqs) {
        // A stop inside a round leaves drafts past the last emitted token in the
        // cache; drop them so the cache holds exactly the committed sequence
        // (all of the prompt is then kept: a retry reuses it).
        target_.truncate(std::min(static_cast<int32_t>(s.history.size()) - 1,
                                  static_cast<int32_t>(target_.cached(s.id).size())), s.id);
        const std::string tail = s.stream.finish();
        // A callback that asked to stop is not called again.
        if (!tail.empty() && on_token && !s.callback_stopped && s.result.stop_reason != "cancelled") {
            on_token(s.id, -1, tail, false);
        }
        s.result.text = s.stream.text();
        GenerationStats& st = s.stats();
        st.n_generated = s.generated();
        if (st.n_generated > 0) {
            st.decode_s = since(s.t_first);
            if (st.n_generated > 1 && st.decode_s > 0) st.decode_tok_s = (st.n_generated - 1) / st.decode_s;
            if (!any_token || s.t_first < first_token) first_token = s.t_first;
            any_token = true;
            bs.n_generated += st.n_generated;
        }
        out.push_back(std::move(s.result));
    }
    if (any_token) {
        bs.decode_s = since(first_token);
        int64_t after_first = 0;
        for (const GenerateResult& r : out) after_first += std::max(0, r.stats.n_generated - 1);
        if (bs.decode_s > 0) bs.aggregate_tok_s = static_cast<double>(after_first) / bs.decode_s;
    }
    if (batch_stats) *batch_stats = bs;
    return out;
}

}  // namespace pyspec
