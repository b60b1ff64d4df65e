#include "engine.h"

#include <algorithm>
#include <chrono>
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
    AbortScope(const std::atomic<bool>* flag, Model& a, Model* b) : a_(a), b_(b) {
        a_.set_abort_flag(flag);
        if (b_) b_->set_abort_flag(flag);
    }
    ~AbortScope() {
        a_.set_abort_flag(nullptr);
        if (b_) b_->set_abort_flag(nullptr);
    }
    AbortScope(const AbortScope&) = delete;
    AbortScope& operator=(const AbortScope&) = delete;

private:
    Model& a_;
    Model* b_;
};

}  // namespace

Engine::Engine(Model& target, Drafter* drafter) : target_(target), drafter_(drafter) {
    if (drafter_ && drafter_->model() == &target_) {
        throw std::invalid_argument("the draft model must be a separate Model from the target (its own context)");
    }
}

void Engine::decode_verification_batch(const std::vector<int32_t>& history, const std::vector<int32_t>& drafts) {
    size_t keep = common_prefix(target_.cached(), history);
    if (keep == history.size()) --keep;  // the last committed token must be (re)evaluated
    batch_.assign(history.begin() + static_cast<std::ptrdiff_t>(keep), history.end());
    batch_.insert(batch_.end(), drafts.begin(), drafts.end());
    const int32_t n_rows = static_cast<int32_t>(drafts.size()) + 1;
    target_.decode(batch_.data(), static_cast<int32_t>(batch_.size()), static_cast<int32_t>(keep), n_rows);
}

void Engine::target_distributions(int32_t n_rows, const SamplingParams& sampling) {
    const int32_t n_vocab = target_.n_vocab();
    for (int32_t i = 0; i < n_rows; ++i) {
        try {
            compute_distribution(target_.logits(i), n_vocab, sampling, p_[static_cast<size_t>(i)], ws_);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the target model produced invalid logits: ") + e.what());
        }
    }
}

double Engine::calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler) {
    const std::vector<int32_t> sizes = policy.calibration_sizes(max_batch);
    if (sizes.empty()) return 0;
    // Time each batch size twice (the faster run counts: noise only adds time)
    // at the position the first verification batch will use, then drop it again.
    const auto t0 = Clock::now();
    std::vector<double> best(sizes.size(), -1.0);
    const int32_t pos = static_cast<int32_t>(target_.cached().size());
    for (int rep = 0; rep < 2; ++rep) {
        for (size_t i = 0; i < sizes.size(); ++i) {
            const int32_t n = sizes[i];
            if (n < 1 || pos + n > target_.n_ctx() || n > target_.n_batch()) continue;
            batch_.assign(static_cast<size_t>(n), filler);
            const auto t1 = Clock::now();
            target_.decode(batch_.data(), n, pos, n);
            const double t = since(t1);
            target_.truncate(pos);
            if (best[i] < 0 || t < best[i]) best[i] = t;
        }
    }
    policy.calibrated(sizes, best);
    return since(t0);
}

// One generation in flight: the committed sequence and what it produced.
struct Engine::Sequence {
    Sequence(const std::vector<int32_t>& prompt, const GenerateParams& params)
        : history(prompt), rng(params.seed), stream(params.stop), max_tokens(params.max_tokens) {}

    std::vector<int32_t> history;  // prompt + emitted tokens
    GenerateResult result;
    Rng rng;
    TextStream stream;
    int32_t max_tokens;
    bool done = false;
    bool callback_stopped = false;
    Clock::time_point t_start = Clock::now(), t_first{};

    GenerationStats& stats() { return result.stats; }
    int32_t generated() const { return static_cast<int32_t>(result.tokens.size()); }
};

void Engine::check(const std::vector<int32_t>& prompt, const GenerateParams& params) const {
    params.sampling.validate();
    params.draft_sampling.validate();
    if (params.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
    if (params.draft_max < 0) throw std::invalid_argument("draft_max must be >= 0");
    if (params.draft_max > 0 && !drafter_) throw std::invalid_argument("draft_max > 0 needs a drafter");
    if (params.draft_max > 0 && target_.n_batch() < 2) {
        throw std::invalid_argument("speculative decoding needs the target's n_batch >= 2 (one batch holds the "
                                    "last token and the drafts); n_batch is " + std::to_string(target_.n_batch()));
    }
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

void Engine::prefill(const std::vector<int32_t>& prompt, const GenerateParams& params, LengthPolicy* policy,
                     int32_t draft_max, GenerationStats& st) {
    const auto t0 = Clock::now();
    // The target's cache takes all of the prompt but the last token, which the
    // first round evaluates together with the first drafts. A prefix the cache
    // already holds from the previous call (a chat's earlier turns) is reused.
    const size_t reuse = std::min(common_prefix(target_.cached(), prompt), prompt.size() - 1);
    target_.truncate(static_cast<int32_t>(reuse));
    const bool use_drafter = drafter_ && draft_max > 0;
    // A policy that will not draft from the model soon spares it the prompt.
    const bool prefill_draft = !policy || policy->may_draft(DraftSource::kModel);
    std::exception_ptr drafter_error;
    std::thread drafter_prefill;
    if (use_drafter && params.parallel_prefill && prefill_draft) {
        drafter_prefill = std::thread([&] {
            try {
                drafter_->begin(prompt, params.draft_sampling, true);
            } catch (...) {
                drafter_error = std::current_exception();
            }
        });
    }
    try {
        if (prompt.size() - 1 > reuse) {
            target_.decode(prompt.data() + reuse, static_cast<int32_t>(prompt.size() - 1 - reuse),
                           static_cast<int32_t>(reuse), 0);
        }
    } catch (...) {
        if (drafter_prefill.joinable()) drafter_prefill.join();
        throw;
    }
    if (drafter_prefill.joinable()) {
        drafter_prefill.join();
        if (drafter_error) std::rethrow_exception(drafter_error);
    } else if (use_drafter) {
        drafter_->begin(prompt, params.draft_sampling, prefill_draft);
    }
    if (policy) policy->begin_generation();
    if (use_drafter && policy) {
        const int32_t room = target_.n_ctx() - static_cast<int32_t>(prompt.size()) + 1;
        st.calibrate_s = calibrate(*policy, std::min(draft_max + 1, room), prompt.back());
    }
    st.prompt_s = since(t0);
}

DraftPlan Engine::draft(Sequence& s, LengthPolicy* policy, StopRule* stop, int32_t round_max) {
    drafts_.clear();
    if (round_max <= 0) return {};
    const DraftPlan plan = drafter_->choose(s.history, [&](const DraftPlan& p) {
        return policy ? policy->next_length(round_max, p) : round_max;
    });
    const int32_t k = std::min(plan.length, round_max);
    if (stop) stop->begin_draft(k);
    if (k > 0) drafts_.resize(static_cast<size_t>(drafter_->draft(s.history, k, s.rng, drafts_, q_, stop)));
    return plan;
}

// One round of Leviathan et al.'s Algorithm 1 (and Chen et al.'s): the only place
// the algorithm lives; everything around it streams, counts and stops.
VerifyResult Engine::round(Sequence& s, const GenerateParams& params, LengthPolicy* policy, StopRule* stop,
                           int32_t round_max) {
    // 1. Draft: the drafter picks a source, the policy a length (0: a plain step),
    //    and the drafter proposes that many tokens x_i ~ q_i.
    auto t = Clock::now();
    const DraftPlan plan = draft(s, policy, stop, round_max);
    const int32_t n = static_cast<int32_t>(drafts_.size());
    const double draft_s = since(t);
    // 2. Verify: the target scores [last committed token, drafts] in one batch.
    t = Clock::now();
    decode_verification_batch(s.history, drafts_);
    const double verify_s = since(t);
    // 3. Accept draft i with probability min(1, p_i / q_i) until one fails, then
    //    draw one more token: from (p - q)+ after a rejection, from p_n if all passed.
    target_distributions(n + 1, params.sampling);
    const VerifyResult vr = verify(p_.data(), q_.data(), drafts_.data(), n, s.rng, params.variant);
    // 4. Roll back: the target's cache keeps the committed sequence and the accepted drafts.
    target_.truncate(static_cast<int32_t>(s.history.size()) + vr.n_accepted);
    const int32_t guess_hit = n == 0 && plan.next_guess >= 0 ? vr.next_token == plan.next_guess : -1;
    const RoundReport report{plan, n, vr.n_accepted, draft_s, verify_s, guess_hit};
    if (policy) policy->observe(report);
    s.stats().count_round(report);
    return vr;
}

void Engine::emit(Sequence& s, const VerifyResult& vr, const TokenCallback& on_token) {
    GenerateResult& r = s.result;
    for (int32_t i = 0; i <= vr.n_accepted && !s.done; ++i) {
        const bool drafted = i < vr.n_accepted;
        const int32_t token = drafted ? drafts_[static_cast<size_t>(i)] : vr.next_token;
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
        const bool keep_going = !on_token || on_token(token, delta, drafted);
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
    check(prompt, params);
    // Every context this call decodes with is ours until it returns.
    Model* draft_model = drafter_ && params.draft_max > 0 ? drafter_->model() : nullptr;
    std::unique_lock<std::recursive_mutex> lock_target(target_.mutex(), std::defer_lock);
    std::unique_lock<std::recursive_mutex> lock_draft;
    if (draft_model) {
        lock_draft = std::unique_lock<std::recursive_mutex>(draft_model->mutex(), std::defer_lock);
        std::lock(lock_target, lock_draft);  // both or neither: no lock-order deadlock
    } else {
        lock_target.lock();
    }
    const AbortScope abort_scope(params.cancel, target_, draft_model);

    // The verification batch must fit in one llama_decode.
    const int32_t draft_max = std::max(0, std::min(params.draft_max, target_.n_batch() - 2));
    const int32_t n_ctx = target_.n_ctx();
    p_.resize(static_cast<size_t>(draft_max) + 1);
    q_.resize(static_cast<size_t>(std::max(draft_max, 1)));

    Sequence s(prompt, params);
    GenerationStats& st = s.stats();
    st.n_prompt_tokens = static_cast<int32_t>(prompt.size());
    st.reset_tables(draft_max);
    StopRule stop_rule(policy, params.test_discard_below, st);
    StopRule* stop = stop_rule.active() ? &stop_rule : nullptr;
    s.history.reserve(static_cast<size_t>(std::min<int64_t>(
        static_cast<int64_t>(prompt.size()) + params.max_tokens, n_ctx)) + 1);
    s.result.stop_reason = "max_tokens";
    try {
        prefill(prompt, params, policy, draft_max, st);
        s.done = params.max_tokens == 0;
        while (!s.done) {
            if (params.cancel && params.cancel->load()) throw Cancelled("cancelled");
            // Room: positions up to n_ctx - 1 and at most max_tokens tokens in total.
            const int32_t room = n_ctx - static_cast<int32_t>(s.history.size());
            if (room <= 0) {
                s.result.stop_reason = "context";
                break;
            }
            const int32_t round_max = std::max(0, std::min({draft_max, room - 1, params.max_tokens - s.generated() - 1}));
            const auto t = Clock::now();
            const double timed = st.draft_s + st.verify_s;
            const VerifyResult vr = round(s, params, policy, stop, round_max);
            emit(s, vr, on_token);
            st.overhead_s += since(t) - (st.draft_s + st.verify_s - timed);
        }
    } catch (const Cancelled&) {
        // Every decode that was cut short restored its cache; keep what was committed.
        s.result.stop_reason = "cancelled";
    }
    // A stop inside a round leaves drafts past the last emitted token in the
    // cache; drop them so the cache holds exactly the committed sequence
    // (all of the prompt is then kept: a retry reuses it).
    target_.truncate(std::min(static_cast<int32_t>(s.history.size()) - 1,
                              static_cast<int32_t>(target_.cached().size())));
    const std::string tail = s.stream.finish();
    // A callback that asked to stop is not called again.
    if (!tail.empty() && on_token && !s.callback_stopped && s.result.stop_reason != "cancelled") {
        on_token(-1, tail, false);
    }
    s.result.text = s.stream.text();
    st.n_generated = s.generated();
    if (st.n_generated > 0) {
        st.decode_s = since(s.t_first);
        if (st.n_generated > 1 && st.decode_s > 0) st.decode_tok_s = (st.n_generated - 1) / st.decode_s;
    }
    return std::move(s.result);
}

}  // namespace pyspec
