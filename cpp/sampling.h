// Sampling math: the only place in pyspec that turns logits into probabilities,
// and the lossless speculative verification rule (Leviathan et al. 2023, Alg. 1;
// Chen et al. 2023, Alg. 2). Pure C++: no llama.cpp types, so it can be tested alone.
#pragma once

#include <cstdint>
#include <vector>

#include "rng.h"

namespace pyspec {

// Sampling settings. The order in which they are applied is documented in
// sampling.cpp (it follows llama.cpp's default chain: truncation first, then temperature).
struct SamplingParams {
    double temperature = 1.0;  // 0 = greedy (one-hot on the argmax, lowest id wins ties)
    int32_t top_k = 0;         // 0 = off
    double top_p = 1.0;        // in (0, 1]; 1 = off
    double min_p = 0.0;        // in [0, 1]; 0 = off

    bool greedy() const { return temperature == 0.0; }
    // Throws std::invalid_argument with a clear message for out-of-range settings.
    void validate() const;
};

// A probability vector over a vocabulary of size n_vocab, stored sparsely when the
// support is small (truncated or greedy) and densely (indexed by token id) otherwise.
// Reused across calls: assign() never shrinks capacity, so steady state has no heap churn.
class Distribution {
public:
    int32_t n_vocab() const;
    bool dense() const;
    size_t support_size() const;          // number of tokens with probability > 0 (stored entries)
    double prob(int32_t token) const;     // 0 for tokens outside the support; O(1) dense, O(support) sparse
    int32_t argmax() const;               // most probable token, lowest id on ties
    double entropy() const;               // in nats, over the support
    int32_t sample(double u) const;       // inverse CDF with a uniform u in [0, 1)
    void to_dense(double* out) const;     // writes n_vocab values
    // Sparse view (valid when !dense()): ids and probs of the stored entries.
    const std::vector<int32_t>& ids() const;
    const std::vector<double>& probs() const;
    // Builders used by the module and tests.
    void set_dense(const double* p, int32_t n_vocab);   // copies; caller guarantees sum 1
    void set_one_hot(int32_t token, int32_t n_vocab);
    // ... (private representation left to sampling.cpp's author)
};

// Scratch memory for computing distributions without per-call allocation.
class SamplingWorkspace;  // defined in sampling.cpp's header section, reusable across calls

// logits: n_vocab floats (may contain -inf; NaN is an error -> std::invalid_argument).
// Writes the distribution actually sampled from into `out`.
void compute_distribution(const float* logits, int32_t n_vocab, const SamplingParams& params,
                          Distribution& out /*, SamplingWorkspace& ws */);

// Which acceptance rule to use. Only kCorrect is lossless-and-optimal; the others
// exist for negative-control tests and `pyspec check`.
enum class VerifyVariant {
    kCorrect,          // accept with min(1, p/q), residual max(0, p - q) on rejection
    kResidualIsP,      // WRONG: on rejection sample from p instead of the residual
    kAcceptAll,        // WRONG: accept every draft
    kSampleAndMatch,   // lossless but suboptimal: accept iff a sample from p equals the draft
};

struct VerifyResult {
    int32_t n_accepted;   // drafts accepted, 0..n
    int32_t next_token;   // residual sample on rejection, bonus sample if all accepted
};

// One verification round. p: n+1 target distributions, q: n draft distributions,
// draft: the n proposed tokens. q[i].prob(draft[i]) must be > 0 (std::invalid_argument).
VerifyResult verify(const Distribution* p, const Distribution* q, const int32_t* draft, int32_t n,
                    Rng& rng, VerifyVariant variant = VerifyVariant::kCorrect);

}  // namespace pyspec
