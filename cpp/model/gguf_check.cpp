#include "model/gguf_check.h"

#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <unordered_set>

#include "core/errors.h"
#include "core/utf8.h"

namespace pyspec {

void check_gguf_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f.good()) {
        throw ModelNotFoundError("model file not found: " + path);
    }
    char magic[4] = {0, 0, 0, 0};
    f.read(magic, 4);
    if (f.gcount() < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        throw InvalidModelError("not a GGUF file (bad magic bytes): " + path);
    }
}

namespace {

// ggml's CPU backend aborts the process (GGML_ASSERT "buffer pointer must be
// aligned") on a mapped file whose tensor data does not start at a multiple of
// this many bytes (TENSOR_ALIGNMENT): a GGUF file with general.alignment under
// 32 can be laid out so.
constexpr size_t kTensorAlignment = 32;
// llama.cpp's limits, checked by GGML_ASSERT (an abort) in its loader (llama-hparams.h).
constexpr int64_t kMaxLayers = 512;
constexpr int64_t kMaxExperts = 1024;

using GgufPtr = std::unique_ptr<gguf_context, decltype(&gguf_free)>;

// The integer value of `key` (any integer type; the largest element of an
// integer array), or `absent` where the key is missing or not an integer: a
// wrong type is the loader's to report, with its own reason.
int64_t gguf_int(const gguf_context* g, const std::string& key, int64_t absent) {
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0) return absent;
    gguf_type type = gguf_get_kv_type(g, id);
    const bool array = type == GGUF_TYPE_ARRAY;
    if (array) type = gguf_get_arr_type(g, id);
    const bool integer = (type >= GGUF_TYPE_UINT8 && type <= GGUF_TYPE_INT32) || type == GGUF_TYPE_UINT64 ||
                         type == GGUF_TYPE_INT64;
    if (!integer) return absent;  // gguf_get_val_data asserts (aborts) on a string: integers only
    const size_t n = array ? gguf_get_arr_n(g, id) : 1;
    if (array && n == 0) return absent;
    int64_t best = INT64_MIN;
    for (size_t i = 0; i < n; ++i) {
        const void* at = array ? static_cast<const char*>(gguf_get_arr_data(g, id)) : gguf_get_val_data(g, id);
        int64_t v;
        switch (type) {
            case GGUF_TYPE_UINT8: v = static_cast<const uint8_t*>(at)[i]; break;
            case GGUF_TYPE_INT8: v = static_cast<const int8_t*>(at)[i]; break;
            case GGUF_TYPE_UINT16: v = static_cast<const uint16_t*>(at)[i]; break;
            case GGUF_TYPE_INT16: v = static_cast<const int16_t*>(at)[i]; break;
            case GGUF_TYPE_UINT32: v = static_cast<const uint32_t*>(at)[i]; break;
            case GGUF_TYPE_INT32: v = static_cast<const int32_t*>(at)[i]; break;
            case GGUF_TYPE_UINT64: v = static_cast<int64_t>(std::min<uint64_t>(static_cast<const uint64_t*>(at)[i], INT64_MAX)); break;
            case GGUF_TYPE_INT64: v = static_cast<const int64_t*>(at)[i]; break;
            default: return absent;
        }
        best = std::max(best, v);
    }
    return best;
}

[[noreturn]] void refuse(const std::string& path, const std::string& problem) {
    throw InvalidModelError("unsupported or corrupt GGUF file " + path + ": " + problem +
                            " (llama.cpp would abort the process on it)");
}

}  // namespace

void check_gguf_metadata(const std::string& path, bool for_quantize) {
    // The header only (no_alloc); the context holds the tensors' shapes.
    ggml_context* shapes = nullptr;
    gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/&shapes};
    GgufPtr owned(gguf_init_from_file(path.c_str(), params), gguf_free);
    std::unique_ptr<ggml_context, decltype(&ggml_free)> owned_shapes(shapes, ggml_free);
    const gguf_context* g = owned.get();
    if (!g) return;  // not readable as GGUF: the loader says why
    const size_t data = gguf_get_data_offset(g);
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const std::string name = utf8_sanitize(gguf_get_tensor_name(g, i));
        const size_t at = data + gguf_get_tensor_offset(g, i);
        if (at % kTensorAlignment != 0) {
            refuse(path, "the data of tensor '" + name + "' starts at byte " + std::to_string(at) +
                             ", not a multiple of " + std::to_string(kTensorAlignment) +
                             " (general.alignment = " + std::to_string(gguf_get_alignment(g)) + ")");
        }
        // Types of activations and indices, not of weights: the CPU backend has no
        // kernels to multiply by them (a crash in the first decode).
        const ggml_type type = gguf_get_tensor_type(g, i);
        if (type == GGML_TYPE_Q8_1 || type == GGML_TYPE_Q8_K || (type >= GGML_TYPE_I8 && type <= GGML_TYPE_F64)) {
            refuse(path, "tensor '" + name + "' has type " + ggml_type_name(type) + ", which is not a weight type");
        }
        // llama_model_quantize sizes a tensor by its first three dimensions only,
        // and divides by the first (a row's length): an empty one is a SIGFPE.
        const ggml_tensor* t = shapes ? ggml_get_tensor(shapes, gguf_get_tensor_name(g, i)) : nullptr;
        if (for_quantize && t != nullptr && t->ne[3] > 1) {
            refuse(path, "tensor '" + name + "' has 4 dimensions, which llama_model_quantize cannot quantize");
        }
        if (for_quantize && t != nullptr && ggml_nelements(t) == 0) {
            refuse(path, "tensor '" + name + "' has a dimension of 0 (no elements)");
        }
    }
    // Norm epsilons (layer_norm_epsilon, layer_norm_rms_epsilon, ...): ggml's CPU
    // norms assert eps >= 0 at the first decode, so a negative or NaN one aborts.
    for (int64_t k = 0; k < gguf_get_n_kv(g); ++k) {
        const std::string key = gguf_get_key(g, k);
        // llama_model_quantize copies every key into the new file, and ggml's
        // GGUF writer asserts that none is empty (an abort).
        if (for_quantize && key.empty()) refuse(path, "metadata key " + std::to_string(k) + " is empty");
        if (key.size() < 7 || key.compare(key.size() - 7, 7, "epsilon") != 0) continue;
        double eps = 0.0;
        if (gguf_get_kv_type(g, k) == GGUF_TYPE_FLOAT32) eps = gguf_get_val_f32(g, k);
        else if (gguf_get_kv_type(g, k) == GGUF_TYPE_FLOAT64) eps = gguf_get_val_f64(g, k);
        if (!(eps >= 0.0) || !std::isfinite(eps)) {
            refuse(path, utf8_sanitize(key) + " = " + std::to_string(eps) + " is not a finite number >= 0");
        }
    }
    const int64_t arch_id = gguf_find_key(g, "general.architecture");
    if (arch_id >= 0 && gguf_get_kv_type(g, arch_id) == GGUF_TYPE_STRING) {
        const std::string arch = gguf_get_val_str(g, arch_id);
        auto count = [&](const char* name, int64_t absent) { return gguf_int(g, arch + "." + name, absent); };
        auto need = [&](bool ok, const std::string& what) {
            if (!ok) refuse(path, utf8_sanitize(arch) + "." + what);
        };
        const int64_t layers = count("block_count", 1);
        need(layers >= 1 && layers <= kMaxLayers,
             "block_count = " + std::to_string(layers) + " is outside [1, " + std::to_string(kMaxLayers) + "]");
        need(count("nextn_predict_layers", 0) <= layers, "nextn_predict_layers exceeds block_count");
        const int64_t experts = count("expert_count", 0), used = count("expert_used_count", 0);
        const int64_t groups = count("expert_group_count", 0), groups_used = count("expert_group_used_count", 0);
        need(experts >= 0 && experts <= kMaxExperts,
             "expert_count = " + std::to_string(experts) + " is outside [0, " + std::to_string(kMaxExperts) + "]");
        need(used >= 0 && used <= experts, "expert_used_count = " + std::to_string(used) + " exceeds expert_count");
        if (experts > 0) {
            need(used > 0, "expert_used_count is 0 with experts");
            need(groups >= 0 && groups < experts, "expert_group_count is not below expert_count");
            if (groups > 1) {
                need(experts % groups == 0, "expert_count is not a multiple of expert_group_count");
                need(groups_used > 0 && groups_used < groups, "expert_group_used_count is outside [1, groups)");
            }
        } else {
            need(used == 0 && groups == 0, "expert_used_count or expert_group_count set without experts");
        }
    }
    const int64_t tokens = gguf_find_key(g, "tokenizer.ggml.tokens");
    if (tokens >= 0 && gguf_get_kv_type(g, tokens) == GGUF_TYPE_ARRAY &&
        gguf_get_arr_type(g, tokens) == GGUF_TYPE_STRING) {
        std::unordered_set<std::string> seen;
        const size_t n = gguf_get_arr_n(g, tokens);
        seen.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            // As llama.cpp's vocabulary names them before it asserts uniqueness: an
            // empty text becomes "[EMPTY_<id>]" (several empty tokens load fine).
            std::string text = gguf_get_arr_str(g, tokens, i);
            if (text.empty()) text = "[EMPTY_" + std::to_string(i) + "]";
            if (!seen.insert(text).second) {
                refuse(path, "token " + std::to_string(i) + " of tokenizer.ggml.tokens repeats an earlier one ('" +
                                 utf8_sanitize(text) + "')");
            }
        }
    }
}

std::vector<std::pair<std::string, std::string>> gguf_metadata(const std::string& path) {
    check_gguf_file(path);
    gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/nullptr};
    GgufPtr owned(gguf_init_from_file(path.c_str(), params), gguf_free);
    const gguf_context* g = owned.get();
    if (!g) throw InvalidModelError("truncated or corrupt GGUF header: " + path);
    std::vector<std::pair<std::string, std::string>> out;
    for (int64_t i = 0; i < gguf_get_n_kv(g); ++i) {
        std::string value;
        switch (gguf_get_kv_type(g, i)) {
            case GGUF_TYPE_UINT8: value = std::to_string(gguf_get_val_u8(g, i)); break;
            case GGUF_TYPE_INT8: value = std::to_string(gguf_get_val_i8(g, i)); break;
            case GGUF_TYPE_UINT16: value = std::to_string(gguf_get_val_u16(g, i)); break;
            case GGUF_TYPE_INT16: value = std::to_string(gguf_get_val_i16(g, i)); break;
            case GGUF_TYPE_UINT32: value = std::to_string(gguf_get_val_u32(g, i)); break;
            case GGUF_TYPE_INT32: value = std::to_string(gguf_get_val_i32(g, i)); break;
            case GGUF_TYPE_UINT64: value = std::to_string(gguf_get_val_u64(g, i)); break;
            case GGUF_TYPE_INT64: value = std::to_string(gguf_get_val_i64(g, i)); break;
            case GGUF_TYPE_FLOAT32: value = std::to_string(gguf_get_val_f32(g, i)); break;
            case GGUF_TYPE_FLOAT64: value = std::to_string(gguf_get_val_f64(g, i)); break;
            case GGUF_TYPE_BOOL: value = gguf_get_val_bool(g, i) ? "true" : "false"; break;
            case GGUF_TYPE_STRING: value = utf8_sanitize(gguf_get_val_str(g, i)); break;
            default: continue;  // arrays
        }
        out.emplace_back(utf8_sanitize(gguf_get_key(g, i)), std::move(value));
    }
    return out;
}

}  // namespace pyspec
