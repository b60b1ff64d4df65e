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

// The policy as the drafter sees it: counts the drafts it ends, and in the
// test-only control mode replaces it by the forbidden discard-by-value rule.
class CountingStopRule : public DraftStopRule {
public:
    CountingStopRule(LengthPolicy* policy, double discard_below, GenerationStats& st)
        : policy_(policy), discard_below_(discard_below), st_(st) {}
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
    void set_length(int32_t k) { length_ = k; }  // the length asked of this draft

private:
    LengthPolicy* policy_;
    double discard_below_;
    GenerationStats& st_;
    int32_t length_ = 0;
};

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

double Engine::calibrate(LengthPolicy& policy, int32_t max_batch, int32_t filler, const GenerateParams& params,
                         GenerationStats& st) {
    const std::vector<int32_t> sizes = policy.calibration_sizes(max_batch);
    if (sizes.empty()) return 0;
    std::vector<double> best(sizes.size(), -1.0);
    bool all_known = true;
    for (size_t i = 0; i < sizes.size(); ++i) {
        for (const auto& kv : params.known_batch_costs) {
            if (kv.first == sizes[i] && kv.second > 0) best[i] = kv.second;
        }
        all_known = all_known && best[i] > 0;
    }
    if (all_known) {
        policy.calibrated(sizes, best);
        return 0;
    }
    // Time each batch size twice (the faster run counts: noise only adds time)
    // at the position the first verification batch will use, then drop it again.
    const auto t0 = Clock::now();
    std::fill(best.begin(), best.end(), -1.0);
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
    for (size_t i = 0; i < sizes.size(); ++i) {
        if (best[i] > 0) st.calibrated.emplace_back(sizes[i], best[i]);
    }
    return since(t0);
}

GenerateResult Engine::generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                                const TokenCallback& on_token, LengthPolicy* policy) {
    params.sampling.validate();
    if (params.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
    if (params.draft_max < 0) throw std::invalid_argument("draft_max must be >= 0");
    if (params.draft_max > 0 && !drafter_) throw std::invalid_argument("draft_max > 0 needs a drafter");
    if (params.draft_max > 0 && target_.n_batch() < 2) {
        throw std::invalid_argument("speculative decoding needs the target's n_batch >= 2 (one batch holds the "
                                    "last token and the drafts); n_batch is " + std::to_string(target_.n_batch()));
    }
    if (prompt.empty()) throw std::invalid_argument("the prompt is empty (no tokens)");
    const int32_t n_prompt = static_cast<int32_t>(prompt.size());
    const int32_t n_ctx = target_.n_ctx();
    if (n_prompt >= n_ctx) {
        throw ContextOverflowError("prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                                   std::to_string(n_ctx) + " (raise n_ctx or shorten the prompt)");
    }
    for (int32_t t : prompt) {
        if (t < 0 || t >= target_.n_vocab()) {
            throw std::invalid_argument("prompt token " + std::to_string(t) + " is outside the vocabulary");
        }
    }

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
    auto cancelled = [&] { return params.cancel && params.cancel->load(); };

    // The verification batch must fit in one llama_decode.
    const int32_t k_max = std::max(0, std::min(params.draft_max, target_.n_batch() - 2));
    p_.resize(static_cast<size_t>(k_max) + 1);
    q_.resize(static_cast<size_t>(std::max(k_max, 1)));

    GenerateResult result;
    GenerationStats& st = result.stats;
    st.n_prompt_tokens = n_prompt;
    st.drafted_at.assign(static_cast<size_t>(k_max), 0);
    st.accepted_at.assign(static_cast<size_t>(k_max), 0);
    st.length_hist.assign(static_cast<size_t>(k_max) + 1, 0);
    CountingStopRule stop_rule(policy, params.test_discard_below, st);
    const bool stops_early = params.test_discard_below > 0 || (policy && policy->stops_early());
    Rng rng(params.seed);
    TextStream stream(params.stop);
    std::vector<int32_t> history(prompt);
    history.reserve(static_cast<size_t>(std::min<int64_t>(
        static_cast<int64_t>(prompt.size()) + params.max_tokens, n_ctx)) + 1);

    const auto t_start = Clock::now();
    Clock::time_point t_first{};
    result.stop_reason = "max_tokens";
    bool callback_stopped = false;
    try {
        // Prompt: the target's cache takes all of it but the last token, which the
        // first round evaluates together with the first drafts. A prefix the cache
        // already holds from the previous call (a chat's earlier turns) is reused.
        const size_t reuse = std::min(common_prefix(target_.cached(), prompt), prompt.size() - 1);
        target_.truncate(static_cast<int32_t>(reuse));
        const bool use_drafter = drafter_ && k_max > 0;
        // A policy that will not draft from the model soon spares it the prompt.
        const bool eager = !policy || policy->may_draft(DraftSource::kModel);
        std::exception_ptr drafter_error;
        std::thread drafter_prefill;
        if (use_drafter && params.parallel_prefill && eager) {
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
            drafter_->begin(prompt, params.draft_sampling, eager);
        }
        if (policy) policy->begin_generation();
        if (use_drafter && policy) {
            st.calibrate_s = calibrate(*policy, std::min(k_max + 1, n_ctx - n_prompt + 1), prompt.back(), params, st);
        }
        st.prompt_s = since(t_start);

        bool done = params.max_tokens == 0;
        while (!done) {
            if (cancelled()) throw Cancelled("cancelled");
            const int32_t generated = static_cast<int32_t>(result.tokens.size());
            // Room: positions up to n_ctx - 1 and at most max_tokens tokens in total.
            const int32_t room_ctx = n_ctx - static_cast<int32_t>(history.size());
            if (room_ctx <= 0) {
                result.stop_reason = "context";
                break;
            }
            const int32_t k_cap = std::max(0, std::min({k_max, room_ctx - 1, params.max_tokens - generated - 1}));

            // 1. Draft: the policy picks the length for the source the drafter plans to use.
            int32_t n_draft = 0;
            drafts_.clear();
            DraftPlan plan;
            double draft_time = 0;
            if (k_cap > 0) {
                const auto t0 = Clock::now();
                auto choose = [&](const DraftPlan& pl) {
                    if (pl.source == DraftSource::kNgram && pl.match_len == 0) return -1;  // nothing to propose
                    return policy ? policy->next_length(k_cap, pl) : k_cap;
                };
                plan = drafter_->plan(history);
                int32_t k = choose(plan);
                if (k <= 0 && plan.has_fallback) {
                    plan = drafter_->fallback(history);
                    k = choose(plan);
                }
                if (k == 0) ++st.policy_plain;
                if (k > 0) {
                    stop_rule.set_length(std::min(k, k_cap));
                    n_draft = drafter_->draft(history, std::min(k, k_cap), rng, drafts_, q_,
                                              stops_early ? &stop_rule : nullptr);
                }
                if (n_draft > 0 && plan.source == DraftSource::kNgram) ++st.ngram_rounds;
                draft_time = since(t0);
                st.draft_s += draft_time;
            }
            // 2. Verify: one target pass over [uncommitted tail, drafts].
            auto t0 = Clock::now();
            decode_verification_batch(history, drafts_);
            const double t_eval = since(t0);
            // 3. Accept a prefix and draw the next token.
            t0 = Clock::now();
            target_distributions(n_draft + 1, params.sampling);
            const VerifyResult vr = verify(p_.data(), q_.data(), drafts_.data(), n_draft, rng, params.variant);
            ++st.rounds;
            if (!st.length_hist.empty()) ++st.length_hist[static_cast<size_t>(n_draft)];
            if (policy) policy->observe({plan, n_draft, vr.n_accepted, draft_time, t_eval});
            st.drafted += n_draft;
            st.accepted += vr.n_accepted;
            if (n_draft > 0 && plan.source == DraftSource::kNgram) {
                st.ngram_drafted += n_draft;
                st.ngram_accepted += vr.n_accepted;
            }
            for (int32_t i = 0; i < n_draft; ++i) {
                ++st.drafted_at[static_cast<size_t>(i)];
                if (i < vr.n_accepted) ++st.accepted_at[static_cast<size_t>(i)];
            }
            // 4. Roll the target back to the accepted prefix (the drafter syncs lazily).
            target_.truncate(static_cast<int32_t>(history.size()) + vr.n_accepted);
            // Emit accepted drafts, then the new token, checking stops after each.
            for (int32_t i = 0; i <= vr.n_accepted && !done; ++i) {
                const int32_t token = i < vr.n_accepted ? drafts_[static_cast<size_t>(i)] : vr.next_token;
                history.push_back(token);
                result.tokens.push_back(token);
                if (result.tokens.size() == 1) {
                    t_first = Clock::now();
                    st.ttft_s = std::chrono::duration<double>(t_first - t_start).count();
                }
                if (target_.is_eog(token)) {
                    result.stop_reason = "eog";
                    done = true;
                    break;
                }
                const std::string delta = stream.push(target_.token_to_piece(token));
                const bool keep_going = !on_token || on_token(token, delta, i < vr.n_accepted);
                if (stream.stopped()) {
                    result.stop_reason = "stop";
                    done = true;
                } else if (!keep_going) {
                    result.stop_reason = "cancelled";
                    callback_stopped = true;
                    done = true;
                } else if (static_cast<int32_t>(result.tokens.size()) >= params.max_tokens) {
                    done = true;
                }
            }
            st.verify_s += t_eval;
            st.overhead_s += since(t0);
        }
    } catch (const Cancelled&) {
        // Every decode that was cut short restored its cache; keep what was committed.
        result.stop_reason = "cancelled";
    }
    // A stop inside a round leaves drafts past the last emitted token in the
    // cache; drop them so the cache holds exactly the committed sequence
    // (all of the prompt is then kept: a retry reuses it).
    target_.truncate(std::min(static_cast<int32_t>(history.size()) - 1,
                              static_cast<int32_t>(target_.cached().size())));
    const std::string tail = stream.finish();
    // A callback that asked to stop is not called again.
    if (!tail.empty() && on_token && !callback_stopped && result.stop_reason != "cancelled") on_token(-1, tail, false);

    result.text = stream.text();
    st.n_generated = static_cast<int32_t>(result.tokens.size());
    if (st.n_generated > 0) {
        st.decode_s = since(t_first);
        if (st.n_generated > 1 && st.decode_s > 0) st.decode_tok_s = (st.n_generated - 1) / st.decode_s;
    }
    return result;
}

}  // namespace pyspec
