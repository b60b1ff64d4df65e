// The Distribution container and the sampling settings' validation. The rule
// that turns logits into a Distribution is in logits.cpp; the contract of both
// is written once, in sampling.h.
#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/sampling_internal.h"

namespace pyspec {

namespace detail {

void check_n_vocab(int32_t n_vocab) {
    if (n_vocab <= 0) {
        throw std::invalid_argument("n_vocab must be positive, got " + std::to_string(n_vocab));
    }
}

}  // namespace detail

namespace {

using detail::check_n_vocab;

constexpr double kSumTolerance = 1e-6;

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
    if (infill && !(top_k >= 1 && top_k <= kInfillMaxCandidates)) {
        throw std::invalid_argument("the infill sampler needs top_k in 1.." + std::to_string(kInfillMaxCandidates) +
                                    " (editor plugins send 40), got " + std::to_string(top_k));
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

double Distribution::pit(int32_t token, double v, int32_t first) const {
    const double px = prob(token);
    double before = 0.0;
    if (token != first) {
        before = first >= 0 ? prob(first) : 0.0;
        const std::vector<double>& pv = dense_ ? dense_p_ : probs_;
        for (size_t j = 0; j < pv.size(); ++j) {
            const int32_t id = dense_ ? static_cast<int32_t>(j) : ids_[j];
            if (id != first && (pv[j] > px || (pv[j] == px && id < token))) before += pv[j];
        }
    }
    return (before + v * px) / total_;
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

}  // namespace pyspec
