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
#include "core/sampling.h"
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

void translate_errors(std::exception_ptr p) {
    try {
        if (p) std::rethrow_exception(p);
    } catch (const ModelNotFoundError& e) {
        raise_pyspec("ModelNotFoundError", e.what());
    } catch (const InvalidModelError& e) {
        raise_pyspec("InvalidModelError", e.what());
    } catch (const ContextOverflowError& e) {
        raise_pyspec("ContextOverflowError", e.what());
    } catch (const DecodeError& e) {
        raise_pyspec("DecodeError", e.what());
    } catch (const IncompatibleModelsError& e) {
        raise_pyspec("IncompatibleModelsError", e.what());
    } catch (const QuantizeError& e) {
        raise_pyspec("QuantizeError", e.what());
    }
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
        .done([](const SamplingParams& p) { p.validate(); });

    m.def("llama_system_info", []() { return std::string(llama_print_system_info()); });
    bind_model(m);
    bind_drafters(m);
    bind_policies(m);
    bind_engine(m);
    bind_info(m);
    bind_tools(m);
#ifdef PYSPEC_SANITIZER_PROBE
    bind_sanitizer_probe(m);
#endif
}
