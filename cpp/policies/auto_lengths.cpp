// The auto policy's lengths (auto_policy.h states the model): the acceptance
// of each draft source, the length each round drafts (alone, or allotted with
// the batch), re-planning within a model draft, and what a round teaches.
// Its costs are in auto_costs.cpp, its clock in auto_clock.cpp.
#include "policies/auto_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policies/auto_tuning.h"

namespace pyspec {

using namespace auto_tuning;

AutoPolicy::AutoPolicy(int32_t draft_max) : draft_max_(std::min(std::max(draft_max, 1), kMaxDraft)) {
    // Starting acceptance per bucket (model; n-gram match 1, 2, 3, 4-7, 8-11, >= 12;
    // re-anchored copy), replaced by measurements within a few rounds.
    const double prior[kBuckets] = {0.7, 0.25, 0.45, 0.55, 0.7, 0.8, 0.9, 0.6};
    for (int b = 0; b < kBuckets; ++b) {
        buckets_[static_cast<size_t>(b)].long_run = prior[b];
        buckets_[static_cast<size_t>(b)].cost = b == kModelBucket ? -1.0 : 0.0;  // a lookup is free until measured
    }
    ratio_.assign(kMaxBatch + 1, -1.0);
    ratio_[1] = 1.0;
    conf_acc_ = {0.05, 0.2, 0.4, 0.6, 0.8, 0.95};  // bin midpoints: belief taken at face value
}

int AutoPolicy::bucket_of(const DraftPlan& plan) {
    if (plan.source == DraftSource::kModel) return kModelBucket;
    const int32_t m = plan.match_len;
    if (plan.near_copy && m < 12) return kNearCopyBucket;
    if (m <= 3) return std::max(m, 1);
    return m < 8 ? 4 : m < 12 ? 5 : 6;
}

int AutoPolicy::conf_bin(double c) {
    return c < 0.1 ? 0 : c < 0.3 ? 1 : c < 0.5 ? 2 : c < 0.7 ? 3 : c < 0.9 ? 4 : 5;
}

bool AutoPolicy::plans_jointly(bool model) const {
    // v1 known, and no draft model that could pay: its draft length is
    // decided during the draft (stop_before/stop_after), not before it.
    return v1_ > 0 && (!model || !could_pay(buckets_[kModelBucket]));
}

int32_t AutoPolicy::longest_for(int32_t round_max, const DraftPlan& plan) const {
    // A match found this round has not shown that the copy goes on: a long
    // prompt match (a schema, a signature) often stops after a few tokens, and
    // a failed 15-token draft costs ~5 steps on a CPU. Its first draft stays
    // short; once a token of it is confirmed, the copy may draft long.
    // Only a long copy drafts past kShortCap: verifying 64 rows costs ~3x 16 on a CPU,
    // which only text known to repeat pays back (long_copy_alpha).
    const bool lookup = plan.source == DraftSource::kNgram;
    const int32_t cap = lookup && plan.fresh                  ? kFreshCap
                        : lookup && plan.match_len >= kLongCopy ? kMaxDraft
                                                                : kShortCap;
    return std::max(0, std::min({draft_max_, round_max, cap}));
}

double AutoPolicy::lookup_alpha(const Bucket& b, const DraftPlan& plan) {
    // A copy followed for r tokens without a miss continues with probability
    // (r + 1) / (r + 2) by the rule of succession; the bucket's per-position
    // average, discounted for recency, cannot see a 200-token run. Long drafts
    // then pay only after ~100 followed tokens (E(63) / V(64) > E(15) / V(16)).
    const double a = b.alpha_low();
    if (plan.match_len < kLongCopy) return a;
    const double r = plan.match_len;
    return std::max(a, (r + 1) / (r + 2));
}

LengthBid AutoPolicy::bid(int32_t round_max, const DraftPlan& plan) const {
    const Bucket& b = buckets_[static_cast<size_t>(bucket_of(plan))];
    LengthBid out;
    if (plan.source == DraftSource::kModel && could_pay(b)) return out;  // plans_jointly said no
    out.alpha = plan.source == DraftSource::kModel ? 0.0 : lookup_alpha(b, plan);
    out.cost = std::max(b.cost, 0.0);
    out.longest = out.alpha > 0 ? longest_for(round_max, plan) : 0;
    return out;
}

std::vector<int32_t> AutoPolicy::allot_lengths(const std::vector<LengthBid>& bids, int32_t max_rows) const {
    if (v1_ <= 0 || bids.empty()) return {};
    // Every drafted token's worth, largest first; each sequence's come in order
    // (alpha^j falls with j), ties to the earlier sequence.
    struct Gain {
        double value;
        size_t seq;
    };
    std::vector<Gain> gains;
    for (size_t i = 0; i < bids.size(); ++i) {
        double g = 1.0;
        for (int32_t j = 0; j < bids[i].longest; ++j) gains.push_back({g *= bids[i].alpha, i});
    }
    std::stable_sort(gains.begin(), gains.end(), [](const Gain& a, const Gain& b) { return a.value > b.value; });
    const int32_t n = static_cast<int32_t>(bids.size());
    const int32_t top = std::min(max_rows, kMaxBatch);
    double best = n / (target_cost_estimate(std::min(n, kMaxBatch)) + host_cost(std::min(n, kMaxBatch)));
    size_t best_m = 0;
    double tokens = n, drafting = 0;
    for (size_t m = 1; m <= gains.size() && n + static_cast<int32_t>(m) <= top; ++m) {
        tokens += gains[m - 1].value;
        drafting += bids[gains[m - 1].seq].cost;
        const int32_t rows = n + static_cast<int32_t>(m);
        if (!candidate(rows)) continue;  // measured sizes (or ones to time): CPU batch costs are jagged
        const double v = target_cost_estimate(rows) + host_cost(rows);
        const double r = tokens / (drafting + v);
        if (r > best * kTieMargin) {
            best = r;
            best_m = m;
        }
    }
    std::vector<int32_t> k(bids.size(), 0);
    for (size_t m = 0; m < best_m; ++m) ++k[gains[m].seq];
    return k;
}

AutoPolicy::Bucket& AutoPolicy::plan_round(const DraftPlan& plan) {
    planned_bucket_ = bucket_of(plan);
    planned_k_ = 0;
    beliefs_.clear();
    reach_.clear();
    return buckets_[static_cast<size_t>(planned_bucket_)];
}

int32_t AutoPolicy::drafting_won(Bucket& b, int32_t k) {
    b.plain_streak = 0;
    b.interval = kFirstInterval;
    b.probing = false;
    return planned_k_ = k;
}

void AutoPolicy::allotted(const DraftPlan& plan, int32_t k) {
    Bucket& b = plan_round(plan);
    if (k > 0) drafting_won(b, k);
    b.probing = false;  // lookups are judged on their guesses; no probes here
}

void AutoPolicy::begin_generation() {
    for (Bucket& b : buckets_) b.accepted = b.tried = 0;
    clock_new_generation();
}

bool AutoPolicy::could_pay(const Bucket& b) const {
    if (cost_of(b) < 0 || v1_ <= 0) return true;  // not measured (nor estimated) yet: find out
    const double opt = std::max(b.alpha(), kOptimistic);
    const double plain = rate(b, opt, 0);
    // Up to the ordinary cap: only a long copy drafts longer, and it needs no probes.
    for (int32_t k = 1; k <= std::min(draft_max_, kShortCap); ++k) {
        const bool measured = k == 1 || candidate(std::min(other_rows_ + k + 1, kMaxBatch));
        if (measured && rate(b, opt, k) > plain * kTieMargin) return true;
    }
    return false;
}

double AutoPolicy::catch_up_cost() const {
    if (catch_up_s_ >= 0) return catch_up_s_;
    const double c = cost_of(buckets_[kModelBucket]);
    return c < 0 ? -1.0 : kPrefillShare * c;
}

bool AutoPolicy::catch_up_pays(int32_t lag) const {
    if (lag <= kInStepLag) return true;
    const Bucket& b = buckets_[kModelBucket];
    const double per_token = catch_up_cost();
    if (per_token < 0 || v1_ <= 0) return true;  // nothing to weigh it with: the probe measures it
    // At the acceptance expected (not a probe's optimistic one): the catch-up is paid for certain.
    const double alpha = b.alpha();
    const double plain = rate(b, alpha, 0);
    double best = plain;
    for (int32_t k = 1; k <= std::min(draft_max_, kShortCap); ++k) {
        if (k == 1 || candidate(std::min(other_rows_ + k + 1, kMaxBatch))) best = std::max(best, rate(b, alpha, k));
    }
    const double horizon = std::min(remaining_, kPaybackTokens);
    return horizon / plain - horizon / best > lag * per_token;
}

bool AutoPolicy::may_draft(DraftSource source) const {
    DraftPlan plan;
    plan.source = source;
    plan.match_len = source == DraftSource::kNgram ? 12 : 0;
    const Bucket& b = buckets_[static_cast<size_t>(bucket_of(plan))];
    // A drafter whose cost is unknown is only used to measure it (next_length),
    // and a short answer, which never probes, never runs it.
    if (b.cost < 0) return false;
    return could_pay(b);
}

int32_t AutoPolicy::next_length(int32_t round_max, const DraftPlan& plan) {
    Bucket& b = plan_round(plan);
    const int32_t longest = longest_for(round_max, plan);
    if (longest <= 0 || v1_ <= 0) return 0;  // a plain step measures v1 first
    // A draft model far behind the text drafts only when its catch-up pays back.
    if (plan.source == DraftSource::kModel && !catch_up_pays(plan.lag)) return 0;
    const bool may_explore = remaining_ >= kExploreMin;
    if (b.cost < 0) {  // the drafter's cost is unknown: one short draft measures it,
        // unless even its prior (draft_cost_prior) says it cannot pay here
        if (!may_explore || kind_suspended(planned_bucket_, 1) || !could_pay(b)) return 0;
        b.probing = true;
        return planned_k_ = 1;
    }
    // The model's choice, then the clock's: a suspended kind is not chosen.
    int32_t best_k = 0, model_k = 0;
    const double plain = rate(b, 0, 0);
    double best = plain, model_best = plain;
    // Lookups are judged at alpha's lower bound (Bucket::alpha_low); a draft model's
    // alpha is steadier, and its belief re-plans the draft as it goes.
    const double alpha = plan.source == DraftSource::kModel ? b.alpha() : lookup_alpha(b, plan);
    for (int32_t k = 1; k <= longest; ++k) {
        if (k > 1 && !candidate(std::min(other_rows_ + k + 1, kMaxBatch))) continue;  // measured (or to time)
        const double r = rate(b, alpha, k);
        if (r > model_best * kTieMargin) {
            model_best = r;
            model_k = k;
        }
        if (r > best * kTieMargin && !kind_suspended(planned_bucket_, k)) {
            best = r;
            best_k = k;
        }
    }
    vetoes_ += model_k > 0 && kind_suspended(planned_bucket_, model_k);
    if (best_k > 0) return drafting_won(b, best_k);
    if (b.probing) {
        // A probe that was accepted hints that the text changed: probe again at
        // once until drafting wins or a probe fails; a failed one waits longer.
        if (b.probe_hit) b.plain_streak = b.interval;
        else b.interval = std::min(2 * b.interval, kMaxInterval);
        b.probing = b.probe_hit = false;
    }
    // A source that guesses its next token (n-gram lookup) is judged on every plain
    // round for free (observe); only the others need paid probes.
    if (plan.next_guess >= 0) return 0;
    if (++b.plain_streak >= b.interval && may_explore && !kind_suspended(planned_bucket_, 1) && could_pay(b)) {
        b.plain_streak = 0;
        b.probing = true;
        return planned_k_ = 1;
    }
    return 0;
}

double AutoPolicy::believed_acceptance(const Distribution& belief, int32_t token) const {
    if (token >= 0) return conf_acc_[static_cast<size_t>(conf_bin(belief.prob(token)))];
    // The token is yet to be drawn from `belief`: average the table over that draw.
    double e = 0.0;
    if (belief.dense()) {
        for (double v : belief.dense_probs()) {
            if (v > 0) e += v * conf_acc_[static_cast<size_t>(conf_bin(v))];
        }
    } else {
        for (double v : belief.probs()) e += v * conf_acc_[static_cast<size_t>(conf_bin(v))];
    }
    return e;
}

AutoPolicy::Options AutoPolicy::options(int32_t i, double r_i) const {
    const Bucket& b = buckets_[kModelBucket];
    const double c = std::max(b.cost, 0.0);
    double e_without = 1.0 + other_seqs_;
    for (double r : reach_) e_without += r;
    const double e_with = e_without + r_i;
    // Draft time already spent is sunk; it is in every option's denominator.
    Options o;
    o.without = e_without / ((i + 1) * c + round_cost(i + 1));
    o.with = e_with / ((i + 1) * c + round_cost(i + 2));
    o.more = -std::numeric_limits<double>::infinity();
    if (i + 1 < planned_k_) {
        // Tokens i + 1 .. k - 1 each reach on from r_i at alpha per position.
        const double e = e_with + r_i * (expected_tokens(b.alpha(), planned_k_ - i - 1) - 1.0);
        o.more = e / (planned_k_ * c + round_cost(planned_k_ + 1));
    }
    return o;
}

bool AutoPolicy::judging(int32_t i) const {
    // Only a draft model's belief says anything (an n-gram's q is one-hot).
    return planned_bucket_ == kModelBucket && static_cast<int32_t>(reach_.size()) == i;
}

bool AutoPolicy::stop_before(int32_t i, const Distribution& belief, int32_t known) {
    if (!judging(i)) return false;
    const double r_i = (i == 0 ? 1.0 : reach_.back()) * believed_acceptance(belief, known);
    const Options o = options(i, r_i);
    return o.without > o.with && o.without > o.more;
}

bool AutoPolicy::stop_after(int32_t i, const Distribution& belief, int32_t token) {
    if (!judging(i)) return false;
    const double conf = belief.prob(token);
    const double r_i = (i == 0 ? 1.0 : reach_.back()) * conf_acc_[static_cast<size_t>(conf_bin(conf))];
    beliefs_.push_back(conf);
    reach_.push_back(r_i);
    const Options o = options(i, r_i);
    return o.more < o.with;  // the token stays either way; only going on is in question
}

void AutoPolicy::observe(const RoundReport& r) {
    const int32_t n = r.batch_rows > 0 ? r.batch_rows : r.drafted + 1;
    // Timings refine the costs (V(n) here, H(n) and c_b below) unless they are frozen (set_learn_costs).
    if (learn_costs_) learn_target(r, n);
    const int bi = bucket_of(r.plan);
    // The clock judges rounds that ran alone (their wall time is theirs).
    if (r.round_s > 0 && n == r.drafted + 1) {
        if (learn_costs_) learn_host(r, n);
        judge(r, bi);
    }
    ++round_;
    ++rounds_seen_;
    Bucket& b = buckets_[static_cast<size_t>(bi)];
    // A catch-up on many tokens (after plain rounds) is not a per-token drafting
    // cost: what it took beyond the draft's own steps is the catch-up's.
    const bool in_step = r.plan.source == DraftSource::kNgram || r.plan.lag <= kInStepLag;
    if (learn_costs_ && !in_step && r.draft_s > 0 && b.cost >= 0) {
        const double own = (r.drafted + 1) * b.cost;
        catch_up_s_ = ema(catch_up_s_, std::max(0.0, r.draft_s - own) / r.plan.lag, kCostRate);
    }
    if (r.drafted == 0) {
        if (r.guess_hit >= 0) learn(b, r.guess_hit);
        // A planned draft that stopped before its first token still ran the draft
        // model once (for q_0): that is its per-token cost as well. Counting it
        // lets a draft model that cannot pay be dropped on its first round, not
        // after many rounds of paid-for stops.
        if (learn_costs_ && planned_k_ > 0 && r.plan.source == DraftSource::kModel && in_step && r.draft_s > 0) {
            b.cost = ema(b.cost, r.draft_s, kCostRate);
        }
        return;
    }
    if (learn_costs_ && in_step) b.cost = ema(b.cost, r.draft_s / r.drafted, kCostRate);
    b.probe_hit = b.probing && r.accepted == r.drafted;
    // Positions reached: 0..min(accepted, drafted - 1); all but a rejected last one accepted.
    const bool beliefs = bi == kModelBucket && static_cast<int32_t>(beliefs_.size()) == r.drafted;
    for (int32_t i = 0; i <= std::min(r.accepted, r.drafted - 1); ++i) {
        const double hit = i < r.accepted ? 1.0 : 0.0;
        learn(b, hit);
        if (beliefs) {
            double& t = conf_acc_[static_cast<size_t>(conf_bin(beliefs_[static_cast<size_t>(i)]))];
            t = (1 - kAlphaRate) * t + kAlphaRate * hit;
        }
    }
    beliefs_.clear();
    reach_.clear();
}

void AutoPolicy::learn(Bucket& b, double hit) {
    b.long_run = (1 - kAlphaRate) * b.long_run + kAlphaRate * hit;
    // This generation's evidence, the latest weighing most: a source that just
    // failed here loses its credit within a few positions.
    b.accepted = kRecency * b.accepted + hit;
    b.tried = kRecency * b.tried + 1;
}

double AutoPolicy::acceptance(const DraftPlan& plan) const {
    return buckets_[static_cast<size_t>(bucket_of(plan))].alpha();
}

int32_t AutoPolicy::probe_interval(const DraftPlan& plan) const {
    return buckets_[static_cast<size_t>(bucket_of(plan))].interval;
}

}  // namespace pyspec
