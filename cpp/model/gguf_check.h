// Checks of a GGUF file before llama.cpp loads it: the common mistakes get a
// precise message, and files llama.cpp would abort or crash on are refused.
// Both throw ModelNotFoundError / InvalidModelError naming the file.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pyspec {

// The file exists and starts with the GGUF magic.
void check_gguf_file(const std::string& path);
// Metadata llama.cpp asserts on (an abort) or crashes on later: tensor
// alignment and types, layer and expert counts, norm epsilons, repeated tokens;
// read with ggml's own bounds-checked GGUF reader (the header only).
// for_quantize: also what llama_model_quantize asserts or crashes on (4-D tensors,
// tensors with a dimension of 0, an empty metadata key).
void check_gguf_metadata(const std::string& path, bool for_quantize);
// The header's key-values in file order, as text, as llama.cpp renders them for
// llama_model_meta_val_str (integers and floats by std::to_string, booleans
// "true"/"false", strings as they are); arrays (the vocabulary ...) left out.
// Read with ggml's bounds-checked reader; InvalidModelError for a damaged header.
std::vector<std::pair<std::string, std::string>> gguf_metadata(const std::string& path);

}  // namespace pyspec
