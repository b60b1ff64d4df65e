// llama.cpp/ggml logging, routed through one callback: errors are remembered
// (and appear in our exception messages); the rest is printed only while a
// model that asked for verbose output exists.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pyspec {

void install_log_filter();
// The latest error text llama.cpp logged (cleared; invalid UTF-8 replaced).
std::string take_last_llama_error();
// A function that sees every log line before the filter (nullptr: none); used to
// follow llama_model_quantize, which reports progress only in its log.
void set_log_observer(void (*observer)(const char* text));
// Verbose models alive: +1 when one is created, -1 when it goes.
void count_verbose_model(int delta);
// What llama.cpp chose for flash attention "auto" while this thread created a
// context (llama.h has no getter; the choice is only logged): 1 on, 0 off, -1
// unsaid. Forget before creating the context, read after.
void forget_flash_attn_choice();
int32_t logged_flash_attn_choice();
// The weight buffers llama.cpp reported while this thread loaded a model
// ("load_tensors: CPU_REPACK model buffer size = 540.00 MiB"): name and MiB.
// Forget before loading, read after.
void forget_weight_buffers();
std::vector<std::pair<std::string, double>> logged_weight_buffers();

}  // namespace pyspec
