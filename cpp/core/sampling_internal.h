// Helpers the sampling files share (distribution.cpp, logits.cpp); not part of
// the interface (sampling.h).
#pragma once

#include <cstdint>

namespace pyspec::detail {

void check_n_vocab(int32_t n_vocab);  // std::invalid_argument unless n_vocab > 0

}  // namespace pyspec::detail
