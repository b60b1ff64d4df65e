// Bindings of the model tools: agreement (pyspec agree) and quantize (pyspec quantize).
// Both run with the GIL released; results cross as NumPy arrays, one value per row.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "tools/agreement.h"
#include "bindings/bind_struct.h"
#include "drafters/model_drafter.h"
#include "tools/quantize.h"

namespace py = pybind11;
using namespace pyspec;
using pyspec_bind::CancelToken;

namespace {

template <class T>
py::array_t<T> to_array(std::vector<T>&& v) {
    auto* owner = new std::vector<T>(std::move(v));
    py::capsule free_it(owner, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    return py::array_t<T>(static_cast<py::ssize_t>(owner->size()), owner->data(), free_it);
}

}  // namespace

void bind_tools(py::module_& m) {
    m.def(
        "agreement",
        [](Model& ref, Model& cand, const std::vector<int32_t>& tokens, int32_t first, const SamplingParams& sampling,
           CancelToken* cancel) {
            AgreementRows rows;
            {
                py::gil_scoped_release release;
                rows = agreement(ref, cand, tokens, first, sampling, cancel ? &cancel->flag : nullptr);
            }
            py::dict out;
            out["alpha"] = to_array(std::move(rows.alpha));
            out["top1"] = to_array(std::move(rows.top1)).attr("astype")("bool");
            out["kl"] = to_array(std::move(rows.kl));
            out["logp_ref"] = to_array(std::move(rows.logp_ref));
            out["logp_cand"] = to_array(std::move(rows.logp_cand));
            out["nonfinite"] = rows.nonfinite;
            return out;
        },
        py::arg("reference"), py::arg("candidate"), py::arg("tokens"), py::arg("first"), py::arg("sampling"),
        py::arg("cancel") = nullptr,
        "Teacher-forced agreement of candidate with reference over one token stream, rows first .. "
        "len(tokens) - 2: a dict of arrays alpha, top1, kl, logp_ref, logp_cand ([n_rows] each; see "
        "cpp/agreement.h) and the count nonfinite.");
    m.def("check_compatible", &check_compatible, py::arg("target"), py::arg("draft"),
          "IncompatibleModelsError unless the two models share a vocabulary (what drafting needs).");
    m.def("quantize_types", [] {
        std::vector<std::string> names;
        for (const auto& t : quantize_types()) names.push_back(t.first);
        return names;
    });
    m.def(
        "quantize",
        [](const std::string& input, const std::string& output, const std::string& type, int32_t n_threads,
           bool allow_requantize) {
            py::gil_scoped_release release;
            quantize(QuantizeParams{input, output, type, n_threads, allow_requantize});
        },
        py::arg("input"), py::arg("output"), py::arg("type"), py::arg("n_threads") = 0,
        py::arg("allow_requantize") = false,
        "llama_model_quantize(input -> output, type); blocks (poll quantize_progress from another thread).");
    m.def("quantize_progress", &quantize_progress, "(tensors done, tensors in all) of the quantisation under way.");
}
