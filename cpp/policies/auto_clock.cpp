// The auto policy's clock (auto_policy.h states it): every round that ran
// alone is judged by its wall time against a plain round's, and a kind of draft
// (source x length class) that is slower with confidence is suspended, each
// time for longer. The cost model proposes; the clock has the last word.
#include "policies/auto_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policies/auto_tuning.h"

namespace pyspec {

using namespace auto_tuning;

int AutoPolicy::kind_of(int bucket, int32_t k) {
    const int source = bucket == kModelBucket ? 0 : 1;  // the draft model, or lookup (any match)
    const int cls = k <= 1 ? 0 : k <= 3 ? 1 : k <= 7 ? 2 : 3;
    return source * kLengthClasses + cls;
}

bool AutoPolicy::kind_suspended(int bucket, int32_t k) const {
    return clock_on_ && round_ < clock_[static_cast<size_t>(kind_of(bucket, k))].until;
}

bool AutoPolicy::suspended(const DraftPlan& plan, int32_t k) const { return kind_suspended(bucket_of(plan), k); }

void AutoPolicy::clock_new_generation() {
    // The clock's evidence from earlier text is a prior here: half its weight, and a
    // suspension it left is re-probed within the first few rounds.
    for (Clock& c : clock_) {
        c.n *= kClockCarry;
        c.sum *= kClockCarry;
        c.sum2 *= kClockCarry;
        c.until = std::max(0, std::min(c.until - round_, kClockCarryRounds));
    }
    round_ = 0;
}

void AutoPolicy::judge(const RoundReport& r, int bucket) {
    if (r.plan.length <= 0) {  // a plain round: the clock's yardstick
        plain_round_s_ = ema(plain_round_s_, r.round_s, kCostRate);
        return;
    }
    // Until a plain round has run alone, the model's own estimate of one.
    const double plain = plain_round_s_ > 0 ? plain_round_s_ : target_cost_estimate(1) + host_cost(1);
    if (plain <= 0) return;
    Clock& c = clock_[static_cast<size_t>(kind_of(bucket, std::max(r.drafted, 1)))];
    const double d = (r.accepted + 1) - r.round_s / plain;
    c.n += 1;
    c.sum += d;
    c.sum2 += d * d;
    if (c.n < kClockMinRounds) return;
    const double mean = c.sum / c.n;
    const double var = std::max(c.sum2 / c.n - mean * mean, kClockVarFloor);
    if (mean + kClockZ * std::sqrt(var / c.n) < 0) {
        // Slower than plain with confidence: suspended, each time for longer.
        ++suspensions_;
        c.until = round_ + 1 + c.backoff;
        c.backoff = std::min(2 * c.backoff, kMaxInterval);
    } else if (mean > 0) {
        c.backoff = kFirstInterval;
    }
}

}  // namespace pyspec
