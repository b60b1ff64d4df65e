#include "policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

namespace pyspec {

double expected_tokens(const std::vector<double>& alpha, int32_t k) {
    double total = 1.0, reach = 1.0;
    for (int32_t i = 0; i < k && i < static_cast<int32_t>(alpha.size()); ++i) {
        reach *= alpha[static_cast<size_t>(i)];
        total += reach;
    }
    return total;
}

namespace {

class FixedPolicy : public LengthPolicy {
public:
    explicit FixedPolicy(int32_t k) : k_(k) {}
    std::string name() const override { return "fixed"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(k_, k_cap); }

private:
    int32_t k_;
};

// Hugging Face's schedule: +2 after a fully accepted round, -1 otherwise, >= 1.
class HeuristicPolicy : public LengthPolicy {
public:
    explicit HeuristicPolicy(int32_t k0) : k_(std::max(k0, 1)) {}
    std::string name() const override { return "heuristic"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(k_, k_cap); }
    void observe(const RoundReport& r) override {
        if (r.drafted == 0) return;
        k_ = (r.accepted == r.drafted) ? k_ + 2 : std::max(1, k_ - 1);
        k_ = std::min(k_, 64);
    }

private:
    int32_t k_;
};

// llama.cpp's rule: stop drafting when the draft's probability of its own
// token falls below p_min; that token is not proposed.
class ConfidencePolicy : public LengthPolicy {
public:
    ConfidencePolicy(int32_t cap, double p_min) : cap_(cap), p_min_(p_min) {}
    std::string name() const override { return "confidence"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(cap_, k_cap); }
    DraftStop after_token(int32_t, const Distribution& q, int32_t token) override {
        return q.prob(token) < p_min_ ? DraftStop::kDrop : DraftStop::kContinue;
    }

private:
    int32_t cap_;
    double p_min_;
};

// SVIP: after sampling a draft token, stop when sqrt(gamma * H) > h, H the
// draft's entropy (nats) at that position; the token stays as the last one.
class SvipPolicy : public LengthPolicy {
public:
    SvipPolicy(int32_t cap, double gamma, double h) : cap_(cap), gamma_(gamma), h_(h) {}
    std::string name() const override { return "svip"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(cap_, k_cap); }
    DraftStop after_token(int32_t, const Distribution& q, int32_t) override {
        return std::sqrt(gamma_ * q.entropy()) > h_ ? DraftStop::kKeep : DraftStop::kContinue;
    }

private:
    int32_t cap_;
    double gamma_, h_;
};

// Cost-aware: pick k (0 included) maximising expected tokens per second.
//   tokens(k) = 1 + sum_{i<k} prod_{j<=i} alpha_b[j]   (acceptance per position)
//   time(k)   = k * draft_cost_b + verify(k + 1)
// b is a bucket: the draft model, or n-gram drafts by matched length (1, 2, 3,
// >= 4 tokens: longer matches are copied text and survive more often).
// alpha_b, draft_cost_b and verify(b) are running averages of what the engine
// reports. Unmeasured batch sizes are extrapolated from measured ones with the
// shape of a compute-bound CPU verify (SPEC: ~+45% per extra token); the first
// measurements replace the guess. While plain decoding wins, a short probe
// every kProbeEvery rounds keeps the estimates fresh, so the policy leaves plain
// mode when the text changes character. Draft tokens whose own probability is
// below kStopBelow end a draft (they rarely survive verification).
class AutoPolicy : public LengthPolicy {
public:
    explicit AutoPolicy(int32_t cap) : cap_(std::max(cap, 1)) {
        const double prior[kBuckets] = {0.7, 0.3, 0.5, 0.7, 0.8};
        for (int b = 0; b < kBuckets; ++b) {
            buckets_[b].alpha.assign(kMaxLen, prior[b]);
            buckets_[b].draft_cost = b == 0 ? -1.0 : 0.0;  // model: unknown until measured; n-gram: free
        }
        verify_.assign(kMaxLen + 2, -1.0);
    }
    std::string name() const override { return "auto"; }

    int32_t next_length(int32_t k_cap, const DraftPlan& plan) override {
        const int32_t cap = std::min({cap_, k_cap, kMaxLen - 1});
        if (cap <= 0) return 0;
        Bucket& s = buckets_[bucket(plan)];
        const double t1 = verify_cost(1);
        if (t1 <= 0 || s.draft_cost < 0) return std::min(cap, 2);  // measure before modelling
        int32_t best_k = 0;
        double best_rate = 1.0 / t1;
        for (int32_t k = 1; k <= cap; ++k) {
            const double rate = expected_tokens(s.alpha, k) / (k * s.draft_cost + verify_cost(k + 1));
            if (rate > best_rate * 1.0001) {
                best_rate = rate;
                best_k = k;
            }
        }
        if (best_k > 0) {
            s.plain_streak = 0;
            return best_k;
        }
        if (++s.plain_streak >= kProbeEvery) {
            s.plain_streak = 0;
            return std::min(cap, 2);
        }
        return 0;
    }

    DraftStop after_token(int32_t, const Distribution& q, int32_t token) override {
        return q.prob(token) >= kStopBelow ? DraftStop::kContinue : DraftStop::kDrop;
    }

    void observe(const RoundReport& r) override {
        // Verification cost by batch size (drafted + 1 tokens).
        const size_t b = static_cast<size_t>(std::min(r.drafted + 1, kMaxLen + 1));
        verify_[b] = verify_[b] < 0 ? r.verify_s : (1 - kRate) * verify_[b] + kRate * r.verify_s;
        if (r.drafted == 0) return;
        Bucket& s = buckets_[bucket(r.plan)];
        const double per_token = r.draft_s / r.drafted;
        s.draft_cost = s.draft_cost < 0 ? per_token : (1 - kRate) * s.draft_cost + kRate * per_token;
        // Positions reached: 0..min(accepted, drafted - 1); all but a rejected last one accepted.
        for (int32_t i = 0; i <= std::min(r.accepted, r.drafted - 1) && i < kMaxLen; ++i) {
            const double hit = i < r.accepted ? 1.0 : 0.0;
            s.alpha[static_cast<size_t>(i)] = (1 - kRate) * s.alpha[static_cast<size_t>(i)] + kRate * hit;
        }
    }

private:
    static constexpr int kBuckets = 5;
    static constexpr int32_t kMaxLen = 32;
    static constexpr int32_t kProbeEvery = 8;
    static constexpr double kRate = 0.15;
    static constexpr double kStopBelow = 0.2;

    static int bucket(const DraftPlan& plan) {
        if (plan.source == DraftSource::kModel) return 0;
        return std::min(std::max(plan.match_len, 1), 4);
    }

    double verify_cost(int32_t batch) const {
        if (verify_[static_cast<size_t>(batch)] > 0) return verify_[static_cast<size_t>(batch)];
        // Extrapolate from the nearest measured batch size (+45% per extra token).
        for (int32_t d = 1; d <= kMaxLen; ++d) {
            for (int32_t b : {batch - d, batch + d}) {
                if (b >= 1 && b <= kMaxLen + 1 && verify_[static_cast<size_t>(b)] > 0) {
                    return verify_[static_cast<size_t>(b)] * (1.0 + 0.45 * (batch - 1)) / (1.0 + 0.45 * (b - 1));
                }
            }
        }
        return -1.0;
    }

    struct Bucket {
        std::vector<double> alpha;
        double draft_cost = 0;
        int32_t plain_streak = 0;
    };
    int32_t cap_;
    std::array<Bucket, kBuckets> buckets_;
    std::vector<double> verify_;
};

}  // namespace

std::unique_ptr<LengthPolicy> make_policy(const PolicyParams& p) {
    if (p.k < 0) throw std::invalid_argument("the policy's draft length k must be >= 0");
    if (p.name == "fixed") return std::make_unique<FixedPolicy>(p.k);
    if (p.name == "heuristic") return std::make_unique<HeuristicPolicy>(p.k);
    if (p.name == "confidence") {
        if (!(p.p_min >= 0 && p.p_min <= 1)) throw std::invalid_argument("p_min must be in [0, 1]");
        return std::make_unique<ConfidencePolicy>(p.k, p.p_min);
    }
    if (p.name == "svip") {
        if (!(p.gamma > 0) || !(p.h > 0) || p.cap < 1) {
            throw std::invalid_argument("svip needs gamma > 0, h > 0 and cap >= 1");
        }
        return std::make_unique<SvipPolicy>(p.cap, p.gamma, p.h);
    }
    if (p.name == "auto") return std::make_unique<AutoPolicy>(p.k);
    throw std::invalid_argument("unknown policy '" + p.name + "' (fixed, heuristic, confidence, svip, auto)");
}

}  // namespace pyspec
