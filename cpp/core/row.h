// One row's distribution: the pipeline that the target's verification rows (p) and
// the draft model's rows (q) both run, written once so that they cannot part:
//
//   1. the grammar's mask: a constrained request's disallowed tokens become -inf;
//   2. logit biases, then repetition penalties over the row's window (penalties.h);
//   3. the sampling settings' distribution (sampling.h, "Order of settings").
//
// The window of a row is the committed history followed by the tokens drafted
// before the row (penalties.h says why that keeps speculation lossless); window()
// builds it. RowPipeline owns the scratch of all three steps, so steady state does
// not allocate; one pipeline serves one thread (an engine's, a drafter's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/penalties.h"
#include "core/sampling.h"

namespace pyspec {

// Whether bitmask `mask` (bit t of word t / 32) allows token t.
inline bool mask_allows(const uint32_t* mask, int32_t token) {
    return token >= 0 && ((mask[token >> 5] >> (token & 31)) & 1u);
}

// The allowed tokens of a constrained row: a bitmask over n_vocab ids (bits null: none).
struct RowMask {
    const uint32_t* bits = nullptr;
    int32_t n_vocab = 0;
};

class RowPipeline {
public:
    // The window of a row under `pen`: history (its first n_prompt tokens the
    // prompt), then drafts[first_draft, n_drafts) (the row follows drafts
    // 0..n_drafts-1; first_draft > 0 only for a TEST-ONLY wrong window).
    const std::vector<int32_t>& window(const Penalties& pen, size_t n_prompt, const std::vector<int32_t>& history,
                                       const int32_t* drafts, size_t n_drafts, size_t first_draft = 0);
    // Steps 1 and 2: the row's logits (n_vocab) under `mask` and `pen` (null or
    // inactive: skipped) over `window`. The result lives until the next call.
    const float* adjusted(const float* logits, int32_t n_vocab, RowMask mask, const Penalties* pen,
                          const std::vector<int32_t>& window);
    // Step 3 on adjusted logits: std::invalid_argument for logits no distribution has (NaN).
    void distribution(const float* logits, int32_t n_vocab, const SamplingParams& sampling, Distribution& out);

private:
    std::vector<float> masked_;     // a row's logits under the grammar's mask
    std::vector<float> penalized_;  // ... and after biases and penalties
    std::vector<int32_t> window_;   // the tokens the penalties count
    std::vector<int32_t> counts_;   // apply_penalties' scratch
    SamplingWorkspace ws_;
};

// logits (n_vocab floats) with every token `mask` (over mask_vocab ids) does not
// allow set to -inf, into `out`; ids past mask_vocab are forbidden.
void mask_logits(const float* logits, int32_t n_vocab, const uint32_t* mask, int32_t mask_vocab,
                 std::vector<float>& out);

}  // namespace pyspec
