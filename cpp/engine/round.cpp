// One round (step): draft, run the target, accept, roll back, emit. Planning
// the drafts is plan.cpp's; the target decode decode.cpp's; emitting emit.cpp's.
#include <algorithm>
#include <stdexcept>
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
        target_s_ = since(t_target_);
        decode_rows_ = static_cast<int32_t>(session_.rows_.size());  // draft and prompt rows
        BatchStats& bs = session_.bs_;
        if (active.empty()) {
            bs.prompt_s += target_s_;
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
        s.report = RoundReport{s.plan, n, s.vr.n_accepted, s.draft_s, target_s_, decode_rows_, guess_hit};
        s.stats().count_round(s.report);
    }
    // After step 5. The policy hears the round with its whole wall time (drafting,
    // decode, distributions, the accept test, emitting): what the clock judges
    // choices by. Then the round's host work (sampling, emitting) is shared
    // among its sequences.
    // Returns the round's wall time.
    double close(const std::vector<Sequence*>& active) {
        const double round_s = since(t0_);
        for (Sequence* s : active) {
            s->report.round_s = round_s;
            // Forced text, and a round joined to its prompt's decode, were not its choice.
            if (s->policy && !s->report.plan.forced && !s->joined) s->policy->observe(s->report);
            s->joined = false;
        }
        if (active.empty()) return round_s;
        const double overhead = since(t0_) - (timed(active) - timed_before_) / static_cast<double>(active.size());
        for (Sequence* s : active) s->stats().overhead_s += overhead;
        return round_s;
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
    double target_s_ = 0;
    int32_t decode_rows_ = 0;
};

// One round of speculative decoding for every active sequence: Leviathan et
// al. 2023, Algorithm 1 (SpeculativeDecodingStep; Chen et al. 2023, Algorithm 2),
// batched: all sequences' drafts share one target decode. The only place
// the algorithm lives; what surrounds it counts (RoundMeter), schedules prompts
// and stops.
bool BatchSession::step() {
    const Locks held = hold();
    try {
        if (session_.cancel && session_.cancel->load()) throw Cancelled("cancelled");
        start_ready();
        std::vector<Sequence*> active = generating();
        if (active.empty() && n_waiting() == 0) return false;
        RoundMeter meter(*this, active);
        draft(active);           // 1. x_1..x_k ~ q autoregressively, k from the policy (0: a plain step);
                                 //    under a grammar: its forced text, or q masked, lookups cut (grammar.h)
        meter.target_begins();
        run_target(active);      // 2. p_1..p_{k+1} from the target, every sequence in one decode
                                 //    (under a grammar, each row masked with the state after the drafts before it)
        meter.target_ran(active);
        for (Sequence* s : active) {
            accept(*s);          // 3. accept x_i while r_i <= p_i(x_i) / q_i(x_i) (n of them), then
                                 //    t ~ norm(max(0, p_{n+1} - q_{n+1})), or t ~ p_{k+1} if all k passed
            roll_back(*s);       // 4. the cache keeps the committed tokens and accepted drafts
            meter.count(*s);
        }
        for (Sequence* s : active) emit(*s);  // 5. the accepted drafts, then t
        calibrate_between_rounds(active, meter.close(active));  // auto's batch timings, off the rounds' clock
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
    const int32_t batch_room = n_active ? target_.n_batch() / n_active - 2 : 0;
    // Text a grammar forces is the draft as it is: no drafter, no policy.
    std::vector<Sequence*> planned;
    for (Sequence* s : active) {
        if (!draft_forced(*s, round_max(*s, batch_room))) planned.push_back(s);
    }
    const bool joint = plan_jointly(planned, batch_room);  // plan.cpp
    // Plan, then draft, one sequence after the other: lookup drafters of a batch
    // read each other's texts as they plan (consensus), so planning all before
    // drafting any would change what they see. Drafts from a draft model wait
    // and are made together (one draft-model decode per position for all).
    std::vector<Sequence*> from_model;
    const int32_t others = n_active - 1;
    int32_t planned_rows = 0;  // drafts of the sequences planned so far this round
    for (Sequence* s : active) {
        if (s->plan.forced) {
            planned_rows += s->k;
            continue;
        }
        const auto t = Clock::now();
        if (!joint) {
            begin_round(*s);
            plan_alone(*s, round_max(*s, batch_room), others + planned_rows, others);
        }
        planned_rows += s->k;
        if (s->k > 0) {
            StopRule* stop = s->stop();
            if (stop) stop->begin_draft(s->k);
            if (static_cast<int32_t>(s->q.size()) < s->k) s->q.resize(static_cast<size_t>(s->k));
            if (s->drafter->model_drafter()) {
                from_model.push_back(s);
            } else {
                s->drafter->draft(s->history, s->k, s->rng, s->drafts, s->q, stop);
            }
        }
        s->draft_s = since(t);
    }
    draft_from_models(from_model);
    for (Sequence* s : active) {
        if (s->grammar) constrain_drafts(*s);
    }
}

bool BatchSession::draft_forced(Sequence& s, int32_t round_max) {
    s.plan.forced = false;
    if (!s.grammar || !s.policy) return false;  // plain decoding stays plain
    const int32_t n = s.grammar->forced(std::min(round_max, s.policy->draft_max()), s.drafts);
    if (n == 0) return false;
    s.plan = DraftPlan{};
    s.plan.forced = true;
    s.plan.length = s.k = n;
    if (static_cast<int32_t>(s.q.size()) < n) s.q.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        s.q[static_cast<size_t>(i)].set_one_hot(s.drafts[static_cast<size_t>(i)], target_.n_vocab());
    }
    s.draft_s = 0;
    return true;
}

void BatchSession::constrain_drafts(Sequence& s) {
    const auto t = Clock::now();
    GrammarState& c = *s.grammar;
    // A draft model drew under the mask and pushed its tokens as it drew them;
    // a deterministic draft is cut before its first token the grammar refuses.
    for (size_t i = static_cast<size_t>(c.pushed()); i < s.drafts.size(); ++i) {
        if (!GrammarState::allows(c.mask(static_cast<int32_t>(i)), s.drafts[i])) {
            if (s.q[i].support_size() != 1) throw std::logic_error("a sampled draft was drawn outside its grammar");
            s.drafts.resize(i);
            ++s.stats().grammar_cuts;
            break;
        }
        c.push(s.drafts[i]);
    }
    c.mask(static_cast<int32_t>(s.drafts.size()));  // the row after the last draft
    s.draft_s += since(t);
}

void BatchSession::draft_from_models(std::vector<Sequence*> seqs) {
    while (!seqs.empty()) {  // one group per draft model (a batch normally has one)
        Model* m = seqs.front()->drafter->model_drafter()->model();
        std::vector<ModelDraftJob> group;
        std::vector<Sequence*> group_seqs, rest;
        for (Sequence* s : seqs) {
            ModelDrafter* md = s->drafter->model_drafter();
            if (md->model() != m) {
                rest.push_back(s);
                continue;
            }
            group.push_back({md, &s->history, s->k, &s->rng, &s->drafts, &s->q, s->stop(), s->grammar.get(),
                             &s->params.penalties, static_cast<size_t>(s->n_prompt())});
            group_seqs.push_back(s);
        }
        const auto t = Clock::now();
        bs_.draft_decodes += draft_together(group);
        // The shared decodes' time, split among the sequences that drafted in them.
        const double share = since(t) / static_cast<double>(group.size());
        for (size_t j = 0; j < group.size(); ++j) {
            group_seqs[j]->draft_s += share;
            group_seqs[j]->stats().draft_windows += group[j].windowed;
        }
        seqs.swap(rest);
    }
}

void BatchSession::accept(Sequence& s) {
    const int32_t n = static_cast<int32_t>(s.drafts.size());
    target_distributions(s, n + 1);
    s.vr = accept_drafts(p_.data(), s.q.data(), s.drafts.data(), n, s.rng, session_.test.variant);
    if (session_.test.pit) {
        // A draft that was certain (one-hot q: a lookup's, a greedy draft's) is fixed
        // by the prefix before the row's token is drawn, and that token then follows
        // p given it: the draft may come first in the order, where a wrong residual
        // (which favours it) shows at once.
        for (int32_t i = 0; i <= s.vr.n_accepted; ++i) {
            const size_t j = static_cast<size_t>(i);
            const int32_t token = i < s.vr.n_accepted ? s.drafts[j] : s.vr.next_token;
            const int32_t first = i < n && s.q[j].support_size() == 1 ? s.drafts[j] : -1;
            s.stats().pit.push_back(p_[j].pit(token, s.pit_rng.uniform(), first));
        }
    }
}

void BatchSession::roll_back(Sequence& s) {
    target_.truncate(static_cast<int32_t>(s.history.size()) + s.vr.n_accepted, s.id);
    if (s.grammar) s.grammar->commit(s.vr.n_accepted, s.vr.next_token);
}

void BatchSession::target_distributions(const Sequence& s, int32_t n_rows) {
    std::vector<Distribution>& p = p_;
    const int32_t n_vocab = target_.n_vocab();
    GrammarState* grammar = s.grammar.get();
    const Penalties& pen = s.params.penalties;
    static const std::vector<int32_t> no_window;
    if (static_cast<int32_t>(p.size()) < n_rows) p.resize(static_cast<size_t>(n_rows));
    for (int32_t i = 0; i < n_rows; ++i) {
        RowMask mask;
        const GrammarControl control = session_.test.grammar;
        if (grammar && control != GrammarControl::kUnmasked) {  // row i under the state after drafts 0..i-1 (grammar.h)
            const int32_t state = control == GrammarControl::kStale ? 0 : i;  // TEST-ONLY: the wrong state
            mask = RowMask{grammar->mask(state), grammar->n_vocab()};
        }
        const std::vector<int32_t>* window = &no_window;
        if (pen.active()) {  // row i follows the history and drafts 0..i-1: they are its window
            const PenaltyControl wrong = session_.test.penalties;  // TEST-ONLY: a wrong window
            const size_t before = static_cast<size_t>(wrong == PenaltyControl::kStale ? 0 : i);
            const size_t first = wrong == PenaltyControl::kLastDraft && before > 1 ? before - 1 : 0;
            window = &row_.window(pen, static_cast<size_t>(s.n_prompt()), s.history, s.drafts.data(), before, first);
        }
        const float* logits = row_.adjusted(target_.logits(s.first_row + i), n_vocab, mask, &pen, *window);
        try {
            row_.distribution(logits, n_vocab, s.params.sampling, p[static_cast<size_t>(i)]);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the target model produced invalid logits: ") + e.what());
        }
    }
}

}  // namespace pyspec
