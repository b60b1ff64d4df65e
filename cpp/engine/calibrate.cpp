// Timing the target's batch sizes for a policy that asks (policy.h,
// Calibrated), once per session and size.
#include <algorithm>

#include "engine/sequence.h"

namespace pyspec {

int32_t calibration_rows(int32_t draft_max, int32_t n_batch, int32_t n_seq) {
    const int64_t rows = (static_cast<int64_t>(std::max(draft_max, 0)) + 1) * std::max(n_seq, 1);
    return static_cast<int32_t>(std::min<int64_t>(n_batch, rows));
}

double BatchSession::calibrate(Calibrated& policy, int32_t max_batch, int32_t filler, int32_t seq) {
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
    // at the position the first target decode of drafts will use, then drop it again.
    const auto t0 = Clock::now();
    std::vector<double> best(sizes.size(), -1.0);
    const int32_t pos = static_cast<int32_t>(target_.cached(seq).size());
    std::vector<int32_t>& batch = batch_;
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

}  // namespace pyspec
