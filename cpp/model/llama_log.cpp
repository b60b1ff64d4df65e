#include "model/llama_log.h"

#include <ggml.h>
#include <llama.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/utf8.h"

namespace pyspec {

namespace {

std::mutex g_log_mutex;
std::string g_last_error;            // accumulated text of the latest error message
std::atomic<int> g_verbose_models{0};
std::atomic<void (*)(const char*)> g_observer{nullptr};
ggml_log_level g_prev_level = GGML_LOG_LEVEL_NONE;
// What llama.cpp chose for flash attention "auto" while this thread created a
// context (llama.h has no getter; the choice is only logged): 1 on, 0 off, -1 unsaid.
thread_local int32_t t_flash_attn_chosen = -1;

void note_flash_attn(const char* text) {
    if (!std::strstr(text, "Flash Attention")) return;
    if (std::strstr(text, "Flash Attention enabled")) t_flash_attn_chosen = 1;
    else if (std::strstr(text, "not supported")) t_flash_attn_chosen = 0;
}

thread_local std::vector<std::pair<std::string, double>> t_weight_buffers;

void note_weight_buffer(const char* text) {
    static constexpr const char* kMarker = " model buffer size = ";
    const char* marker = std::strstr(text, kMarker);
    const char* colon = std::strchr(text, ':');
    if (!marker || !colon || colon > marker) return;
    std::string name(colon + 1, marker);
    name.erase(0, name.find_first_not_of(' '));
    double mib = 0.0;
    if (!name.empty() && std::sscanf(marker + std::strlen(kMarker), "%lf", &mib) == 1) {
        t_weight_buffers.emplace_back(name, mib);
    }
}

// Called from C frames inside llama.cpp: nothing may escape it.
void log_callback(ggml_log_level level, const char* text, void*) noexcept {
    if (text == nullptr) return;
    try {
        if (level == GGML_LOG_LEVEL_CONT) level = g_prev_level;
        else g_prev_level = level;
        note_flash_attn(text);
        note_weight_buffer(text);
        if (auto observer = g_observer.load()) observer(text);
        if (level == GGML_LOG_LEVEL_ERROR) {
            std::lock_guard<std::mutex> lock(g_log_mutex);
            if (g_last_error.size() < 4096) g_last_error += text;
        }
    } catch (...) {  // out of memory for the message: drop it
    }
    // Errors reach the user through our exception messages; the rest is noise
    // unless someone asked for verbose output.
    if (g_verbose_models.load() > 0) {
        std::fputs(text, stderr);
    }
}

}  // namespace

void install_log_filter() { llama_log_set(log_callback, nullptr); }

void count_verbose_model(int delta) { g_verbose_models += delta; }

void forget_flash_attn_choice() { t_flash_attn_chosen = -1; }

int32_t logged_flash_attn_choice() { return t_flash_attn_chosen; }

void forget_weight_buffers() { t_weight_buffers.clear(); }

std::vector<std::pair<std::string, double>> logged_weight_buffers() { return t_weight_buffers; }

void set_log_observer(void (*observer)(const char* text)) { g_observer.store(observer); }

std::string take_last_llama_error() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::string out;
    out.swap(g_last_error);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    // Its text quotes the file (key and tensor names): bytes that are not UTF-8
    // would make the Python exception fail to build (UnicodeDecodeError).
    return utf8_sanitize(out);
}

}  // namespace pyspec
