// `pyspec quantize`: a GGUF file to another quantisation type through libllama's
// own llama_model_quantize (no external binaries). llama.cpp reports its progress
// only in its log ("[  12/ 272] blk.1.attn_q.weight ..."); the log filter hands
// those lines to an observer here, so callers can poll quantize_progress().
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pyspec {

// The types offered, by the names llama-quantize uses, with their llama_ftype.
const std::vector<std::pair<std::string, int32_t>>& quantize_types();

struct QuantizeParams {
    std::string input;
    std::string output;             // written as given: the caller makes it atomic (temp name, rename)
    std::string type;               // one of quantize_types()
    int32_t n_threads = 0;          // 0: llama.cpp's choice (all hardware threads)
    bool allow_requantize = false;  // quantize tensors that are already quantized (quality loss)
};

// Blocks until done. Throws std::invalid_argument for an unknown type,
// ModelNotFoundError for a missing input, QuantizeError with llama.cpp's reason
// when it fails. One quantisation at a time per process (a second waits).
void quantize(const QuantizeParams& params);

// (tensors done, tensors in all) of the quantisation under way; (0, 0) before
// llama.cpp has named the first tensor.
std::pair<int32_t, int32_t> quantize_progress();

}  // namespace pyspec
