#include "model/cpu_kernels.h"

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml.h>
#include <gguf.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace pyspec {
namespace {

ggml_backend_dev_t cpu_device() {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) throw std::runtime_error("this llama.cpp build has no CPU backend");
    return dev;
}

// The CPU device's extra buffer types, NULL-terminated as ggml returns them
// (through its registry: the function is not part of the linked API).
std::vector<ggml_backend_buffer_type_t> extra_bufts() {
    std::vector<ggml_backend_buffer_type_t> out;
    ggml_backend_dev_t dev = cpu_device();
    auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
    if (!get) return out;
    for (ggml_backend_buffer_type_t* b = get(dev); b && *b; ++b) out.push_back(*b);
    return out;
}

ggml_backend_buffer_type_t find_extra(const std::string& name) {
    for (ggml_backend_buffer_type_t b : extra_bufts()) {
        if (name == ggml_backend_buft_name(b)) return b;
    }
    return nullptr;
}

constexpr int kProbeK = 512, kProbeN = 128;  // AMX wants N % 32 and K % 256 (K-quants)

using ContextPtr = std::unique_ptr<ggml_context, decltype(&ggml_free)>;
using BufferPtr = std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)>;
using BackendPtr = std::unique_ptr<ggml_backend, decltype(&ggml_backend_free)>;

ContextPtr meta_context(size_t n_tensors, bool with_graph) {
    ggml_init_params p = {ggml_tensor_overhead() * n_tensors + (with_graph ? ggml_graph_overhead() : 0), nullptr,
                          /*no_alloc=*/true};
    return ContextPtr(ggml_init(p), ggml_free);
}

// y = W x for a K x N weight of `type` held in `weights` memory and `rows`
// input rows, on the CPU backend with n_threads threads. Inputs are fixed
// smooth functions, so two placements of W can be compared.
std::vector<float> multiply(ggml_backend_buffer_type_t weights, ggml_type type, int rows, int n_threads) {
    constexpr int K = kProbeK, N = kProbeN;
    ggml_backend_dev_t dev = cpu_device();
    ContextPtr wctx = meta_context(1, false), xctx = meta_context(2, true);
    ggml_tensor* w = ggml_new_tensor_2d(wctx.get(), type, K, N);
    ggml_tensor* x = ggml_new_tensor_2d(xctx.get(), GGML_TYPE_F32, K, rows);
    ggml_tensor* y = ggml_mul_mat(xctx.get(), w, x);
    BufferPtr wbuf(ggml_backend_alloc_ctx_tensors_from_buft(wctx.get(), weights), ggml_backend_buffer_free);
    BufferPtr xbuf(ggml_backend_alloc_ctx_tensors_from_buft(xctx.get(), ggml_backend_dev_buffer_type(dev)),
                   ggml_backend_buffer_free);
    if (!wbuf || !xbuf) throw std::runtime_error("could not allocate the probe's tensors");
    ggml_backend_buffer_set_usage(wbuf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    std::vector<float> wf(static_cast<size_t>(K) * N), xf(static_cast<size_t>(K) * rows);
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = std::sin(0.37f * static_cast<float>(i)) * 0.5f;
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = std::cos(0.11f * static_cast<float>(i));
    std::vector<uint8_t> q(ggml_row_size(type, K) * N);
    ggml_quantize_chunk(type, wf.data(), q.data(), 0, N, K, nullptr);
    ggml_backend_tensor_set(w, q.data(), 0, q.size());
    ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * sizeof(float));

    BackendPtr backend(ggml_backend_dev_init(dev, nullptr), ggml_backend_free);
    if (!backend) throw std::runtime_error("could not start the CPU backend");
    auto set_threads = reinterpret_cast<ggml_backend_set_n_threads_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads"));
    if (set_threads) set_threads(backend.get(), std::max(1, n_threads));  // the tiles fault on worker threads
    ggml_cgraph* graph = ggml_new_graph(xctx.get());
    ggml_build_forward_expand(graph, y);
    if (ggml_backend_graph_compute(backend.get(), graph) != GGML_STATUS_SUCCESS) {
        throw std::runtime_error("the probe's matmul failed to compute");
    }
    std::vector<float> out(static_cast<size_t>(N) * rows);
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    return out;
}

// Roles of the weights llama.cpp multiplies (GGML_OP_MUL_MAT) and an extra
// buffer type may hold; token_embd is read by row (GET_ROWS, also when tied
// to the output) and stays in plain memory, as llama.cpp keeps it.
bool is_matmul_weight(const std::string& role) {
    static const std::set<std::string> roles = {
        "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_up", "ffn_down", "ffn_gate",
        "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_shexp"};
    return roles.count(role) > 0;
}

// Whether `buft` can hold weight `w` for a matmul on the CPU: what llama.cpp
// asks when it places a weight (a 512-row activation, a 0-byte buffer).
bool holds_matmul(ggml_backend_buffer_type_t buft, const ggml_tensor* w) {
    ContextPtr ctx = meta_context(3, false);
    ggml_tensor* weight = ggml_new_tensor(ctx.get(), w->type, GGML_MAX_DIMS, w->ne);
    ggml_tensor* x = ggml_new_tensor_4d(ctx.get(), GGML_TYPE_F32, w->ne[0], 512, w->ne[2], w->ne[3]);
    ggml_tensor* op = ggml_mul_mat(ctx.get(), weight, x);
    BufferPtr probe(ggml_backend_buft_alloc_buffer(buft, 0), ggml_backend_buffer_free);
    weight->buffer = probe.get();
    const bool ok = ggml_backend_dev_supports_op(cpu_device(), op);
    weight->buffer = nullptr;
    return ok;
}

std::string regex_escape(const std::string& s) {
    static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
    return std::regex_replace(s, special, R"(\$&)");
}

}  // namespace

std::vector<std::string> cpu_extra_buffer_types() {
    std::vector<std::string> names;
    for (ggml_backend_buffer_type_t b : extra_bufts()) names.emplace_back(ggml_backend_buft_name(b));
    return names;
}

namespace {
std::mutex g_default_mutex;
std::vector<std::string> g_default_excluded;
}  // namespace

void set_default_excluded_buffer_types(const std::vector<std::string>& names) {
    std::lock_guard<std::mutex> lock(g_default_mutex);
    g_default_excluded = names;
}

std::vector<std::string> default_excluded_buffer_types() {
    std::lock_guard<std::mutex> lock(g_default_mutex);
    return g_default_excluded;
}

bool has_extra_buffer_type(const std::vector<std::string>& names) {
    for (const std::string& name : names) {
        if (find_extra(name)) return true;
    }
    return false;
}

std::string probe_buffer_type(const std::string& name, int n_threads) {
    ggml_backend_buffer_type_t extra = find_extra(name);
    if (!extra) throw std::runtime_error("this build has no " + name + " buffer type on this CPU: nothing to probe");
    ggml_backend_buffer_type_t plain = ggml_backend_dev_buffer_type(cpu_device());
    int probed = 0;
    for (ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q8_0}) {
        ContextPtr ctx = meta_context(1, false);
        if (!holds_matmul(extra, ggml_new_tensor_2d(ctx.get(), type, kProbeK, kProbeN))) continue;
        ++probed;
        for (int rows : {1, 32}) {  // one row takes AMX's AVX-512 path, a batch its tiles
            const std::vector<float> got = multiply(extra, type, rows, n_threads);
            const std::vector<float> want = multiply(plain, type, rows, n_threads);
            float scale = 0.0f, worst = 0.0f;
            for (size_t i = 0; i < want.size(); ++i) {
                scale = std::max(scale, std::fabs(want[i]));
                worst = std::max(worst, std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) : INFINITY);
            }
            // Both quantize the activations; they differ in summation order only.
            if (!(worst <= 0.02f * scale + 1e-3f)) {
                return name + " gave wrong results: " + ggml_type_name(type) + " x " +
                       std::to_string(rows) + " rows differ from the plain kernels by " + std::to_string(worst) +
                       " (largest value " + std::to_string(scale) + ")";
            }
        }
    }
    if (probed == 0) throw std::runtime_error(name + " holds neither Q4_K nor Q8_0 weights: nothing to probe");
    return "";
}

std::vector<BufferOverride> overrides_without(const std::string& path, const std::vector<std::string>& excluded) {
    std::vector<ggml_backend_buffer_type_t> others;
    for (ggml_backend_buffer_type_t b : extra_bufts()) {
        if (std::find(excluded.begin(), excluded.end(), ggml_backend_buft_name(b)) == excluded.end()) {
            others.push_back(b);
        }
    }
    ggml_context* shapes = nullptr;
    gguf_init_params params = {/*no_alloc=*/true, /*ctx=*/&shapes};
    std::unique_ptr<gguf_context, decltype(&gguf_free)> g(gguf_init_from_file(path.c_str(), params), gguf_free);
    ContextPtr owned_shapes(shapes, ggml_free);
    std::vector<BufferOverride> out;
    if (!g || !shapes) return out;  // the loader reports an unreadable file

    // (buffer type, role) -> the layers whose weight of that role it holds
    // ("" for output.weight, outside the blocks), and their bytes.
    static const std::regex block_weight(R"(^blk\.([0-9]+)\.([A-Za-z0-9_]+)\.weight$)");
    struct Group {
        std::vector<std::string> layers;
        size_t bytes = 0;
    };
    std::map<std::pair<ggml_backend_buffer_type_t, std::string>, Group> groups;
    for (ggml_tensor* t = ggml_get_first_tensor(shapes); t; t = ggml_get_next_tensor(shapes, t)) {
        const std::string name = ggml_get_name(t);
        std::smatch m;
        std::string layer, role;
        if (std::regex_match(name, m, block_weight) && is_matmul_weight(m[2].str())) {
            layer = m[1].str();
            role = m[2].str();
        } else if (name == "output.weight") {
            role = "output";
        } else {
            continue;
        }
        if (ggml_n_dims(t) != 2) continue;
        ggml_backend_buffer_type_t chosen = nullptr;
        for (ggml_backend_buffer_type_t b : others) {
            if (holds_matmul(b, t)) {
                chosen = b;
                break;
            }
        }
        // Plain memory (not the CPU type, which llama.cpp reads as "choose an
        // extra type"): the caller turns the extra types off, so none is left to choose.
        if (chosen) {
            Group& group = groups[{chosen, role}];
            group.layers.push_back(layer);
            group.bytes += ggml_nbytes(t);
        }
    }
    for (const auto& [key, group] : groups) {
        const auto& [buft, role] = key;
        if (role == "output") {
            out.push_back({"^output\\.weight$", buft, group.bytes});
            continue;
        }
        std::string alternatives;
        for (const std::string& layer : group.layers) alternatives += (alternatives.empty() ? "" : "|") + layer;
        out.push_back({"^blk\\.(" + alternatives + ")\\." + regex_escape(role) + "\\.weight$", buft, group.bytes});
    }
    return out;
}

}  // namespace pyspec
