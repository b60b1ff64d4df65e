// Sampling math: the only place in pyspec that turns logits into probabilities,
// and the lossless accept test of speculative decoding (Leviathan et al. 2023, Alg. 1;
// Chen et al. 2023, Alg. 2). Pure C++: no llama.cpp types, so it can be tested alone.
//
// Errors in arguments (bad settings, NaN logits, a drafted token with q(x) = 0, ...)
// are reported with std::invalid_argument (pybind11 turns it into ValueError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/infill.h"
#include "core/rng.h"

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
//  5b. infill (editor plugins' chains): the rule of core/infill.h on the survivors; it
//     may end the answer (its end token alone) or leave only end-of-generation tokens.
//     It needs top-k (1..256: it compares every pair) and applies to greedy rows too,
//     which then take the argmax of its survivors, not of the whole row.
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

namespace pyspec {

// Sampling settings, applied in the "Order of settings" above (llama.cpp's default
// chain: top-k, top-p, min-p on the T = 1 probabilities, then temperature on the
// survivors).
struct SamplingParams {
    double temperature = 1.0;  // 0 = greedy (one-hot on the argmax, lowest id wins ties)
    int32_t top_k = 0;         // 0 = off
    double top_p = 1.0;        // in (0, 1]; 1 = off
    double min_p = 0.0;        // in [0, 1]; 0 = off
    bool infill = false;       // step 5b; needs infill_vocab when a row is computed
    // The vocabulary step 5b reads: the engine attaches its target's (Model::infill_vocab).
    std::shared_ptr<const InfillVocab> infill_vocab;

    bool greedy() const { return temperature == 0.0; }
    // Throws std::invalid_argument with a clear message for out-of-range settings:
    // temperature NaN, negative or infinite; top_k < 0; top_p NaN or outside (0, 1];
    // min_p NaN or outside [0, 1]; infill without top_k in 1..kInfillMaxCandidates.
    void validate() const;
};

// How a Distribution stores its probabilities.
enum class Storage {
    kAuto,    // sparse when the support is small compared with the vocabulary, else dense
    kDense,   // one double per token id
    kSparse,  // (id, prob) pairs for the tokens with prob > 0, ids strictly increasing
};

class SamplingWorkspace;

// A probability vector over a vocabulary of size n_vocab, stored sparsely when the
// support is small (truncated or greedy) and densely (indexed by token id) otherwise.
// Reused across calls: the builders never shrink capacity, so once a Distribution has
// held its largest content, refilling it does not touch the heap.
//
// Invariants: every stored probability is finite and >= 0; the stored values sum to 1
// up to rounding (the builders check |sum - 1| <= 1e-6); a sparse Distribution stores
// only entries with prob > 0, ids strictly increasing.
class Distribution {
public:
    Distribution() = default;

    int32_t n_vocab() const { return n_vocab_; }
    bool dense() const { return dense_; }
    bool empty() const { return n_vocab_ == 0; }  // true only before the first build
    size_t support_size() const { return support_; }  // number of tokens with prob > 0
    double prob(int32_t token) const;     // 0 outside the support; O(1) dense, O(log support) sparse
    int32_t argmax() const;               // most probable token, lowest id on ties
    // Randomized probability integral transform of `token`: the mass of the
    // tokens before it plus v times its own, tokens ordered `first` (if >= 0),
    // then by decreasing probability, then id. Uniform on (0, 1) when token ~
    // this distribution and v ~ U(0, 1), whatever the distribution and for any
    // order fixed before the draw: a losslessness test that needs no reference
    // law (TestControls::pit). The order makes a wrong sampler's pull (toward a
    // drafted token, toward likely tokens) move u the same way on every row.
    double pit(int32_t token, double v, int32_t first = -1) const;
    double entropy() const;               // in nats, over the support
    // Inverse CDF in token-id order with a uniform u in [0, 1); never returns a token
    // with prob 0.
    int32_t sample(double u) const;
    void to_dense(double* out) const;     // writes n_vocab values
    double total() const { return total_; }  // sum of the stored values (1 up to rounding)

    // Sparse view (meaningful when !dense()): ids (increasing) and probs of the entries.
    const std::vector<int32_t>& ids() const { return ids_; }
    const std::vector<double>& probs() const { return probs_; }
    // Dense view (meaningful when dense()): n_vocab values indexed by token id.
    const std::vector<double>& dense_probs() const { return dense_p_; }

    // Builders. They copy, validate (std::invalid_argument on NaN, inf, negative values,
    // n_vocab <= 0, ids out of range or not increasing, or a sum farther than 1e-6 from 1)
    // and choose the storage (set_dense: always dense; set_sparse: always sparse).
    void set_dense(const double* p, int32_t n_vocab);
    void set_sparse(const int32_t* ids, const double* probs, size_t count, int32_t n_vocab);
    void assign(const double* p, int32_t n_vocab, Storage storage = Storage::kAuto);
    void set_one_hot(int32_t token, int32_t n_vocab);

    // kAuto's rule: sparse iff support * kSparseRatio <= n_vocab.
    static constexpr int32_t kSparseRatio = 8;

private:
    friend void compute_distribution(const float*, int32_t, const SamplingParams&, Distribution&,
                                     SamplingWorkspace&);
    void finish_dense_();   // sets dense_, support_, total_ from dense_p_
    void finish_sparse_();  // sets dense_, support_, total_ from ids_/probs_ (no zeros)

    int32_t n_vocab_ = 0;
    bool dense_ = false;
    size_t support_ = 0;
    double total_ = 0.0;
    std::vector<double> dense_p_;   // size n_vocab_ when dense_
    std::vector<int32_t> ids_;      // when !dense_
    std::vector<double> probs_;     // when !dense_
};

// Scratch memory for compute_distribution, so steady state does not allocate.
// Contents are unspecified between calls; one workspace per thread.
class SamplingWorkspace {
public:
    SamplingWorkspace() = default;

private:
    friend void compute_distribution(const float*, int32_t, const SamplingParams&, Distribution&,
                                     SamplingWorkspace&);
public:  // the types are public so logits.cpp's helpers can name them
    using Candidate = InfillCandidate;  // a logit and its token
    struct Weighted {
        double e;  // exp(logit - max logit)
        float logit;
        int32_t id;
    };

private:
    std::vector<Candidate> cand_;     // top-k heap / survivors
    std::vector<double> e_;           // T = 1 relative probabilities (top-p without top-k)
    std::vector<Weighted> weighted_;  // boundary bucket of top-p without top-k
    std::vector<double> mass_;        // the infill step's scratch
};

// logits: n_vocab floats. -inf marks a forbidden token; NaN or +inf logits, or all
// logits -inf, are errors (std::invalid_argument). Writes the distribution actually
// sampled from (after every setting) into `out`: the "Order of settings" above.
void compute_distribution(const float* logits, int32_t n_vocab, const SamplingParams& params,
                          Distribution& out, SamplingWorkspace& ws);

// What OpenAI's `logprobs` report for one emitted token: its log-probability under
// softmax(logits) at temperature 1 without truncation (the model's own distribution,
// whatever the sampling settings), and the k most likely tokens with theirs, most
// likely first (ties to the lower id). Logits that compute_distribution rejects
// are rejected here too (std::invalid_argument).
struct TokenLogprobs {
    double logprob = 0;
    std::vector<std::pair<int32_t, double>> top;
};
TokenLogprobs token_logprobs(const float* logits, int32_t n_vocab, int32_t token, int32_t k);

// Which acceptance rule to use. Only kCorrect is lossless and optimal. The other three
// are TEST-ONLY negative controls for the statistical tests and `pyspec check`; the
// engine must never use them.
enum class AcceptVariant {
    kCorrect,          // accept with min(1, p/q); on rejection sample max(0, p - q) normalised
    kResidualIsP,      // TEST-ONLY, WRONG: on rejection sample from p instead of the residual
    kAcceptAll,        // TEST-ONLY, WRONG: accept every draft (output follows q, not p)
    kSampleAndMatch,   // TEST-ONLY, suboptimal: draw y ~ p, accept iff y == draft, else emit y.
                       // Preserves p but accepts with prob sum p*q instead of sum min(p, q).
};

// The variants by name ("correct", "residual_is_p", "accept_all", "sample_and_match"),
// in the enum's order; parse_accept_variant throws std::invalid_argument for others.
const std::vector<std::string>& accept_variant_names();
AcceptVariant parse_accept_variant(const std::string& name);

struct AcceptResult {
    int32_t n_accepted;   // drafts accepted, 0..n
    int32_t next_token;   // residual sample on rejection, bonus sample from p[n] if all accepted
};

// The accept test of one round. p: n+1 target distributions, q: n draft distributions,
// draft: the n proposed tokens, draft[i] drawn from q[i]. The p[i] share one n_vocab;
// a q may cover fewer or more ids (a draft model without the target's padding ids, or
// with extra ones): q is 0 where it has no entry, p is 0 past its end, so a draft
// token the target cannot produce is always rejected. q[i].prob(draft[i]) must be > 0. Violations throw std::invalid_argument
// before any random number is drawn. Random numbers used, in order, per position:
// one uniform for the acceptance test, and on rejection one for the replacement; one
// for the bonus token if all drafts are accepted.
AcceptResult accept_drafts(const Distribution* p, const Distribution* q, const int32_t* draft, int32_t n,
                           Rng& rng, AcceptVariant variant = AcceptVariant::kCorrect);

// Residual helpers (used by accept_drafts; exposed for the engine and tests).
// residual_mass(p, q) = sum_x max(0, p(x) - q(x)), visiting only p's support (and q's
// entries there); no pass over the whole vocabulary when both are sparse.
double residual_mass(const Distribution& p, const Distribution& q);
// Below this residual mass, sample_residual falls back to sampling p ("Residual and its
// fallback" above).
constexpr double kResidualMinMass = 1e-12;
// Sample from the normalised residual max(0, p - q) / residual_mass(p, q) by inverse CDF
// in token-id order with one uniform u in [0, 1). Falls back to p.sample(u) when the
// residual mass is below kResidualMinMass. q is 0 past its own n_vocab.
int32_t sample_residual(const Distribution& p, const Distribution& q, double u);

}  // namespace pyspec
