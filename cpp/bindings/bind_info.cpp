// Facts about the llama.cpp build this extension runs against: which libllama
// file is mapped, which ggml backends and devices it registered, whether it can
// offload to a GPU, and its context defaults. `pyspec info` (pyspec/tools/info.py)
// reads them; nothing here touches a model.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ggml-backend.h>
#include <llama.h>

#include <string>

#if !defined(_WIN32)
#include <dlfcn.h>
#endif

#include "bindings/bind.h"
#include "model/compute_thread.h"
#include "model/cpu_kernels.h"
#include "model/devices.h"
#include "model/fatal_signals.h"

namespace py = pybind11;

namespace {

const char* device_type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        case GGML_BACKEND_DEVICE_TYPE_META: return "meta";
    }
    return "unknown";
}

std::string str_or_empty(const char* s) { return s ? std::string(s) : std::string(); }

// The file the dynamic linker resolved a symbol from: the library this process
// really calls, whatever path it was asked for.
std::string library_of(const void* symbol) {
#if !defined(_WIN32)
    Dl_info info;
    if (dladdr(symbol, &info) != 0 && info.dli_fname) return std::string(info.dli_fname);
#else
    (void)symbol;
#endif
    return std::string();
}

py::dict device_dict(ggml_backend_dev_t dev) {
    py::dict d;
    d["name"] = str_or_empty(ggml_backend_dev_name(dev));
    d["description"] = str_or_empty(ggml_backend_dev_description(dev));
    d["type"] = device_type_name(ggml_backend_dev_type(dev));
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    d["backend"] = reg ? str_or_empty(ggml_backend_reg_name(reg)) : std::string();
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    d["memory_free"] = free;
    d["memory_total"] = total;
    return d;
}

}  // namespace

void bind_info(py::module_& m) {
    m.def("supports_gpu_offload", []() { return pyspec::has_local_gpu(); },
          "Whether this build has a local accelerator that can hold model layers (CUDA, Metal, ...); unlike "
          "llama_supports_gpu_offload, an RPC backend alone does not count.");
    m.def("rpc_available", []() { return pyspec::rpc_available(); },
          "llama_supports_rpc(): whether this build has ggml's RPC backend (docs/distributed.md).");
    m.def("rpc_protocol", []() { return pyspec::rpc_protocol(); },
          "The ggml RPC protocol version this build speaks (\"7.0.0\"); empty without RPC.");
    m.def("rpc_endpoint_reachable", &pyspec::endpoint_reachable, py::arg("endpoint"), py::arg("timeout_s") = 1.0,
          py::call_guard<py::gil_scoped_release>(),
          "Whether HOST:PORT accepts a TCP connection within timeout_s.");
    m.def("rpc_worker_problem", &pyspec::rpc_worker_problem, py::arg("endpoint"), py::arg("timeout_s") = 1.0,
          py::call_guard<py::gil_scoped_release>(),
          "'' when the RPC worker at HOST:PORT answers ggml's HELLO within timeout_s with this build's protocol "
          "(what `pyspec serve` probes before it reloads); else why not.");
    m.def("rpc_serve", &pyspec::rpc_serve, py::arg("endpoint"), py::arg("cache_dir") = "", py::arg("n_threads") = 1,
          py::call_guard<py::gil_scoped_release>(),
          "Serve ggml's RPC protocol on HOST:PORT from this machine (`pyspec rpc-server`); blocks until the "
          "process ends, returns only if it cannot listen.");
    m.def("rpc_lost_exit_status", []() { return pyspec::kRpcLostExit; },
          "Exit status of a process whose RPC worker was lost mid-run.");
    m.def("cpu_extra_buffer_types", &pyspec::cpu_extra_buffer_types,
          "Names of the CPU's extra buffer types this build would put weights in, in llama.cpp's order of "
          "preference ([\"AMX\", \"CPU_REPACK\"] on an AMX Xeon); [] when none.");
    m.attr("AMX_BUFFER_TYPE") = pyspec::kAmxBufferType;
    m.def("probe_buffer_type", &pyspec::probe_buffer_type, py::arg("name"), py::arg("n_threads"),
          py::call_guard<py::gil_scoped_release>(),
          "Multiply small Q4_K and Q8_0 weights held in the extra buffer type NAME and in plain memory: '' when "
          "they agree, else why not. A CPU that refuses its instructions kills the process: run it in a child "
          "(pyspec/cpu.py).");
    m.def("buffer_overrides_without",
          [](const std::string& path, const std::vector<std::string>& excluded) {
              py::list out;
              for (const pyspec::BufferOverride& o : pyspec::overrides_without(path, excluded)) {
                  out.append(py::make_tuple(o.pattern, ggml_backend_buft_name(o.buft), o.bytes));
              }
              return out;
          },
          py::arg("path"), py::arg("excluded"),
          "[(tensor-name regex, buffer type, bytes)]: where a model loaded with EXCLUDED left out puts the "
          "weights that another extra buffer type holds (model/cpu_kernels.h); the rest go to plain memory.");
    m.def("set_default_excluded_buffer_types", &pyspec::set_default_excluded_buffer_types, py::arg("names"),
          "The process's default ModelParams.excluded_buffer_types (pyspec/cpu.py sets it from its verdict).");
    m.def("default_excluded_buffer_types", &pyspec::default_excluded_buffer_types);
    m.def("install_fatal_signal_notice", &pyspec::install_fatal_signal_notice,
          "On SIGILL, SIGSEGV, SIGBUS or SIGFPE write one line naming the likely cause, then let the previous "
          "handler act (the CLI installs it).");
    m.def("supports_mmap", []() { return llama_supports_mmap(); });
    m.def("supports_mlock", []() { return llama_supports_mlock(); });
    m.def("max_devices", []() { return llama_max_devices(); });
    m.def("flash_attn_default",
          []() { return std::string(llama_flash_attn_type_name(llama_context_default_params().flash_attn_type)); },
          "llama.cpp's default flash-attention setting for a new context (llama_context_default_params).");
    m.def("libllama_path", []() { return library_of(reinterpret_cast<const void*>(&llama_print_system_info)); },
          "Path of the libllama this extension calls (dladdr); empty where unknown.");
    m.def("libggml_path", []() { return library_of(reinterpret_cast<const void*>(&ggml_backend_reg_count)); },
          "Path of the libggml (backend registry) this extension calls (dladdr); empty where unknown.");
    m.def("backends",
          []() {
              py::list out;
              for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
                  ggml_backend_reg_t reg = ggml_backend_reg_get(i);
                  py::dict d;
                  d["name"] = str_or_empty(ggml_backend_reg_name(reg));
                  py::list devices;
                  for (size_t j = 0; j < ggml_backend_reg_dev_count(reg); ++j) {
                      devices.append(str_or_empty(ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, j))));
                  }
                  d["devices"] = devices;
                  out.append(d);
              }
              return out;
          },
          "The ggml backend registry: [{name, devices: [device names]}].");
    m.def("devices",
          []() {
              py::list out;
              for (size_t i = 0; i < ggml_backend_dev_count(); ++i) out.append(device_dict(ggml_backend_dev_get(i)));
              return out;
          },
          "Every registered ggml device: [{name, description, type, backend, memory_free, memory_total}].");
    m.def("set_compute_thread", &pyspec::compute::set_enabled, py::arg("on"),
          "On (the default): every llama.cpp graph of this process is computed on one thread "
          "(model/compute_thread.h). Off computes on each caller's thread: tests' control only.");
    m.def("on_compute_thread",
          [](py::function fn) {
              py::object out;
              {
                  py::gil_scoped_release release;
                  pyspec::compute::run_void([&] {
                      py::gil_scoped_acquire acquire;
                      out = fn();
                  });
              }
              return out;
          },
          py::arg("fn"),
          "fn() on the compute thread, its result or exception here: for another library's llama.cpp calls in "
          "this process (pyspec/compute.py).");
    m.def("threads_that_computed", &pyspec::compute::threads_that_computed,
          "Distinct OS threads that have computed a llama.cpp graph in this process (1 with the compute thread).");
}
