// The accept test: the lossless rule (Leviathan et al. 2023, Algorithm 1; Chen
// et al. 2023, Algorithm 2) that keeps a prefix of the drafts, and the residual
// it resamples from on a rejection; the rule and its rounding fallback are
// written once, in sampling.h.
#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace pyspec {

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

// ---------------------------------------------------------------- the accept test

const std::vector<std::string>& accept_variant_names() {
    static const std::vector<std::string> names = {"correct", "residual_is_p", "accept_all", "sample_and_match"};
    return names;
}

AcceptVariant parse_accept_variant(const std::string& name) {
    const auto& names = accept_variant_names();
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == name) return static_cast<AcceptVariant>(i);
    }
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "'" : ", '") + n + "'";
    throw std::invalid_argument("variant must be one of " + known + ", got '" + name + "'");
}

AcceptResult accept_drafts(const Distribution* p, const Distribution* q, const int32_t* draft, int32_t n,
                           Rng& rng, AcceptVariant variant) {
    if (n < 0) throw std::invalid_argument("accept_drafts: negative number of drafts");
    if (p == nullptr || (n > 0 && (q == nullptr || draft == nullptr))) {
        throw std::invalid_argument("accept_drafts: null input");
    }
    const int32_t n_vocab = p[0].n_vocab();
    if (n_vocab <= 0) throw std::invalid_argument("accept_drafts: p[0] is empty");
    for (int32_t i = 0; i <= n; ++i) {
        if (p[i].n_vocab() != n_vocab) {
            throw std::invalid_argument("accept_drafts: p[" + std::to_string(i) +
                                        "] has a different vocabulary size");
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        if (q[i].n_vocab() <= 0) throw std::invalid_argument("accept_drafts: q[" + std::to_string(i) + "] is empty");
        const int32_t x = draft[i];
        if (x < 0 || x >= q[i].n_vocab()) {
            throw std::invalid_argument("accept_drafts: draft[" + std::to_string(i) + "] = " +
                                        std::to_string(x) + " is outside q's vocabulary [0, " +
                                        std::to_string(q[i].n_vocab()) + ")");
        }
        if (!(q[i].prob(x) > 0.0)) {
            throw std::invalid_argument(
                "accept_drafts: q[" + std::to_string(i) + "](draft[" + std::to_string(i) + "] = " +
                std::to_string(x) +
                ") = 0, so the draft cannot have been sampled from q; q must be the "
                "distribution the draft was actually drawn from");
        }
    }

    for (int32_t i = 0; i < n; ++i) {
        const int32_t x = draft[i];
        switch (variant) {
            case AcceptVariant::kAcceptAll:  // TEST-ONLY negative control
                continue;
            case AcceptVariant::kSampleAndMatch: {  // TEST-ONLY negative control
                const int32_t y = p[i].sample(rng.uniform());
                if (y == x) continue;
                return {i, y};
            }
            case AcceptVariant::kCorrect:
            case AcceptVariant::kResidualIsP: {
                const double px = p[i].prob(x);
                const double qx = q[i].prob(x);
                const double u = rng.uniform();
                // Accept iff u < p/q. The explicit p >= q keeps "p = q never rejects" exact
                // (u * q can round up to q for u = 1 - 2^-53).
                if (px >= qx || u * qx < px) continue;
                const double u2 = rng.uniform();
                const int32_t y = variant == AcceptVariant::kCorrect
                                      ? sample_residual(p[i], q[i], u2)
                                      : p[i].sample(u2);  // TEST-ONLY negative control
                return {i, y};
            }
        }
        throw std::invalid_argument("accept_drafts: unknown variant");
    }
    return {n, p[n].sample(rng.uniform())};
}

}  // namespace pyspec
