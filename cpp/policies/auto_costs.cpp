// The auto policy's costs (auto_policy.h states the model): V(n), the target
// decode of n rows, from calibration and every round; H(n), the host's work
// of a round; c_b, the drafters' seconds per token (learnt in observe); and
// what of them outlives a process (memory, recorded draft costs).
#include "policies/auto_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policies/auto_tuning.h"

namespace pyspec {

using namespace auto_tuning;

double AutoPolicy::verify_cost(int32_t n) const {
    if (v1_ <= 0 || n < 1 || n >= static_cast<int32_t>(ratio_.size()) || ratio_[static_cast<size_t>(n)] <= 0) {
        return -1.0;
    }
    return v1_ * ratio_[static_cast<size_t>(n)];
}

double AutoPolicy::target_cost_estimate(int32_t n) const {
    const double known = verify_cost(n);
    if (known > 0) return known;
    // Linear between the nearest measured sizes; past the last one, along the
    // line from size 1 through it; with nothing measured, the prior slope.
    int32_t lo = 1, hi = -1;
    for (int32_t m = n - 1; m > 1; --m) {
        if (ratio_[static_cast<size_t>(m)] > 0) {
            lo = m;
            break;
        }
    }
    for (int32_t m = n + 1; m < static_cast<int32_t>(ratio_.size()); ++m) {
        if (ratio_[static_cast<size_t>(m)] > 0) {
            hi = m;
            break;
        }
    }
    const double r_lo = ratio_[static_cast<size_t>(lo)];
    double r;
    if (hi > 0) {
        r = r_lo + (ratio_[static_cast<size_t>(hi)] - r_lo) * (n - lo) / static_cast<double>(hi - lo);
    } else {
        const double slope = lo > 1 ? (r_lo - 1.0) / (lo - 1) : kPriorSlope;
        r = r_lo + slope * (n - lo);
    }
    return std::max(v1_, 0.0) * r;
}

double AutoPolicy::host_cost(int32_t rows) const {
    return std::max(host_1_, 0.0) + std::max(host_row_, 0.0) * std::max(rows - 1, 0);
}

double AutoPolicy::round_cost(int32_t own_rows) const {
    const int32_t n = std::min(other_rows_ + own_rows, kMaxBatch);
    return target_cost_estimate(n) + host_cost(n);
}

double AutoPolicy::rate(const Bucket& b, double alpha, int32_t k) const {
    if (k == 0) return (other_seqs_ + 1.0) / round_cost(1);
    return (other_seqs_ + expected_tokens(alpha, k)) / (k * std::max(cost_of(b), 0.0) + round_cost(k + 1));
}

void AutoPolicy::set_batch(int32_t other_rows, int32_t other_seqs) {
    other_rows_ = std::max(other_rows, 0);
    other_seqs_ = std::max(other_seqs, 0);
}

void AutoPolicy::learn_target(const RoundReport& r, int32_t rows) {
    // A round of a size still to be calibrated is its calibration, for free.
    if (r.target_s > 0 && timed(rows) < 0 && std::find(std::begin(kCalibration), std::end(kCalibration), rows) !=
                                                 std::end(kCalibration)) {
        record_timing(rows, r.target_s, true);
    }
    if (rows == 1) {
        const bool first = v1_ <= 0;
        v1_ = ema(v1_, r.target_s, kCostRate);
        if (first) fill_ratios();  // timings on record that waited for v1
    } else if (v1_ > 0 && rows < static_cast<int32_t>(ratio_.size())) {
        ratio_[static_cast<size_t>(rows)] = ema(ratio_[static_cast<size_t>(rows)], r.target_s / v1_, kCostRate);
    }
}

void AutoPolicy::learn_host(const RoundReport& r, int32_t rows) {
    const double host = std::max(r.round_s - r.draft_s - r.target_s, 0.0);
    if (rows == 1) {
        host_1_ = ema(host_1_, host, kCostRate);
    } else if (host_1_ >= 0) {
        host_row_ = ema(host_row_, std::max(host - host_1_, 0.0) / (rows - 1), kCostRate);
    }
}

std::vector<int32_t> AutoPolicy::calibration_sizes(int32_t max_batch) {
    grid_max_ = max_batch;
    std::vector<int32_t> out;
    for (int32_t n : kCalibration) {
        if (n <= max_batch && timed(n) < 0) out.push_back(n);
    }
    return out;
}

bool AutoPolicy::candidate(int32_t n) const {
    if (verify_cost(n) > 0) return true;
    // A calibration size not timed yet: judged by its estimate until a round or
    // the engine's calibration between rounds times it (the first answer does not
    // wait for a calibration).
    return n <= grid_max_ && timed(n) < 0 &&
           std::find(std::begin(kCalibration), std::end(kCalibration), n) != std::end(kCalibration);
}

double AutoPolicy::timed(int32_t n) const {
    for (const auto& [size, s] : calibration_) {
        if (size == n) return s;
    }
    return -1.0;
}

void AutoPolicy::record_timing(int32_t n, double seconds, bool fresh) {
    auto it = std::find_if(calibration_.begin(), calibration_.end(), [n](const auto& e) { return e.first == n; });
    if (it != calibration_.end()) it->second = seconds;
    else calibration_.emplace_back(n, seconds);
    std::sort(calibration_.begin(), calibration_.end());
    // Only what this process measured is new to keep; a record (or a pin) replaces it.
    const auto f = std::find(fresh_.begin(), fresh_.end(), n);
    if (fresh && f == fresh_.end()) fresh_.push_back(n);
    if (!fresh && f != fresh_.end()) fresh_.erase(f);
}

void AutoPolicy::calibrated(const std::vector<int32_t>& sizes, const std::vector<double>& seconds, bool fresh) {
    for (size_t i = 0; i < sizes.size() && i < seconds.size(); ++i) {
        if (sizes[i] > 0 && seconds[i] > 0) record_timing(sizes[i], seconds[i], fresh);
        if (sizes[i] == 1 && seconds[i] > 0) v1_ = seconds[i];
    }
    if (v1_ <= 0) return;  // the ratios wait for a plain step (learn_target)
    fill_ratios();
    for (size_t i = 0; i < sizes.size() && i < seconds.size(); ++i) {  // a new timing replaces an estimate
        const int32_t n = sizes[i];
        if (n > 1 && n < static_cast<int32_t>(ratio_.size()) && seconds[i] > 0) {
            ratio_[static_cast<size_t>(n)] = seconds[i] / v1_;
        }
    }
}

void AutoPolicy::fill_ratios() {
    for (const auto& [n, s] : calibration_) {
        if (n > 1 && n < static_cast<int32_t>(ratio_.size()) && ratio_[static_cast<size_t>(n)] <= 0) {
            ratio_[static_cast<size_t>(n)] = s / v1_;
        }
    }
}

std::vector<std::pair<int32_t, double>> AutoPolicy::take_new_timings() {
    std::vector<std::pair<int32_t, double>> out;
    for (int32_t n : fresh_) out.emplace_back(n, timed(n));
    fresh_.clear();
    return out;
}

std::vector<double> AutoPolicy::memory() const {
    std::vector<double> out;
    for (int b = 1; b < kBuckets; ++b) out.push_back(buckets_[static_cast<size_t>(b)].long_run);
    out.push_back(host_1_);
    out.push_back(host_row_);
    return out;
}

void AutoPolicy::remember(const std::vector<double>& m) {
    if (rounds_seen_ > 0 || m.size() != static_cast<size_t>(kBuckets + 1)) return;  // its own evidence wins
    for (int b = 1; b < kBuckets; ++b) {
        const double a = m[static_cast<size_t>(b - 1)];
        if (std::isfinite(a) && a >= 0 && a <= 1) buckets_[static_cast<size_t>(b)].long_run = a;
    }
    const double h1 = m[kBuckets - 1], hrow = m[kBuckets];
    if (std::isfinite(h1) && h1 >= 0) host_1_ = h1;
    if (std::isfinite(hrow) && hrow >= 0) host_row_ = hrow;
}

double AutoPolicy::draft_cost(DraftSource source) const {
    DraftPlan plan;
    plan.source = source;
    plan.match_len = 1;  // every n-gram bucket shares one lookup cost; report the first
    return buckets_[static_cast<size_t>(bucket_of(plan))].cost;
}

void AutoPolicy::recorded_draft_cost(double seconds) {
    Bucket& b = buckets_[kModelBucket];
    if (b.cost < 0 && seconds > 0 && std::isfinite(seconds)) b.cost = seconds;
}

void AutoPolicy::draft_cost_prior(double steps) {
    if (steps > 0 && std::isfinite(steps)) draft_prior_ = steps;
}

double AutoPolicy::cost_of(const Bucket& b) const {
    if (b.cost >= 0) return b.cost;
    const bool model = &b == &buckets_[kModelBucket];
    return model && draft_prior_ > 0 && v1_ > 0 ? draft_prior_ * v1_ : -1.0;
}

}  // namespace pyspec
