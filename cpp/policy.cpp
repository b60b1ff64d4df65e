#include "policy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "auto_policy.h"

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

// Hugging Face's schedule: +2 after a fully accepted round, -1 otherwise, >= 1;
// it starts at 4 (or the cap, if smaller) and never exceeds the cap.
class HeuristicPolicy : public LengthPolicy {
public:
    explicit HeuristicPolicy(int32_t cap) : cap_(std::max(cap, 1)), k_(std::min(4, cap_)) {}
    std::string name() const override { return "heuristic"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(k_, k_cap); }
    void observe(const RoundReport& r) override {
        if (r.drafted == 0) return;
        k_ = (r.accepted == r.drafted) ? std::min(k_ + 2, cap_) : std::max(1, k_ - 1);
    }

private:
    int32_t cap_, k_;
};

// llama.cpp's p_min, made lossless: stop before position i when the draft's
// most likely token there has probability < p_min. For a greedy draft that token
// is the one it would propose, so this is llama.cpp's rule exactly; a sampling
// draft is judged on q_i alone, before its token is drawn (drafter.h).
class ConfidencePolicy : public LengthPolicy {
public:
    ConfidencePolicy(int32_t cap, double p_min) : cap_(cap), p_min_(p_min) {}
    std::string name() const override { return "confidence"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(cap_, k_cap); }
    bool stops_early() const override { return true; }
    bool stop_before(int32_t, const Distribution& belief, int32_t) override {
        return belief.prob(belief.argmax()) < p_min_;
    }

private:
    int32_t cap_;
    double p_min_;
};

// SVIP: after sampling a draft token, stop when sqrt(gamma * H) > h, H the
// draft's entropy (nats) at that position; the token stays as the last one
// (H is known before the draw, so keeping or not would both be lossless).
class SvipPolicy : public LengthPolicy {
public:
    SvipPolicy(int32_t cap, double gamma, double h) : cap_(cap), gamma_(gamma), h_(h) {}
    std::string name() const override { return "svip"; }
    int32_t next_length(int32_t k_cap, const DraftPlan&) override { return std::min(cap_, k_cap); }
    bool stops_early() const override { return true; }
    bool stop_after(int32_t, const Distribution& belief, int32_t) override {
        return std::sqrt(gamma_ * belief.entropy()) > h_;
    }

private:
    int32_t cap_;
    double gamma_, h_;
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
