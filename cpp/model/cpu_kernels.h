// The CPU's optional weight layouts ("extra buffer types": ggml's AMX tiles,
// its repacked AVX/NEON kernels), and the one of them that can kill a process.
//
// AMX. A native build of llama.cpp on a Xeon that lists amx_tile compiles
// ggml's AMX kernels, and llama.cpp then puts Q4_0/Q4_K/Q6_K... weights in the
// AMX buffer type. On some VMs the tile instructions fault (SIGILL on an OpenMP
// worker: XTILEDATA permission asked for on the main thread only, llama.cpp
// PR #26954), so the first matmul kills the process. Whether they work is a
// fact of the machine and the build, learnt once by amx_probe() in a child
// process whose death is the answer (pyspec/cpu.py keeps the verdict); a model
// loaded with "AMX" in ModelParams::excluded_buffer_types then keeps every
// other extra buffer type (repacked kernels, ~6 % faster than none) and only
// AMX is left out (overrides_without). Both work on any extra buffer type by
// name, so the tests drive the same path with CPU_REPACK where no AMX is.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct ggml_backend_buffer_type;

namespace pyspec {

// Names of the CPU backend's extra buffer types, in llama.cpp's order of
// preference ("AMX", "CPU_REPACK", ...); empty when the build has none.
std::vector<std::string> cpu_extra_buffer_types();
// Whether any of `names` is an extra buffer type of this build on this CPU.
bool has_extra_buffer_type(const std::vector<std::string>& names);

constexpr const char* kAmxBufferType = "AMX";  // ggml_backend_amx_buffer_type's name

// Multiplies a small Q4_K and a Q8_0 weight (AMX's block-of-256 and
// block-of-32 paths), where the extra buffer type `name` holds them, by one row
// and by 32 rows on n_threads threads, and again from plain memory. Returns ""
// when the results agree, else why not; a CPU that refuses the instructions
// kills the process (run it in a child). Throws std::runtime_error when the
// build has no such buffer type here, or it holds neither weight type.
std::string probe_buffer_type(const std::string& name, int n_threads);

// The process's default for ModelParams::excluded_buffer_types: pyspec/cpu.py
// sets it from the verdict, so that every model of the process, also one made
// through the core directly, leaves out what faults here.
void set_default_excluded_buffer_types(const std::vector<std::string>& names);
std::vector<std::string> default_excluded_buffer_types();

// Per-tensor buffer-type overrides that reproduce llama.cpp's own placement of
// the weights of the GGUF file at `path` minus the `excluded` extra buffer
// types: every matrix that another extra buffer type (CPU_REPACK) can multiply
// goes there, the rest to plain memory (the caller also turns llama.cpp's extra
// buffer types off, so the rest cannot fall back to an excluded one). Patterns
// are anchored regexes grouped by tensor role, so llama.cpp compiles few of them.
struct BufferOverride {
    std::string pattern;
    ggml_backend_buffer_type* buft;
    size_t bytes;  // of the weights it matches, as stored in the file
};
std::vector<BufferOverride> overrides_without(const std::string& path, const std::vector<std::string>& excluded);

}  // namespace pyspec
