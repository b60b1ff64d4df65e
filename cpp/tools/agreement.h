// How a candidate model agrees with a reference model, position by position, over
// one teacher-forced token stream (both models read the same tokens): the numbers
// behind `pyspec agree`. Both models evaluate a chunk of the stream in one decode
// each with logits on every row; each row is then scored from the two contexts'
// own logit buffers, so no vocabulary-sized array leaves C++.
//
// Vocabulary, for the row at position t (predicting tokens[t + 1] from tokens[0..t]):
//   p, q       the reference's and the candidate's next-token distributions.
//   alpha      1 - TV(p, q) = sum_x min(p(x), q(x)), with p and q at the caller's
//              sampling settings (compute_distribution): the probability that a token
//              the candidate drafts is accepted by the reference (the SPEC's rule).
//              Computed as 1 - |p - q|_1 / 2, so identical rows give exactly 1.
//   top1       argmax p == argmax q (lowest id on ties): alpha at T = 0.
//   kl         KL(p1 || q1) in nats, p1 and q1 the full softmaxes at T = 1 (no
//              truncation): what llama-perplexity --kl-divergence reports, so it can be
//              held against published scoreboards. Identical rows give exactly 0.
//   logp_ref,  log p1(tokens[t + 1]) and log q1(tokens[t + 1]): the stream's next
//   logp_cand  token under each model (perplexities, their ratio).
// A row where the candidate's logits are not finite (a broken model) is scored
// alpha = 0, top1 = 0, kl = +inf, logp_cand = -inf and counted in nonfinite; the
// reference must be sound (DecodeError otherwise).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "core/sampling.h"

namespace pyspec {

struct AgreementRows {
    std::vector<double> alpha;      // [n_rows]
    std::vector<uint8_t> top1;      // [n_rows]
    std::vector<double> kl;         // [n_rows]
    std::vector<double> logp_ref;   // [n_rows]
    std::vector<double> logp_cand;  // [n_rows]
    int64_t nonfinite = 0;          // rows where the candidate's logits were NaN or inf
};

// Scores rows first .. tokens.size() - 2 (first >= 0; the rows before `first`, e.g. a
// prompt's, are read but not scored). Uses sequence 0 of both contexts, which are
// cleared before and after. ref and cand may be the same Model (every row then
// agrees exactly). Throws std::invalid_argument for bad arguments, ContextOverflowError
// when the stream does not fit a context, Cancelled when *cancel becomes true.
AgreementRows agreement(Model& ref, Model& cand, const std::vector<int32_t>& tokens, int32_t first,
                        const SamplingParams& sampling, const std::atomic<bool>* cancel = nullptr);

}  // namespace pyspec
