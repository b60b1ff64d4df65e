#include "tools/quantize.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include "core/errors.h"
#include "llama.h"
#include "model/gguf_check.h"
#include "model/llama_log.h"
#include "model/model.h"

namespace pyspec {

namespace {

std::mutex g_quantize_mutex;
std::atomic<int32_t> g_done{0};
std::atomic<int32_t> g_total{0};

// llama_model_quantize logs one "[%4d/%4d] name - [shape], type = ..." line per tensor.
void observe(const char* text) {
    int done = 0, total = 0;
    if (text[0] == '[' && std::sscanf(text, "[%d/%d]", &done, &total) == 2 && total > 0) {
        g_total.store(total);
        g_done.store(done);
    }
}

struct ObserverScope {
    ObserverScope() {
        g_done.store(0);
        g_total.store(0);
        set_log_observer(observe);
    }
    ~ObserverScope() { set_log_observer(nullptr); }
};

}  // namespace

const std::vector<std::pair<std::string, int32_t>>& quantize_types() {
    static const std::vector<std::pair<std::string, int32_t>> types = {
        {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K},
        {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M},
        {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
    };
    return types;
}

void quantize(const QuantizeParams& params) {
    int32_t ftype = -1;
    std::string names;
    for (const auto& [name, value] : quantize_types()) {
        if (name == params.type) ftype = value;
        names += (names.empty() ? "" : ", ") + name;
    }
    if (ftype < 0) throw std::invalid_argument("unknown quantisation type '" + params.type + "' (one of " + names + ")");
    if (!std::ifstream(params.input, std::ios::binary)) throw ModelNotFoundError("no such model file: " + params.input);
    check_gguf_metadata(params.input, true);

    llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.ftype = static_cast<llama_ftype>(ftype);
    qp.nthread = params.n_threads;
    qp.allow_requantize = params.allow_requantize;

    std::lock_guard<std::mutex> lock(g_quantize_mutex);
    install_log_filter();
    take_last_llama_error();  // a stale message must not become this call's reason
    ObserverScope observer;
    if (llama_model_quantize(params.input.c_str(), params.output.c_str(), &qp) != 0) {
        std::string reason = take_last_llama_error();
        // llama.cpp prefixes its own function name: keep what the user can act on.
        const std::string tag = "failed to quantize: ";
        if (const auto at = reason.find(tag); at != std::string::npos) reason = reason.substr(at + tag.size());
        // Its reasons do not say which file: name it, as the model loader's errors do.
        throw QuantizeError("cannot quantize " + params.input + ": " +
                            (reason.empty() ? std::string("llama_model_quantize failed") : reason));
    }
}

std::pair<int32_t, int32_t> quantize_progress() { return {g_done.load(), g_total.load()}; }

}  // namespace pyspec
