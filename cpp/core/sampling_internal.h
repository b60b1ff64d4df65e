// Helpers the sampling files share (distribution.cpp, logits.cpp, infill.cpp); not part of
// the interface (sampling.h).
#pragma once

#include <cmath>
#include <cstdint>

namespace pyspec::detail {

void check_n_vocab(int32_t n_vocab);  // std::invalid_argument unless n_vocab > 0

// Candidate order: higher logit first, then lower id (ties broken the same way
// everywhere, so that greedy and the truncations agree on which token is first).
inline bool better(float la, int32_t ia, float lb, int32_t ib) {
    return la > lb || (la == lb && ia < ib);
}

// T = 1 probability relative to the max: p(x) / p_max = exp(l_x - l_max).
inline double rel(float l, double mx) { return std::exp(static_cast<double>(l) - mx); }

}  // namespace pyspec::detail
