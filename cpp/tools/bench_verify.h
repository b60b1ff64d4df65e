// A timing harness for the host-side sampling work of one round, used by
// `pyspec check` to show that verification costs little next to a decode.
#pragma once

#include <cstdint>

#include "core/sampling.h"

namespace pyspec {

struct VerifyBench {
    int64_t verify_only_rounds = 0;   // (a) verify only, distributions prepared once
    double verify_only_seconds = 0;
    int64_t full_rounds = 0;          // (b) a whole round: n + 1 target and n draft
    double full_seconds = 0;          //     distributions from logits, draws, verify
    double mean_accepted = 0;
};

// logits_p: (n + 1) x n_vocab, logits_q: n x n_vocab, row-major. Runs (a) and (b)
// for seconds / 2 each.
VerifyBench bench_verify(const float* logits_p, const float* logits_q, int32_t n, int32_t n_vocab,
                         const SamplingParams& params, double seconds, uint64_t seed);

}  // namespace pyspec
