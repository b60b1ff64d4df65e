#include "core/row.h"

#include <algorithm>
#include <limits>

namespace pyspec {

const std::vector<int32_t>& RowPipeline::window(const Penalties& pen, size_t n_prompt,
                                                const std::vector<int32_t>& history, const int32_t* drafts,
                                                size_t n_drafts, size_t first_draft) {
    const size_t n_hist = history.size(), total = n_hist + n_drafts;
    window_.clear();
    for (size_t j = pen.window_start(n_prompt, total); j < total; ++j) {
        if (j < n_hist) {
            window_.push_back(history[j]);
        } else if (j - n_hist >= first_draft) {
            window_.push_back(drafts[j - n_hist]);
        }
    }
    return window_;
}

const float* RowPipeline::adjusted(const float* logits, int32_t n_vocab, RowMask mask, const Penalties* pen,
                                   const std::vector<int32_t>& window) {
    if (mask.bits != nullptr) {
        mask_logits(logits, n_vocab, mask.bits, mask.n_vocab, masked_);
        logits = masked_.data();
    }
    if (pen != nullptr && pen->active()) {
        apply_penalties(logits, n_vocab, *pen, window.data(), window.size(), penalized_, counts_);
        logits = penalized_.data();
    }
    return logits;
}

void RowPipeline::distribution(const float* logits, int32_t n_vocab, const SamplingParams& sampling,
                               Distribution& out) {
    compute_distribution(logits, n_vocab, sampling, out, ws_);
}

void mask_logits(const float* logits, int32_t n_vocab, const uint32_t* mask, int32_t mask_vocab,
                 std::vector<float>& out) {
    out.resize(static_cast<size_t>(n_vocab));
    const float neg = -std::numeric_limits<float>::infinity();
    const int32_t shared = std::min(n_vocab, mask_vocab);
    for (int32_t i = 0; i < shared; ++i) out[static_cast<size_t>(i)] = mask_allows(mask, i) ? logits[i] : neg;
    for (int32_t i = shared; i < n_vocab; ++i) out[static_cast<size_t>(i)] = neg;
}

}  // namespace pyspec
