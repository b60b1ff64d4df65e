// Timing the target's batch sizes for a policy that asks (policy.h,
// Calibrated): never before a sequence's first token, but between rounds, one
// size at a time, within a small share of the session's round time
// (SessionParams::calibration_share: 3 %, well inside run-to-run noise here).
// A round that uses a size not timed yet times it for free (auto_costs.cpp);
// the rest costs a filler decode each.
#include <algorithm>

#include "core/errors.h"
#include "engine/sequence.h"
#include "policies/auto_tuning.h"

namespace pyspec {

int32_t calibration_rows(int32_t draft_max, int32_t n_batch, int32_t n_seq) {
    const int64_t rows = (static_cast<int64_t>(std::max(draft_max, 0)) + 1) * std::max(n_seq, 1);
    return static_cast<int32_t>(std::min<int64_t>(n_batch, rows));
}

std::vector<int32_t> BatchSession::offer_timings(Sequence& s, Calibrated& policy) {
    const int32_t room = target_.n_ctx() - static_cast<int32_t>(s.history.size());
    // Rows its batches may reach: one draft per live sequence (not per sequence the
    // context could hold: a single answer in a context of 16 would time 64 rows).
    const int32_t live = std::max(1, n_active() + n_waiting());
    const int32_t rows = calibration_rows(s.policy->draft_max(), target_.n_batch(), live);
    std::vector<int32_t> sizes = policy.calibration_sizes(std::min(rows, room));
    // The sequences of a session share the target: a size is timed once for all.
    std::vector<int32_t> known, pending;
    std::vector<double> seconds;
    for (int32_t n : sizes) {
        const auto it = timings_.find(n);
        if (it == timings_.end()) {
            pending.push_back(n);
        } else {
            known.push_back(n);
            seconds.push_back(it->second);
        }
    }
    if (!known.empty()) policy.calibrated(known, seconds, false);
    return pending;
}

void BatchSession::calibrate_between_rounds(const std::vector<Sequence*>& active, double round_s) {
    rounds_s_ += round_s;
    if (round_s > 0 && (fastest_round_s_ <= 0 || round_s < fastest_round_s_)) fastest_round_s_ = round_s;
    if (calibrate_s_ >= session_.calibration_share * rounds_s_) return;
    for (Sequence* s : active) {
        Calibrated* c = s->done || !s->policy ? nullptr : s->policy->as_calibrated();
        if (!c) continue;
        // The smallest first (short drafts are the common ones), while the share
        // allows: one decode of n filler rows where s's next round decodes, dropped again.
        for (const int32_t n : offer_timings(*s, *c)) {
            const int32_t pos = static_cast<int32_t>(target_.cached(s->id).size());
            if (n < 1 || pos + n > target_.n_ctx() || n > target_.n_batch()) return;
            // This decode's cost by the prior, from the fastest round (~ V(1)).
            const double expected = fastest_round_s_ * (1 + auto_tuning::kPriorSlope * (n - 1));
            if (calibrate_s_ + expected > session_.calibration_share * rounds_s_) return;
            batch_.assign(static_cast<size_t>(n), s->history.back());
            const auto t0 = Clock::now();
            try {
                target_.decode(batch_.data(), n, pos, n, s->id);
            } catch (const ContextOverflowError&) {
                return;  // the shared cache is full (the decode left it as it was): time it another round
            }
            const double clock = since(t0);
            const double pin = session_.test.timing_scale;  // TEST-ONLY (engine.h)
            const double t = pin > 0 ? pin * fastest_round_s_ : clock;
            target_.truncate(pos, s->id);
            timings_[n] = t;
            c->calibrated({n}, {t}, true);
            s->stats().calibrate_s += t;
            calibrate_s_ += t;
        }
    }
}

}  // namespace pyspec
