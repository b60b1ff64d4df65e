// One round (step): draft, run the target, accept, roll back, emit.
#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.h"
#include "drafters/model_drafter.h"
#include "engine/sequence.h"

namespace pyspec {

// Counting and timing of one round, kept out of the algorithm: the batch's
// figures, each sequence's RoundReport (its statistics, and what its policy
// hears), the round's wall time and the host time shared among its sequences.
class BatchSession::RoundMeter {
public:
    RoundMeter(BatchSession& session, const std::vector<Sequence*>& active)
        : session_(session), t0_(Clock::now()), timed_before_(timed(active)) {}

    void target_begins() { t_target_ = Clock::now(); }
    void target_ran(const std::vector<Sequence*>& active) {
        verify_s_ = since(t_target_);
        decode_rows_ = static_cast<int32_t>(session_.rows_.size());  // verification and prompt rows
        BatchStats& bs = session_.bs_;
        if (active.empty()) {
            bs.prompt_s += verify_s_;
            return;
        }
        int32_t rows = 0;
        for (Sequence* s : active) rows += static_cast<int32_t>(s->drafts.size()) + 1;
        ++bs.rounds;
        bs.rows += rows;
        bs.max_rows = std::max(bs.max_rows, rows);
    }
    // After step 4 (before emit: a sequence that finishes hands its stats over).
    void count(Sequence& s) {
        const int32_t n = static_cast<int32_t>(s.drafts.size());
        const int32_t guess_hit = n == 0 && s.plan.next_guess >= 0 ? s.vr.next_token == s.plan.next_guess : -1;
        s.report = RoundReport{s.plan, n, s.vr.n_accepted, s.draft_s, verify_s_, decode_rows_, guess_hit};
        s.stats().count_round(s.report);
    }
    // After step 5. The policy hears the round with its whole wall time (drafting,
    // decode, distributions, verification, emitting): what the clock judges
    // choices by. Then the round's host work (sampling, emitting) is shared
    // among its sequences.
    void close(const std::vector<Sequence*>& active) {
        const double round_s = since(t0_);
        for (Sequence* s : active) {
            s->report.round_s = round_s;
            if (s->policy) s->policy->observe(s->report);
        }
        if (active.empty()) return;
        const double overhead = since(t0_) - (timed(active) - timed_before_) / static_cast<double>(active.size());
        for (Sequence* s : active) s->stats().overhead_s += overhead;
    }

private:
    // Drafter and target seconds the sequences have counted so far.
    static double timed(const std::vector<Sequence*>& active) {
        double t = 0;
        for (Sequence* s : active) t += s->stats().draft_s + s->stats().verify_s;
        return t;
    }

    BatchSession& session_;
    Clock::time_point t0_, t_target_{};
    double timed_before_;
    double verify_s_ = 0;
    int32_t decode_rows_ = 0;
};

// One round of speculative decoding for every active sequence: Leviathan et
// al. 2023, Algorithm 1 (SpeculativeDecodingStep; Chen et al. 2023, Algorithm 2),
// batched: all sequences' verifications share one target decode. The only place
// the algorithm lives; what surrounds it counts (RoundMeter), schedules prompts
// and stops.
bool BatchSession::step() {
    const Locks held = hold();
    try {
        if (shared_.cancel && shared_.cancel->load()) throw Cancelled("cancelled");
        start_ready();
        std::vector<Sequence*> active = generating();
        if (active.empty() && n_waiting() == 0) return false;
        RoundMeter meter(*this, active);
        draft(active);           // 1. x_1..x_k ~ q autoregressively, k from the policy (0: a plain step)
        meter.target_begins();
        run_target(active);      // 2. p_1..p_{k+1} from the target, every sequence in one decode
        meter.target_ran(active);
        for (Sequence* s : active) {
            accept(*s);          // 3. accept x_i while r_i <= p_i(x_i) / q_i(x_i) (n of them), then
                                 //    t ~ norm(max(0, p_{n+1} - q_{n+1})), or t ~ p_{k+1} if all k passed
            roll_back(*s);       // 4. the cache keeps the committed tokens and accepted drafts
            meter.count(*s);
        }
        for (Sequence* s : active) emit(*s);  // 5. the accepted drafts, then t
        meter.close(active);
        start_ready();
        return true;
    } catch (const Cancelled&) {
        cancel_all();
        return false;
    }
}

std::vector<BatchSession::Sequence*> BatchSession::generating() {
    std::vector<Sequence*> active;
    const int32_t n_ctx = target_.n_ctx();
    for (Sequence& s : seqs_) {
        if (s.done) continue;
        if (s.cancel_requested) {
            finish(s, "cancelled");
        } else if (!s.started) {
            continue;  // waiting for its prompt
        } else if (static_cast<int32_t>(s.history.size()) >= n_ctx) {
            finish(s, "context");  // room: positions up to n_ctx - 1
        } else {
            active.push_back(&s);
        }
    }
    return active;
}

void BatchSession::draft(const std::vector<Sequence*>& active) {
    // Every sequence's rows must fit one target batch.
    const int32_t n_active = static_cast<int32_t>(active.size());
    const int32_t draft_cap = n_active ? std::min(shared_.draft_max, target_.n_batch() / n_active - 2) : 0;
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
            const int32_t k = std::min({s->plan.length, rm, s->draft_max});
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

int32_t BatchSession::round_max(const Sequence& s, int32_t draft_cap) const {
    const int32_t room = target_.n_ctx() - static_cast<int32_t>(s.history.size());
    return std::max(0, std::min({draft_cap, room - 1, s.max_tokens - s.generated() - 1}));
}

void BatchSession::accept(Sequence& s) {
    const int32_t n = static_cast<int32_t>(s.drafts.size());
    target_distributions(s.first_row, n + 1, s.params.sampling);
    s.vr = verify(p_.data(), s.q.data(), s.drafts.data(), n, s.rng, shared_.test.variant);
}

void BatchSession::roll_back(Sequence& s) {
    target_.truncate(static_cast<int32_t>(s.history.size()) + s.vr.n_accepted, s.id);
}

void BatchSession::target_distributions(int32_t first_row, int32_t n_rows, const SamplingParams& sampling) {
    std::vector<Distribution>& p = p_;
    const int32_t n_vocab = target_.n_vocab();
    if (static_cast<int32_t>(p.size()) < n_rows) p.resize(static_cast<size_t>(n_rows));
    for (int32_t i = 0; i < n_rows; ++i) {
        try {
            compute_distribution(target_.logits(first_row + i), n_vocab, sampling, p[static_cast<size_t>(i)], ws_);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the target model produced invalid logits: ") + e.what());
        }
    }
}

}  // namespace pyspec
