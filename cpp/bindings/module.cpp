// pybind11 module pyspec._core, bound room by room (bind.h lists the parts);
// the typed surface is pyspec/_core.pyi. Structs cross as bound classes built
// from keyword arguments over their C++ defaults (bind_struct.h), so each field
// and default is written once, in its header. Heavy work releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <llama.h>

#include <cstring>
#include <exception>
#include <string>

#include "bindings/bind.h"
#include "bindings/bind_struct.h"
#include "core/errors.h"
#include "core/penalties.h"
#include "core/sampling.h"
#include "model/llama_log.h"
#include "model/model.h"

namespace py = pybind11;
using namespace pyspec;
using pyspec_bind::Struct;

namespace {

// Raise the pyspec.errors class of the same name (it owns the Python hierarchy).
[[noreturn]] void raise_pyspec(const char* name, const char* what) {
    py::object cls = py::module_::import("pyspec.errors").attr(name);
    // llama.cpp's messages may quote a damaged file's bytes: never a UnicodeDecodeError.
    py::object msg = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(what, std::strlen(what), "replace"));
    PyErr_SetObject(cls.ptr(), msg.ptr());
    throw py::error_already_set();
}

// A C++ error type, and the pyspec.errors class it crosses as.
template <class E>
struct Translated {
    const char* name;
};

// Rethrow p; an error of one of the listed types raises its Python class.
template <class E, class... More>
void rethrow_translated(const std::exception_ptr& p, Translated<E> first, Translated<More>... more) {
    try {
        if constexpr (sizeof...(More) == 0) {
            std::rethrow_exception(p);
        } else {
            rethrow_translated(p, more...);
        }
    } catch (const E& e) {
        raise_pyspec(first.name, e.what());
    }
}

void translate_errors(std::exception_ptr p) {
    if (!p) return;
    // Each type is caught as itself (none derives from another, so the order is free).
    rethrow_translated(p, Translated<ModelNotFoundError>{"ModelNotFoundError"},
                       Translated<InvalidModelError>{"InvalidModelError"},
                       Translated<ContextOverflowError>{"ContextOverflowError"},
                       Translated<DecodeError>{"DecodeError"},
                       Translated<IncompatibleModelsError>{"IncompatibleModelsError"},
                       Translated<QuantizeError>{"QuantizeError"},
                       Translated<ConstraintError>{"ConstraintError"},
                       Translated<RpcError>{"RpcError"});
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "pyspec C++ core over llama.cpp";
    llama_backend_init();
    install_log_filter();
    py::register_exception_translator(&translate_errors);
    bind_sampling(m);  // first: later signatures name its Distribution

    Struct<SamplingParams>(m, "SamplingParams", "The target's (or a drafter's) sampling settings.")
        .field("temperature", &SamplingParams::temperature)
        .field("top_k", &SamplingParams::top_k)
        .field("top_p", &SamplingParams::top_p)
        .field("min_p", &SamplingParams::min_p)
        .field("infill", &SamplingParams::infill)
        .done([](const SamplingParams& p) { p.validate(); });
    Struct<Penalties>(m, "Penalties", "Logit biases and repetition penalties, applied before the sampling settings "
                                      "(core/penalties.h).")
        .field("repeat", &Penalties::repeat)
        .field("frequency", &Penalties::frequency)
        .field("presence", &Penalties::presence)
        .field("last_n", &Penalties::last_n)
        .field("include_prompt", &Penalties::include_prompt)
        .field("logit_bias", &Penalties::logit_bias)
        .done([](const Penalties& p) { p.validate(); });

    m.def("llama_system_info", []() { return std::string(llama_print_system_info()); });
    bind_model(m);
    bind_drafters(m);
    bind_policies(m);
    bind_constraint(m);
    bind_engine(m);
    bind_embedder(m);
    bind_info(m);
    bind_tools(m);
#ifdef PYSPEC_SANITIZER_PROBE
    bind_sanitizer_probe(m);
#endif
}
