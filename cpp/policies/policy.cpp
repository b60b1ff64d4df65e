#include "policies/policy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "policies/auto_policy.h"

namespace pyspec {

double expected_tokens(const std::vector<double>& alpha, int32_t k) {
    double total = 1.0, reach = 1.0;
    for (int32_t i = 0; i < k && i < static_cast<int32_t>(alpha.size()); ++i) {
        reach *= alpha[static_cast<size_t>(i)];
        total += reach;
    }
    return total;
}

double expected_tokens(double alpha, int32_t k) {
    return expected_tokens(std::vector<double>(static_cast<size_t>(std::max(k, 0)), alpha), k);
}

const std::vector<PolicyInfo>& policy_catalog() {
    static const std::vector<PolicyInfo> catalog = {
        {"fixed", 4, "always draft_max tokens"},
        {"heuristic", 16, "+2 after a fully accepted round, -1 otherwise (Hugging Face)"},
        {"confidence", 16, "stop before a token whose top draft probability is < p_min (llama.cpp)"},
        {"svip", 40, "stop after a token when sqrt(gamma * H) > h, H the draft's entropy (SVIP)"},
        {"auto", kMaxDraft, "cost-aware: the length (0 = plain step) with the most expected tokens per second"},
    };
    return catalog;
}

namespace {

class FixedPolicy : public LengthPolicy {
public:
    explicit FixedPolicy(int32_t k) : k_(k) {}
    std::string name() const override { return "fixed"; }
    int32_t draft_max() const override { return k_; }
    int32_t next_length(int32_t round_max, const DraftPlan&) override { return std::min(k_, round_max); }

private:
    int32_t k_;
};

// Hugging Face's schedule: +2 after a fully accepted round, -1 otherwise, >= 1;
// it starts at 4 (or draft_max, if smaller) and never exceeds draft_max.
class HeuristicPolicy : public LengthPolicy {
public:
    explicit HeuristicPolicy(int32_t draft_max) : draft_max_(std::max(draft_max, 1)), k_(std::min(4, draft_max_)) {}
    std::string name() const override { return "heuristic"; }
    int32_t draft_max() const override { return draft_max_; }
    int32_t next_length(int32_t round_max, const DraftPlan&) override { return std::min(k_, round_max); }
    void observe(const RoundReport& r) override {
        if (r.drafted == 0) return;
        k_ = (r.accepted == r.drafted) ? std::min(k_ + 2, draft_max_) : std::max(1, k_ - 1);
    }

private:
    int32_t draft_max_, k_;
};

// llama.cpp's p_min, made lossless: stop before position i when the draft's
// most likely token there has probability < p_min. For a greedy draft that token
// is the one it would propose, so this is llama.cpp's rule exactly; a sampling
// draft is judged on q_i alone, before its token is drawn (drafter.h).
class ConfidencePolicy : public LengthPolicy {
public:
    ConfidencePolicy(int32_t draft_max, double p_min) : draft_max_(draft_max), p_min_(p_min) {}
    std::string name() const override { return "confidence"; }
    int32_t draft_max() const override { return draft_max_; }
    int32_t next_length(int32_t round_max, const DraftPlan&) override { return std::min(draft_max_, round_max); }
    bool stops_early() const override { return true; }
    bool stop_before(int32_t, const Distribution& belief, int32_t) override {
        return belief.prob(belief.argmax()) < p_min_;
    }

private:
    int32_t draft_max_;
    double p_min_;
};

// SVIP: after sampling a draft token, stop when sqrt(gamma * H) > h, H the
// draft's entropy (nats) at that position; the token stays as the last one
// (H is known before the draw, so keeping or not would both be lossless).
class SvipPolicy : public LengthPolicy {
public:
    SvipPolicy(int32_t draft_max, double gamma, double h) : draft_max_(draft_max), gamma_(gamma), h_(h) {}
    std::string name() const override { return "svip"; }
    int32_t draft_max() const override { return draft_max_; }
    int32_t next_length(int32_t round_max, const DraftPlan&) override { return std::min(draft_max_, round_max); }
    bool stops_early() const override { return true; }
    bool stop_after(int32_t, const Distribution& belief, int32_t) override {
        return std::sqrt(gamma_ * belief.entropy()) > h_;
    }

private:
    int32_t draft_max_;
    double gamma_, h_;
};

}  // namespace

std::unique_ptr<LengthPolicy> make_policy(const PolicyParams& p) {
    const PolicyInfo* info = nullptr;
    std::string names;
    for (const PolicyInfo& i : policy_catalog()) {
        if (p.name == i.name) info = &i;
        names += (names.empty() ? "" : ", ") + std::string(i.name);
    }
    if (!info) throw std::invalid_argument("unknown policy '" + p.name + "'; choose from " + names);
    // The one place the user's cap is resolved: unset is the policy's default.
    const int32_t k = p.draft_max.value_or(info->default_draft_max);
    if (k < 0 || k > kMaxDraft) {
        throw std::invalid_argument("draft_max must be in [0, " + std::to_string(kMaxDraft) + "], got " +
                                    std::to_string(k));
    }
    if (p.name == "fixed") return std::make_unique<FixedPolicy>(k);
    if (p.name == "heuristic") return std::make_unique<HeuristicPolicy>(k);
    if (p.name == "confidence") {
        if (!(p.p_min >= 0 && p.p_min <= 1)) throw std::invalid_argument("p_min must be in [0, 1]");
        return std::make_unique<ConfidencePolicy>(k, p.p_min);
    }
    if (p.name == "svip") {
        if (!(p.gamma > 0) || !(p.h > 0) || k < 1) {
            throw std::invalid_argument("svip needs gamma > 0, h > 0 and draft_max >= 1");
        }
        return std::make_unique<SvipPolicy>(k, p.gamma, p.h);
    }
    return std::make_unique<AutoPolicy>(k);
}

}  // namespace pyspec
