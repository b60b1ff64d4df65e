// The generation loop. Plain decoding today: one target decode per token, with
// the distribution computed by the sampling core (sampling.h), text streamed
// through TextStream, and stop conditions shared with the speculative loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model.h"
#include "rng.h"
#include "sampling.h"

namespace pyspec {

struct GenerateParams {
    int32_t max_tokens = 256;
    SamplingParams sampling;
    uint64_t seed = 0;
    std::vector<std::string> stop;
};

struct GenerationStats {
    int32_t n_prompt_tokens = 0;
    int32_t n_generated = 0;
    double prompt_s = 0;      // prompt processing
    double ttft_s = 0;        // call start -> first token sampled
    double decode_s = 0;      // first token -> last token
    double decode_tok_s = 0;  // (n_generated - 1) / decode_s
    // Speculative fields (zero in plain generation).
    int32_t rounds = 0;
    int32_t drafted = 0;
    int32_t accepted = 0;
    double draft_s = 0;
    double verify_s = 0;
    double overhead_s = 0;    // host work: sampling math, bookkeeping, callbacks
};

struct GenerateResult {
    std::vector<int32_t> tokens;
    std::string text;
    std::string stop_reason;  // "eog", "max_tokens", "stop", "context", "cancelled"
    GenerationStats stats;
};

// Called once per emitted token with the text that became safe to show.
// Return false to stop generating (stop_reason "cancelled").
using TokenCallback = std::function<bool(int32_t token, const std::string& text)>;

class Generator {
public:
    explicit Generator(Model& target);

    GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                            const TokenCallback& on_token);

private:
    Model& target_;
    Distribution dist_;
    SamplingWorkspace ws_;
};

}  // namespace pyspec
