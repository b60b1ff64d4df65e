#include "tools/agreement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/errors.h"

namespace pyspec {

namespace {

constexpr int32_t kChunk = 64;  // rows per decode: 64 x n_vocab floats of logits per context

// One row's full T = 1 softmax: log-probabilities and probabilities (one exp per
// token), and the argmax (lowest id on ties). false when a logit is NaN or +inf, or
// all are -inf.
bool softmax(const float* logits, int32_t n, std::vector<double>& logp, std::vector<double>& prob, int32_t& argmax) {
    double m = -std::numeric_limits<double>::infinity();
    argmax = -1;
    for (int32_t i = 0; i < n; ++i) {
        const double l = logits[i];
        if (std::isnan(l) || l == std::numeric_limits<double>::infinity()) return false;
        if (l > m) {
            m = l;
            argmax = i;
        }
    }
    if (argmax < 0) return false;
    logp.resize(static_cast<size_t>(n));
    prob.resize(static_cast<size_t>(n));
    double s = 0;
    for (int32_t i = 0; i < n; ++i) s += prob[static_cast<size_t>(i)] = std::exp(static_cast<double>(logits[i]) - m);
    const double lse = m + std::log(s), inv = 1.0 / s;
    for (int32_t i = 0; i < n; ++i) {
        logp[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - lse;
        prob[static_cast<size_t>(i)] *= inv;
    }
    return true;
}

// The sampling settings leave the T = 1 softmax as it is (no truncation, no temperature).
bool untouched(const SamplingParams& s) {
    return s.temperature == 1.0 && s.top_k == 0 && s.top_p >= 1.0 && s.min_p <= 0.0;
}

// Sets abort flags on both contexts for the call's duration.
struct AbortScope {
    Model& a;
    Model& b;
    AbortScope(Model& a_, Model& b_, const std::atomic<bool>* flag) : a(a_), b(b_) {
        a.set_abort_flag(flag);
        b.set_abort_flag(flag);
    }
    ~AbortScope() {
        a.set_abort_flag(nullptr);
        b.set_abort_flag(nullptr);
    }
};

}  // namespace

AgreementRows agreement(Model& ref, Model& cand, const std::vector<int32_t>& tokens, int32_t first,
                        const SamplingParams& sampling, const std::atomic<bool>* cancel) {
    sampling.validate();
    const int32_t n_tokens = static_cast<int32_t>(tokens.size());
    if (first < 0 || first > n_tokens - 2) {
        throw std::invalid_argument("agreement needs at least one scored row: first = " + std::to_string(first) +
                                    " with " + std::to_string(n_tokens) + " tokens");
    }
    const int32_t shared_vocab = std::min(ref.n_vocab(), cand.n_vocab());
    for (int32_t tok : tokens) {
        if (tok < 0 || tok >= shared_vocab) {
            throw std::invalid_argument("token " + std::to_string(tok) + " is outside the models' shared vocabulary");
        }
    }
    const bool same = &ref == &cand;
    std::unique_lock<std::recursive_mutex> lock_ref(ref.mutex(), std::defer_lock);
    std::unique_lock<std::recursive_mutex> lock_cand(cand.mutex(), std::defer_lock);
    std::lock(lock_ref, lock_cand);  // a fixed order would deadlock agreement(a, b) against (b, a)
    AbortScope abort(ref, cand, cancel);
    for (Model* m : {&ref, &cand}) {
        if (n_tokens - 1 > m->n_ctx()) {
            throw ContextOverflowError("a stream of " + std::to_string(n_tokens) + " tokens does not fit a " +
                                       std::to_string(m->n_ctx()) + "-token context");
        }
        m->truncate(0);
    }

    const int32_t n_rows = n_tokens - 1 - first;
    AgreementRows out;
    out.alpha.reserve(n_rows);
    out.top1.reserve(n_rows);
    out.kl.reserve(n_rows);
    out.logp_ref.reserve(n_rows);
    out.logp_cand.reserve(n_rows);

    const int32_t vp = ref.n_vocab(), vq = cand.n_vocab(), shared = std::min(vp, vq);
    const int32_t chunk = std::min({kChunk, ref.n_batch(), cand.n_batch()});
    std::vector<double> lp, lq, pp, pq;
    std::vector<double> dp(static_cast<size_t>(std::max(vp, vq))), dq(dp.size());
    const bool plain = untouched(sampling);
    // The infill sampler reads each model's own vocabulary.
    SamplingParams sp = sampling, sq = sampling;
    if (sampling.infill) {
        sp.infill_vocab = ref.infill_vocab();
        sq.infill_vocab = cand.infill_vocab();
    }
    Distribution p, q;
    SamplingWorkspace ws;
    const double inf = std::numeric_limits<double>::infinity();
    try {
        if (first > 0) {  // context only: no logits
            ref.decode(tokens.data(), first, 0, 0);
            if (!same) cand.decode(tokens.data(), first, 0, 0);
        }
        for (int32_t t0 = first; t0 < n_tokens - 1; t0 += chunk) {
            const int32_t n = std::min(chunk, n_tokens - 1 - t0);
            ref.decode(tokens.data() + t0, n, t0, n);
            if (!same) cand.decode(tokens.data() + t0, n, t0, n);
            for (int32_t i = 0; i < n; ++i) {
                const int32_t t = t0 + i, next = tokens[static_cast<size_t>(t + 1)];
                const float* rp = ref.logits(i);
                const float* rq = same ? rp : cand.logits(i);
                int32_t ap = 0, aq = 0;
                if (!softmax(rp, vp, lp, pp, ap)) {
                    throw DecodeError("the reference's logits are not finite at position " + std::to_string(t));
                }
                if (!softmax(rq, vq, lq, pq, aq)) {
                    out.alpha.push_back(0.0);
                    out.top1.push_back(0);
                    out.kl.push_back(inf);
                    out.logp_ref.push_back(lp[static_cast<size_t>(next)]);
                    out.logp_cand.push_back(-inf);
                    ++out.nonfinite;
                    continue;
                }
                double kl = 0;
                for (int32_t x = 0; x < shared; ++x) {
                    const size_t k = static_cast<size_t>(x);
                    if (pp[k] > 0) kl += pp[k] * (lp[k] - lq[k]);  // q(x) = 0 < p(x): +inf, as it should
                }
                // alpha = 1 - |p - q|_1 / 2 at the sampling settings (the full softmaxes when
                // they change nothing: compute_distribution would rebuild the same vectors).
                const std::vector<double>* a = &pp;
                const std::vector<double>* b = &pq;
                if (!plain) {
                    compute_distribution(rp, vp, sp, p, ws);
                    compute_distribution(rq, vq, sq, q, ws);
                    std::fill(dp.begin(), dp.end(), 0.0);
                    std::fill(dq.begin(), dq.end(), 0.0);
                    p.to_dense(dp.data());
                    q.to_dense(dq.data());
                    a = &dp;
                    b = &dq;
                }
                double l1 = 0;
                const size_t common = static_cast<size_t>(shared);
                for (size_t x = 0; x < common; ++x) l1 += std::fabs((*a)[x] - (*b)[x]);
                for (size_t x = common; x < a->size(); ++x) l1 += (*a)[x];  // one model's extra tokens
                for (size_t x = common; x < b->size(); ++x) l1 += (*b)[x];
                out.alpha.push_back(std::max(0.0, 1.0 - 0.5 * l1));
                out.top1.push_back(ap == aq ? 1 : 0);
                out.kl.push_back(std::max(0.0, kl));  // rounding can dip below 0 when p ~ q
                out.logp_ref.push_back(lp[static_cast<size_t>(next)]);
                out.logp_cand.push_back(lq[static_cast<size_t>(next)]);
            }
        }
    } catch (...) {
        ref.truncate(0);
        if (!same) cand.truncate(0);
        throw;
    }
    ref.truncate(0);
    if (!same) cand.truncate(0);
    return out;
}

}  // namespace pyspec
