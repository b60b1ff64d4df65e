// Bindings of the embedder (model/embedder.h): embeddings on a second context
// of a loaded Model. pyspec/embedding.py is its Python face.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "bindings/bind.h"
#include "bindings/bind_struct.h"
#include "model/embedder.h"
#include "model/model.h"

namespace py = pybind11;
using namespace pyspec;
using pyspec_bind::CancelToken;
using pyspec_bind::Struct;

void bind_embedder(py::module_& m) {
    Struct<EmbedderParams>(m, "EmbedderParams", "An embedder's context: sizes, threads, pooling (embedder.h).")
        .field("n_ctx", &EmbedderParams::n_ctx)
        .field("n_batch", &EmbedderParams::n_batch)
        .field("n_threads", &EmbedderParams::n_threads)
        .field("flash_attn", &EmbedderParams::flash_attn)
        .field("pooling", &EmbedderParams::pooling)
        .done([](const EmbedderParams& p) { p.validate(); });
    py::class_<Embedder>(m, "Embedder",
                         "Embeddings on a second llama.cpp context of a loaded Model (embedder.h); it keeps the "
                         "Model alive.")
        .def(py::init([](Model& model, const EmbedderParams& params) {
                 py::gil_scoped_release release;
                 return std::make_unique<Embedder>(model, params);
             }),
             py::arg("model"), py::arg("params") = EmbedderParams{}, py::keep_alive<1, 2>())
        .def_property_readonly("params", [](const Embedder& e) { return e.params(); }, "the EmbedderParams (a copy)")
        .def_property_readonly("n_embd", &Embedder::n_embd)
        .def_property_readonly("pooling", &Embedder::pooling, "llama_pooling_type as run (-1 resolved)")
        .def_property_readonly("n_ctx", &Embedder::n_ctx)
        .def_property_readonly("n_batch", &Embedder::n_batch)
        .def_property_readonly("n_seq_max", &Embedder::n_seq_max, "sequences one decode packs")
        .def_property_readonly("max_tokens", &Embedder::max_tokens, "the longest sequence embed() takes")
        .def_property_readonly("n_threads", &Embedder::n_threads)
        .def_property_readonly("n_decoded", &Embedder::n_decoded, "tokens embedded over its life")
        .def_property_readonly("n_decodes", &Embedder::n_decodes, "llama_decode calls over its life")
        .def(
            "embed",
            [](Embedder& e, const std::vector<std::vector<int32_t>>& sequences, bool normalize, CancelToken* cancel) {
                auto rows = std::make_unique<std::vector<float>>();
                {
                    py::gil_scoped_release release;  // the work, and the wait for the embedder's lock
                    *rows = e.embed(sequences, normalize, cancel ? &cancel->flag : nullptr);
                }
                const py::ssize_t width = e.n_embd();
                const py::ssize_t n = static_cast<py::ssize_t>(rows->size()) / width;
                float* data = rows->data();
                py::capsule owner(rows.release(), [](void* p) { delete static_cast<std::vector<float>*>(p); });
                return py::array_t<float>({n, width}, {width * static_cast<py::ssize_t>(sizeof(float)),
                                                       static_cast<py::ssize_t>(sizeof(float))},
                                          data, owner);
            },
            py::arg("sequences"), py::arg("normalize") = true, py::arg("cancel") = nullptr,
            "float32 rows (n, n_embd): one per sequence, or with pooling none one per token of each, in order. "
            "Packs sequences into shared decodes, without the GIL.");
}
