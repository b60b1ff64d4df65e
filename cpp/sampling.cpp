// Sampling math for pyspec: logits -> the distribution actually sampled from, and the
// lossless speculative verification rule. See sampling.h for the interface.
//
// Long on purpose: the contract below and the code it governs stay in one file, and
// the hot paths (logit scan, top-k heap, top-p prefix selection) are tuned for
// 152k-token vocabularies; the Distribution container and the verify rule are short.
//
// ============================ Order of settings ============================
// This is the one place the rule is written down; tests and docs refer here.
// compute_distribution() follows llama.cpp's default sampler chain
// (top-k -> top-p -> min-p -> temperature):
//
//  0. Validation. A NaN or +inf logit is an error; -inf marks a forbidden token (prob 0);
//     all logits -inf is an error. Settings are checked by SamplingParams::validate().
//  1. Greedy (temperature == 0): one-hot on the largest logit, lowest id on ties.
//     Truncation never removes the argmax, so top-k/top-p/min-p are irrelevant here.
//  2. Candidates are ordered by (logit descending, token id ascending): the order of the
//     T = 1 probabilities with ties broken by the lower id. Every cut below keeps a prefix
//     of this order, so it is deterministic even with tied logits.
//  3. top-k (k > 0): keep the first k tokens with a finite logit.
//  4. top-p (< 1): on the T = 1 softmax of the top-k survivors (renormalised over them,
//     as llama.cpp's top-p softmaxes the current candidates), keep the smallest prefix
//     whose cumulative mass is >= top_p. If rounding keeps the sum below top_p (top_p
//     within ~1e-12 of 1), every candidate is kept.
//  5. min-p (> 0): keep tokens with p >= min_p * p_max, i.e. exp(l - l_max) >= min_p,
//     evaluated in double (the ratio does not depend on the normalisation, so applying it
//     after top-p is the same as intersecting both prefixes).
//  6. Temperature T > 0 on the surviving logits: p(x) = exp((l_x - l_max) / T) / Z over
//     the survivors, computed in double with the max subtracted. A token whose value
//     underflows to 0 (tiny T) leaves the support.
//
// Cost at V = 152k: one scan for max/NaN; top-k by a bounded heap (one compare per token
// once the heap is warm); top-p without top-k by exp over the vocabulary plus partial
// selection of a growing prefix (256, then x4), never a full sort unless the prefix
// really needs most of the vocabulary. Small supports are stored sparsely.
//
// ======================= Residual and its fallback =======================
// On rejection the replacement is drawn from r(x) = max(0, p(x) - q(x)) / R with
// R = sum_x max(0, p(x) - q(x)). Only p's support can carry residual mass, so the walk is
// over p's entries (merged with q's when both are sparse: never a pass over the whole
// vocabulary then). In exact arithmetic a rejection at x implies q(x) > p(x), hence R > 0.
// With rounded inputs R can come out 0 or ~1e-17 when p and q agree to rounding; then the
// event "rejected" itself has probability O(R) (rejection probability equals R), and
// normalising a residual made of rounding noise would be meaningless. In that case
// (R < kResidualMinMass = 1e-12) we sample from p: it is the distribution the output must
// follow, and the total-variation error this adds is at most P(rejection) ~ R < 1e-12.
// A zero residual is therefore never normalised.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace pyspec {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr double kSumTolerance = 1e-6;

// Candidate order: higher logit first, then lower id.
inline bool better(float la, int32_t ia, float lb, int32_t ib) {
    return la > lb || (la == lb && ia < ib);
}

// T = 1 probability relative to the max: p(x) / p_max = exp(l_x - l_max).
inline double rel(float l, double mx) { return std::exp(static_cast<double>(l) - mx); }

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

void check_n_vocab(int32_t n_vocab) {
    if (n_vocab <= 0) {
        throw std::invalid_argument("n_vocab must be positive, got " + std::to_string(n_vocab));
    }
}

void check_prob_value(double v, size_t index) {
    if (!std::isfinite(v) || v < 0.0) {
        throw std::invalid_argument("probability at index " + std::to_string(index) +
                                    " is " + std::to_string(v) +
                                    "; probabilities must be finite and >= 0");
    }
}

void check_sum(double total) {
    if (!(std::fabs(total - 1.0) <= kSumTolerance)) {
        throw std::invalid_argument("probabilities sum to " + std::to_string(total) +
                                    ", expected 1 (tolerance 1e-6)");
    }
}

}  // namespace

// ---------------------------------------------------------------- SamplingParams

void SamplingParams::validate() const {
    if (std::isnan(temperature) || temperature < 0.0 || std::isinf(temperature)) {
        throw std::invalid_argument("temperature must be finite and >= 0 (0 = greedy), got " +
                                    std::to_string(temperature));
    }
    if (top_k < 0) {
        throw std::invalid_argument("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
    }
    if (std::isnan(top_p) || !(top_p > 0.0 && top_p <= 1.0)) {
        throw std::invalid_argument("top_p must be in (0, 1] (1 = off), got " + std::to_string(top_p));
    }
    if (std::isnan(min_p) || !(min_p >= 0.0 && min_p <= 1.0)) {
        throw std::invalid_argument("min_p must be in [0, 1] (0 = off), got " + std::to_string(min_p));
    }
}

// ---------------------------------------------------------------- Distribution

double Distribution::prob(int32_t token) const {
    if (token < 0 || token >= n_vocab_) return 0.0;
    if (dense_) return dense_p_[static_cast<size_t>(token)];
    const auto it = std::lower_bound(ids_.begin(), ids_.end(), token);
    if (it == ids_.end() || *it != token) return 0.0;
    return probs_[static_cast<size_t>(it - ids_.begin())];
}

int32_t Distribution::argmax() const {
    if (empty()) throw std::invalid_argument("argmax of an empty Distribution");
    if (dense_) {
        // First maximum in id order = lowest id on ties.
        return static_cast<int32_t>(std::max_element(dense_p_.begin(), dense_p_.end()) -
                                    dense_p_.begin());
    }
    const size_t j = static_cast<size_t>(std::max_element(probs_.begin(), probs_.end()) -
                                         probs_.begin());
    return ids_[j];
}

double Distribution::entropy() const {
    double h = 0.0;
    const std::vector<double>& v = dense_ ? dense_p_ : probs_;
    for (const double x : v) {
        if (x > 0.0) h -= x * std::log(x);
    }
    return h;
}

int32_t Distribution::sample(double u) const {
    if (empty()) throw std::invalid_argument("sample from an empty Distribution");
    const double target = u * total_;
    double cum = 0.0;
    if (dense_) {
        int32_t last = -1;
        const double* p = dense_p_.data();
        for (int32_t i = 0; i < n_vocab_; ++i) {
            if (p[i] > 0.0) {
                cum += p[i];
                last = i;
                if (cum > target) return i;
            }
        }
        return last;  // u * total rounded up to total: the last token in the support
    }
    const size_t n = probs_.size();
    for (size_t j = 0; j < n; ++j) {
        cum += probs_[j];
        if (cum > target) return ids_[j];
    }
    return ids_.back();
}

void Distribution::to_dense(double* out) const {
    if (dense_) {
        std::copy(dense_p_.begin(), dense_p_.end(), out);
        return;
    }
    std::fill(out, out + n_vocab_, 0.0);
    for (size_t j = 0; j < ids_.size(); ++j) out[ids_[j]] = probs_[j];
}

void Distribution::finish_dense_() {
    size_t support = 0;
    double total = 0.0;
    for (const double x : dense_p_) {
        support += (x > 0.0);
        total += x;
    }
    dense_ = true;
    support_ = support;
    total_ = total;
    ids_.clear();
    probs_.clear();
}

void Distribution::finish_sparse_() {
    double total = 0.0;
    for (const double x : probs_) total += x;
    dense_ = false;
    support_ = ids_.size();
    total_ = total;
}

void Distribution::set_dense(const double* p, int32_t n_vocab) {
    assign(p, n_vocab, Storage::kDense);
}

void Distribution::assign(const double* p, int32_t n_vocab, Storage storage) {
    check_n_vocab(n_vocab);
    // Validate everything before touching the current content.
    size_t support = 0;
    double total = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        check_prob_value(p[i], static_cast<size_t>(i));
        support += (p[i] > 0.0);
        total += p[i];
    }
    check_sum(total);
    const bool sparse =
        storage == Storage::kSparse ||
        (storage == Storage::kAuto &&
         support * static_cast<size_t>(kSparseRatio) <= static_cast<size_t>(n_vocab));
    n_vocab_ = n_vocab;
    if (sparse) {
        ids_.clear();
        probs_.clear();
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (p[i] > 0.0) {
                ids_.push_back(i);
                probs_.push_back(p[i]);
            }
        }
        finish_sparse_();
    } else {
        dense_p_.assign(p, p + n_vocab);
        finish_dense_();
    }
}

void Distribution::set_sparse(const int32_t* ids, const double* probs, size_t count,
                              int32_t n_vocab) {
    check_n_vocab(n_vocab);
    double total = 0.0;
    for (size_t j = 0; j < count; ++j) {
        if (ids[j] < 0 || ids[j] >= n_vocab) {
            throw std::invalid_argument("sparse id " + std::to_string(ids[j]) +
                                        " outside [0, n_vocab)");
        }
        if (j > 0 && ids[j] <= ids[j - 1]) {
            throw std::invalid_argument("sparse ids must be strictly increasing");
        }
        check_prob_value(probs[j], j);
        total += probs[j];
    }
    check_sum(total);
    n_vocab_ = n_vocab;
    ids_.clear();
    probs_.clear();
    for (size_t j = 0; j < count; ++j) {
        if (probs[j] > 0.0) {
            ids_.push_back(ids[j]);
            probs_.push_back(probs[j]);
        }
    }
    finish_sparse_();
}

void Distribution::set_one_hot(int32_t token, int32_t n_vocab) {
    check_n_vocab(n_vocab);
    if (token < 0 || token >= n_vocab) {
        throw std::invalid_argument("one-hot token " + std::to_string(token) +
                                    " outside [0, n_vocab)");
    }
    n_vocab_ = n_vocab;
    ids_.clear();
    probs_.clear();
    ids_.push_back(token);
    probs_.push_back(1.0);
    finish_sparse_();
}

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

    // Step 1: greedy. The first logit equal to the max is the lowest-id argmax.
    if (params.greedy()) {
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
    if (all_finite &&
        static_cast<size_t>(scan.n_finite) * ratio <= static_cast<size_t>(n_vocab)) {
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (logits[i] != kNegInf) cand.push_back({logits[i], i});
        }
        all_finite = false;
    }

    // Step 6: temperature on the survivors, normalised in double.
    const double temp = params.temperature;
    auto weight = [mx, temp](float l) {
        return temp == 1.0 ? std::exp(static_cast<double>(l) - mx)
                           : std::exp((static_cast<double>(l) - mx) / temp);
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

// ---------------------------------------------------------------- residual

namespace {

// Calls f(id, r) with r = p(id) - q(id) > 0 for every token of p's support where the
// residual is positive, in increasing id order; stops early when f returns true.
// q may cover fewer ids than p (a draft vocabulary without the target's padding
// ids): q is 0 past its end. Entries of q past p's end carry no residual.
template <class F>
void for_each_residual(const Distribution& p, const Distribution& q, F&& f) {
    const int32_t q_end = q.n_vocab();
    const std::vector<int32_t>& qi = q.ids();
    const std::vector<double>& qp = q.probs();
    const size_t nq = qi.size();
    if (!p.dense()) {
        const std::vector<int32_t>& pi = p.ids();
        const std::vector<double>& pp = p.probs();
        if (q.dense()) {
            const double* qd = q.dense_probs().data();
            for (size_t j = 0; j < pi.size(); ++j) {
                const double r = pp[j] - (pi[j] < q_end ? qd[pi[j]] : 0.0);
                if (r > 0.0 && f(pi[j], r)) return;
            }
        } else {
            size_t k = 0;
            for (size_t j = 0; j < pi.size(); ++j) {
                const int32_t id = pi[j];
                while (k < nq && qi[k] < id) ++k;
                const double r = pp[j] - ((k < nq && qi[k] == id) ? qp[k] : 0.0);
                if (r > 0.0 && f(id, r)) return;
            }
        }
        return;
    }
    const double* pd = p.dense_probs().data();
    const int32_t n = p.n_vocab();
    if (q.dense()) {
        const double* qd = q.dense_probs().data();
        for (int32_t i = 0; i < n; ++i) {
            const double r = pd[i] - (i < q_end ? qd[i] : 0.0);
            if (r > 0.0 && f(i, r)) return;
        }
    } else {
        size_t k = 0;
        for (int32_t i = 0; i < n; ++i) {
            double qv = 0.0;
            if (k < nq && qi[k] == i) qv = qp[k++];
            const double r = pd[i] - qv;
            if (r > 0.0 && f(i, r)) return;
        }
    }
}

}  // namespace

double residual_mass(const Distribution& p, const Distribution& q) {
    double mass = 0.0;
    for_each_residual(p, q, [&mass](int32_t, double r) {
        mass += r;
        return false;
    });
    return mass;
}

int32_t sample_residual(const Distribution& p, const Distribution& q, double u) {
    const double mass = residual_mass(p, q);
    if (!(mass >= kResidualMinMass)) return p.sample(u);  // see "Residual and its fallback"
    const double target = u * mass;
    double cum = 0.0;
    int32_t last = -1;
    int32_t chosen = -1;
    // Same additions in the same order as residual_mass, so cum ends exactly at mass.
    for_each_residual(p, q, [&](int32_t id, double r) {
        cum += r;
        last = id;
        if (cum > target) {
            chosen = id;
            return true;
        }
        return false;
    });
    return chosen >= 0 ? chosen : last;
}

// ---------------------------------------------------------------- verify

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

const std::vector<std::string>& verify_variant_names() {
    static const std::vector<std::string> names = {"correct", "residual_is_p", "accept_all", "sample_and_match"};
    return names;
}

VerifyVariant parse_verify_variant(const std::string& name) {
    const auto& names = verify_variant_names();
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == name) return static_cast<VerifyVariant>(i);
    }
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "'" : ", '") + n + "'";
    throw std::invalid_argument("variant must be one of " + known + ", got '" + name + "'");
}

VerifyResult verify(const Distribution* p, const Distribution* q, const int32_t* draft, int32_t n,
                    Rng& rng, VerifyVariant variant) {
    if (n < 0) throw std::invalid_argument("verify: negative number of drafts");
    if (p == nullptr || (n > 0 && (q == nullptr || draft == nullptr))) {
        throw std::invalid_argument("verify: null input");
    }
    const int32_t n_vocab = p[0].n_vocab();
    if (n_vocab <= 0) throw std::invalid_argument("verify: p[0] is empty");
    for (int32_t i = 0; i <= n; ++i) {
        if (p[i].n_vocab() != n_vocab) {
            throw std::invalid_argument("verify: p[" + std::to_string(i) +
                                        "] has a different vocabulary size");
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        if (q[i].n_vocab() <= 0) throw std::invalid_argument("verify: q[" + std::to_string(i) + "] is empty");
        const int32_t x = draft[i];
        if (x < 0 || x >= q[i].n_vocab()) {
            throw std::invalid_argument("verify: draft[" + std::to_string(i) + "] = " +
                                        std::to_string(x) + " is outside q's vocabulary [0, " +
                                        std::to_string(q[i].n_vocab()) + ")");
        }
        if (!(q[i].prob(x) > 0.0)) {
            throw std::invalid_argument(
                "verify: q[" + std::to_string(i) + "](draft[" + std::to_string(i) + "] = " +
                std::to_string(x) +
                ") = 0, so the draft cannot have been sampled from q; q must be the "
                "distribution the draft was actually drawn from");
        }
    }

    for (int32_t i = 0; i < n; ++i) {
        const int32_t x = draft[i];
        switch (variant) {
            case VerifyVariant::kAcceptAll:  // TEST-ONLY negative control
                continue;
            case VerifyVariant::kSampleAndMatch: {  // TEST-ONLY negative control
                const int32_t y = p[i].sample(rng.uniform());
                if (y == x) continue;
                return {i, y};
            }
            case VerifyVariant::kCorrect:
            case VerifyVariant::kResidualIsP: {
                const double px = p[i].prob(x);
                const double qx = q[i].prob(x);
                const double u = rng.uniform();
                // Accept iff u < p/q. The explicit p >= q keeps "p = q never rejects" exact
                // (u * q can round up to q for u = 1 - 2^-53).
                if (px >= qx || u * qx < px) continue;
                const double u2 = rng.uniform();
                const int32_t y = variant == VerifyVariant::kCorrect
                                      ? sample_residual(p[i], q[i], u2)
                                      : p[i].sample(u2);  // TEST-ONLY negative control
                return {i, y};
            }
        }
        throw std::invalid_argument("verify: unknown variant");
    }
    return {n, p[n].sample(rng.uniform())};
}

}  // namespace pyspec
