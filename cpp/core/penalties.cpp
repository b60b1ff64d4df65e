#include "core/penalties.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace pyspec {

void Penalties::validate(int32_t n_vocab) const {
    if (!(repeat > 0.0f) || !std::isfinite(repeat)) {
        throw std::invalid_argument("repeat_penalty must be a finite number > 0 (1 = off), got " + std::to_string(repeat));
    }
    if (!std::isfinite(frequency)) throw std::invalid_argument("frequency_penalty must be finite");
    if (!std::isfinite(presence)) throw std::invalid_argument("presence_penalty must be finite");
    if (last_n < -1) {
        throw std::invalid_argument("penalty_last_n must be -1 (all tokens), 0 (off) or a window size, got " +
                                    std::to_string(last_n));
    }
    for (const auto& [token, bias] : logit_bias) {
        if (token < 0 || (n_vocab > 0 && token >= n_vocab)) {
            throw std::invalid_argument("logit_bias names token " + std::to_string(token) + ", outside the vocabulary" +
                                        (n_vocab > 0 ? " [0, " + std::to_string(n_vocab) + ")" : std::string()));
        }
        if (std::isnan(bias) || bias == INFINITY) {
            throw std::invalid_argument("logit_bias for token " + std::to_string(token) +
                                        " must be a number or -inf (forbidden)");
        }
    }
}

size_t Penalties::window_start(size_t n_prompt, size_t history_size) const {
    const size_t first = include_prompt ? 0 : std::min(n_prompt, history_size);
    if (last_n < 0) return first;
    const size_t n = static_cast<size_t>(last_n);
    return history_size - first > n ? history_size - n : first;
}

void apply_penalties(const float* logits, int32_t n_vocab, const Penalties& pen, const int32_t* window, size_t n,
                     std::vector<float>& out, std::vector<int32_t>& counts) {
    out.assign(logits, logits + n_vocab);
    for (const auto& [token, bias] : pen.logit_bias) {
        if (token >= 0 && token < n_vocab) out[static_cast<size_t>(token)] += bias;
    }
    if (!pen.penalizes() || n == 0) return;
    if (counts.size() < static_cast<size_t>(n_vocab)) counts.assign(static_cast<size_t>(n_vocab), 0);
    for (size_t i = 0; i < n; ++i) {
        if (window[i] >= 0 && window[i] < n_vocab) ++counts[static_cast<size_t>(window[i])];
    }
    for (size_t i = 0; i < n; ++i) {  // each distinct token once: its count is zeroed after use
        if (window[i] < 0 || window[i] >= n_vocab) continue;
        const size_t t = static_cast<size_t>(window[i]);
        const int32_t c = counts[t];
        if (c == 0) continue;
        float& l = out[t];
        l = l > 0.0f ? l / pen.repeat : l * pen.repeat;
        l -= static_cast<float>(c) * pen.frequency + pen.presence;
        counts[t] = 0;
    }
}

}  // namespace pyspec
