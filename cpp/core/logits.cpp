// Logits -> the distribution actually sampled from (compute_distribution, the
// rule "Order of settings" in sampling.h), and the target's log-probabilities of
// an emitted token (token_logprobs). The hot paths (logit scan, top-k heap, top-p
// prefix selection) are tuned for 152k-token vocabularies.
#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/sampling_internal.h"

namespace pyspec {

namespace {

using detail::better;
using detail::check_n_vocab;
using detail::rel;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

[[noreturn]] void throw_bad_logit(const float* logits, int32_t n_vocab) {
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (std::isnan(logits[i])) {
            throw std::invalid_argument("logits[" + std::to_string(i) + "] is NaN");
        }
        if (logits[i] == kPosInf) {
            throw std::invalid_argument("logits[" + std::to_string(i) + "] is +inf");
        }
    }
    throw std::invalid_argument("invalid logits");
}

}  // namespace

// ---------------------------------------------------------------- compute_distribution

namespace {

#if defined(__GNUC__) || defined(__clang__)
#define PYSPEC_VECTOR_EXT 1
// Four floats per vector (SSE2 / NEON width); GCC and Clang lower these portably.
typedef float V4f __attribute__((vector_size(16)));
typedef int32_t V4i __attribute__((vector_size(16)));
inline V4f load4(const float* p) {
    V4f v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
// Lane-wise max that ignores NaN in `a` (a > b is false for NaN): NaN is caught elsewhere.
inline V4f vmax(V4f a, V4f b) {
    const V4i gt = a > b;
    return (V4f)(((V4i)a & gt) | ((V4i)b & ~gt));
}
#endif

struct LogitScan {
    float max;         // largest non-NaN logit (-inf if none)
    int32_t n_finite;  // logits > -inf (a +inf counts, but is reported as bad)
    bool bad;          // some logit is NaN or +inf
};

LogitScan scan_logits(const float* logits, int32_t n) {
    LogitScan r{kNegInf, 0, false};
    int32_t n_ok = 0;  // logits < +inf (not NaN, not +inf)
    int32_t i = 0;
#ifdef PYSPEC_VECTOR_EXT
    const V4f ninf = {kNegInf, kNegInf, kNegInf, kNegInf};
    const V4f pinf = -ninf;
    V4f m0 = ninf, m1 = ninf;
    V4i fin = {0, 0, 0, 0}, ok = {0, 0, 0, 0};
    for (; i + 8 <= n; i += 8) {
        const V4f a = load4(logits + i);
        const V4f b = load4(logits + i + 4);
        m0 = vmax(a, m0);
        m1 = vmax(b, m1);
        fin -= (a > ninf);  // comparisons give -1 per true lane
        fin -= (b > ninf);
        ok -= (a < pinf);
        ok -= (b < pinf);
    }
    m0 = vmax(m0, m1);
    for (int j = 0; j < 4; ++j) {
        r.max = m0[j] > r.max ? m0[j] : r.max;
        r.n_finite += fin[j];
        n_ok += ok[j];
    }
#endif
    for (; i < n; ++i) {
        const float l = logits[i];
        r.max = l > r.max ? l : r.max;
        r.n_finite += (l > kNegInf);
        n_ok += (l < kPosInf);
    }
    r.bad = n_ok != n;
    return r;
}

constexpr int32_t kBlock = 16;

// Largest of 16 logits (NaN-free input).
inline float block_max(const float* l) {
#ifdef PYSPEC_VECTOR_EXT
    const V4f m = vmax(vmax(load4(l), load4(l + 4)), vmax(load4(l + 8), load4(l + 12)));
    float r = m[0];
    for (int j = 1; j < 4; ++j) r = m[j] > r ? m[j] : r;
    return r;
#else
    float r = l[0];
    for (int j = 1; j < kBlock; ++j) r = l[j] > r ? l[j] : r;
    return r;
#endif
}

using Candidate = SamplingWorkspace::Candidate;
using Weighted = SamplingWorkspace::Weighted;

inline bool better_c(const Candidate& a, const Candidate& b) {
    return better(a.logit, a.id, b.logit, b.id);
}
inline bool better_w(const Weighted& a, const Weighted& b) {
    return better(a.logit, a.id, b.logit, b.id);
}

// Top-k by a bounded heap whose front is the worst kept candidate; blocks of 16 whose
// max does not beat the current worst are skipped after one vector compare.
// Requires 0 < k < number of finite logits. Leaves cand sorted best first.
void select_top_k(const float* logits, int32_t n, size_t k, std::vector<Candidate>& cand) {
    cand.clear();
    int32_t i = 0;
    for (; i < n && cand.size() < k; ++i) {
        if (logits[i] != kNegInf) cand.push_back({logits[i], i});
    }
    std::make_heap(cand.begin(), cand.end(), better_c);
    float thr = cand.front().logit;
    auto offer = [&](int32_t id) {
        const float l = logits[id];
        // A later id with an equal logit is worse than everything already kept.
        if (l > thr) {
            std::pop_heap(cand.begin(), cand.end(), better_c);
            cand.back() = {l, id};
            std::push_heap(cand.begin(), cand.end(), better_c);
            thr = cand.front().logit;
        }
    };
    for (; i < n && i % kBlock != 0; ++i) offer(i);
    for (; i + kBlock <= n; i += kBlock) {
        if (block_max(logits + i) > thr) {
            for (int32_t j = i; j < i + kBlock; ++j) offer(j);
        }
    }
    for (; i < n; ++i) offer(i);
    std::sort(cand.begin(), cand.end(), better_c);
}

// Weighted selection: reorders a[0, n) so that a[0, m) is the smallest prefix, in the
// (logit desc, id asc) order, whose weight sum is >= need, and returns m (n if the whole
// range weighs less). Expected O(n): quickselect partitions, then a sort of <= 32 items.
size_t weighted_prefix(Weighted* a, size_t n, double need) {
    size_t lo = 0, hi = n;  // everything in [0, lo) is kept; the cut lies in [lo, hi]
    while (hi - lo > 32) {
        const size_t mid = lo + (hi - lo) / 2;
        // Median of three as pivot, moved to hi - 1.
        if (better_w(a[mid], a[lo])) std::swap(a[mid], a[lo]);
        if (better_w(a[hi - 1], a[lo])) std::swap(a[hi - 1], a[lo]);
        if (better_w(a[mid], a[hi - 1])) std::swap(a[mid], a[hi - 1]);
        const Weighted pivot = a[hi - 1];
        size_t store = lo;
        double mass = 0.0;
        for (size_t j = lo; j + 1 < hi; ++j) {
            if (better_w(a[j], pivot)) {
                mass += a[j].e;
                std::swap(a[j], a[store]);
                ++store;
            }
        }
        std::swap(a[store], a[hi - 1]);  // pivot at `store`, better ones before it
        if (mass >= need) {
            hi = store;
        } else if (mass + pivot.e >= need) {
            return store + 1;
        } else {
            need -= mass + pivot.e;
            lo = store + 1;
        }
    }
    std::sort(a + lo, a + hi, better_w);
    double cum = 0.0;
    for (size_t j = lo; j < hi; ++j) {
        cum += a[j].e;
        if (cum >= need) return j + 1;
    }
    return hi;
}

// Bucket of a T = 1 relative probability e in [0, 1]: 0 for e = 1, b for
// e in [2^-b, 2^-(b-1)), 63 for e < 2^-62 (including 0). Larger e = smaller bucket, so
// bucket order agrees with the candidate order.
inline int bucket_of(double e) {
    uint64_t bits;
    std::memcpy(&bits, &e, sizeof bits);
    const int biased = static_cast<int>(bits >> 52);  // e >= 0: no sign bit
    const int b = 1023 - biased;
    return b < 63 ? b : 63;
}

}  // namespace

void compute_distribution(const float* logits, int32_t n_vocab, const SamplingParams& params,
                          Distribution& out, SamplingWorkspace& ws) {
    params.validate();
    check_n_vocab(n_vocab);
    if (logits == nullptr) throw std::invalid_argument("logits is null");

    // Step 0: one vectorised scan for the max, NaN/+inf and the number of finite logits.
    const LogitScan scan = scan_logits(logits, n_vocab);
    if (scan.bad) throw_bad_logit(logits, n_vocab);
    if (scan.n_finite == 0) {
        throw std::invalid_argument("all logits are -inf: no token can be sampled");
    }
    const float mxf = scan.max;
    const double mx = static_cast<double>(mxf);

    const InfillVocab* infill = params.infill ? params.infill_vocab.get() : nullptr;
    if (params.infill && (infill == nullptr || infill->pieces.size() < static_cast<size_t>(n_vocab) ||
                          infill->eog.size() < static_cast<size_t>(n_vocab))) {
        throw std::invalid_argument("the infill sampler needs the model's vocabulary (infill_vocab)");
    }

    // Step 1: greedy. The first logit equal to the max is the lowest-id argmax.
    if (params.greedy() && infill == nullptr) {
        int32_t amax = 0;
        while (logits[amax] != mxf) ++amax;
        out.set_one_hot(amax, n_vocab);
        return;
    }

    const bool use_k = params.top_k > 0 && params.top_k < scan.n_finite;
    const bool use_p = params.top_p < 1.0;
    const bool use_min_p = params.min_p > 0.0;
    std::vector<Candidate>& cand = ws.cand_;
    cand.clear();
    bool all_finite = false;  // no truncation: every finite-logit token survives

    if (use_k) {
        // Step 3.
        select_top_k(logits, n_vocab, static_cast<size_t>(params.top_k), cand);
        size_t keep = cand.size();
        if (use_p) {
            // Step 4 on the top-k survivors, renormalised over them.
            double s = 0.0;
            for (const Candidate& c : cand) s += rel(c.logit, mx);
            const double target = params.top_p * s;
            double cum = 0.0;
            for (size_t j = 0; j < cand.size(); ++j) {
                cum += rel(cand[j].logit, mx);
                if (cum >= target) {
                    keep = j + 1;
                    break;
                }
            }
        }
        if (use_min_p) {
            // Step 5: a prefix of the sorted list; the max (first) always survives.
            size_t j = 1;
            while (j < keep && rel(cand[j].logit, mx) >= params.min_p) ++j;
            keep = j;
        }
        cand.resize(keep);
    } else if (use_p) {
        // Step 4 without top-k, no sort of the vocabulary:
        //  a. e_i = exp(l_i - l_max) and their sum s (the T = 1 normaliser);
        //  b. mass per power-of-two bucket of e; the bucket b* where the cumulative mass
        //     (largest e first) reaches top_p * s; every token of a better bucket is in
        //     the prefix, no token of a worse bucket is;
        //  c. inside b* a weighted quickselect finds the cut in the exact candidate order.
        std::vector<double>& e = ws.e_;
        e.resize(static_cast<size_t>(n_vocab));
        double s = 0.0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            const double v = rel(logits[i], mx);  // exp(-inf) = 0
            e[static_cast<size_t>(i)] = v;
            s += v;
        }
        double bucket_mass[64] = {};
        for (int32_t i = 0; i < n_vocab; ++i) {
            const double v = e[static_cast<size_t>(i)];
            bucket_mass[bucket_of(v)] += v;
        }
        double need = params.top_p * s;
        int cut = 63;
        for (int b = 0; b < 64; ++b) {
            if (bucket_mass[b] >= need) {
                cut = b;
                break;
            }
            need -= bucket_mass[b];
        }
        std::vector<Weighted>& w = ws.weighted_;
        w.clear();
        for (int32_t i = 0; i < n_vocab; ++i) {
            const float l = logits[i];
            if (l == kNegInf) continue;
            const double v = e[static_cast<size_t>(i)];
            const int b = bucket_of(v);
            if (b < cut) {
                cand.push_back({l, i});
            } else if (b == cut) {
                w.push_back({v, l, i});
            }
        }
        const size_t m = weighted_prefix(w.data(), w.size(), need);
        for (size_t j = 0; j < m; ++j) cand.push_back({w[j].logit, w[j].id});
        if (use_min_p) {
            // Step 5 (the survivors are not sorted here: filter, the max always passes).
            size_t kept = 0;
            for (const Candidate& c : cand) {
                if (e[static_cast<size_t>(c.id)] >= params.min_p) cand[kept++] = c;
            }
            cand.resize(kept);
        }
    } else if (use_min_p) {
        // Step 5 alone, in id order. The float pre-cut (slightly below the exact one)
        // only skips blocks and exps; the decision is exp(l - l_max) >= min_p.
        const float pre_cut =
            static_cast<float>(mx + std::log(params.min_p) - 1e-3 * (1.0 + std::fabs(mx)));
        auto offer = [&](int32_t i) {
            const float l = logits[i];
            if (l >= pre_cut && rel(l, mx) >= params.min_p) cand.push_back({l, i});
        };
        int32_t i = 0;
        for (; i + kBlock <= n_vocab; i += kBlock) {
            if (block_max(logits + i) >= pre_cut) {
                for (int32_t j = i; j < i + kBlock; ++j) offer(j);
            }
        }
        for (; i < n_vocab; ++i) offer(i);
    } else {
        all_finite = true;
    }

    const size_t ratio = static_cast<size_t>(Distribution::kSparseRatio);
    if (all_finite && (infill != nullptr ||
                       static_cast<size_t>(scan.n_finite) * ratio <= static_cast<size_t>(n_vocab))) {
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (logits[i] != kNegInf) cand.push_back({logits[i], i});
        }
        all_finite = false;
    }

    // Step 5b: infill, then a greedy row's argmax among its survivors. It may
    // remove the row's max, so step 6 weighs from the survivors' own max.
    double top = mx;
    if (infill != nullptr) {
        const bool end_allowed = infill->end >= 0 && infill->end < n_vocab && logits[infill->end] != kNegInf;
        infill_truncate(cand, *infill, ws.mass_, end_allowed);
        if (cand.empty()) {
            if (infill->end < 0 || infill->end >= n_vocab) {
                throw std::invalid_argument("the infill sampler ended the answer, but the vocabulary has no end token");
            }
            out.set_one_hot(infill->end, n_vocab);
            return;
        }
        if (params.greedy()) {
            const Candidate* best = &cand.front();
            for (const Candidate& c : cand) {
                if (better(c.logit, c.id, best->logit, best->id)) best = &c;
            }
            out.set_one_hot(best->id, n_vocab);
            return;
        }
        top = -std::numeric_limits<double>::infinity();
        for (const Candidate& c : cand) top = std::max(top, static_cast<double>(c.logit));
    }

    // Step 6: temperature on the survivors, normalised in double.
    const double temp = params.temperature;
    auto weight = [top, temp](float l) {
        return temp == 1.0 ? std::exp(static_cast<double>(l) - top)
                           : std::exp((static_cast<double>(l) - top) / temp);
    };
    out.n_vocab_ = n_vocab;
    if (all_finite) {
        std::vector<double>& d = out.dense_p_;
        d.resize(static_cast<size_t>(n_vocab));
        double z = 0.0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            const double v = weight(logits[i]);  // exp(-inf) = 0 for forbidden tokens
            d[static_cast<size_t>(i)] = v;
            z += v;
        }
        const double inv = 1.0 / z;  // z >= 1: the max contributes exp(0)
        size_t support = 0;
        double total = 0.0;
        for (double& x : d) {
            x *= inv;
            support += (x > 0.0);
            total += x;
        }
        out.dense_ = true;
        out.support_ = support;
        out.total_ = total;
        out.ids_.clear();
        out.probs_.clear();
        return;
    }

    if (cand.size() * ratio <= static_cast<size_t>(n_vocab)) {
        std::sort(cand.begin(), cand.end(),
                  [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
        std::vector<int32_t>& ids = out.ids_;
        std::vector<double>& probs = out.probs_;
        ids.clear();
        probs.clear();
        double z = 0.0;
        for (const Candidate& c : cand) {
            const double v = weight(c.logit);
            if (v > 0.0) {  // a tiny temperature can underflow far-from-max tokens to 0
                ids.push_back(c.id);
                probs.push_back(v);
                z += v;
            }
        }
        const double inv = 1.0 / z;
        for (double& x : probs) x *= inv;
        out.finish_sparse_();
    } else {
        std::vector<double>& d = out.dense_p_;
        d.assign(static_cast<size_t>(n_vocab), 0.0);
        double z = 0.0;
        for (const Candidate& c : cand) {
            const double v = weight(c.logit);
            d[static_cast<size_t>(c.id)] = v;
            z += v;
        }
        const double inv = 1.0 / z;
        for (const Candidate& c : cand) d[static_cast<size_t>(c.id)] *= inv;
        out.finish_dense_();
    }
}

// ---------------------------------------------------------------- logprobs

TokenLogprobs token_logprobs(const float* logits, int32_t n_vocab, int32_t token, int32_t k) {
    if (token < 0 || token >= n_vocab) throw std::invalid_argument("token id out of range");
    // log p(x) = l(x) - (m + log sum exp(l - m)), m the largest logit: no overflow.
    double m = -std::numeric_limits<double>::infinity();
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float l = logits[i];
        if (std::isnan(l) || l == std::numeric_limits<float>::infinity()) {
            throw std::invalid_argument("NaN or +inf logit at token " + std::to_string(i));
        }
        m = std::max(m, static_cast<double>(l));
    }
    if (std::isinf(m)) throw std::invalid_argument("every logit is -inf");
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
    const double log_z = m + std::log(sum);
    TokenLogprobs out;
    out.logprob = logits[token] - log_z;
    k = std::min(std::max(k, 0), n_vocab);
    if (k > 0) {
        std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) ids[static_cast<size_t>(i)] = i;
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [logits](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        for (int32_t j = 0; j < k; ++j) out.top.emplace_back(ids[static_cast<size_t>(j)], logits[ids[static_cast<size_t>(j)]] - log_z);
    }
    return out;
}

}  // namespace pyspec
