// Bindings of the model wrapper (model/model.h): how a model is loaded, and
// its tokenizer, decode and cache, for tests and tools.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/bind.h"
#include "bindings/bind_struct.h"
#include "model/gguf_check.h"
#include "model/model.h"

namespace py = pybind11;
using namespace pyspec;
using pyspec_bind::Struct;

void bind_model(py::module_& m) {
    m.attr("MAX_SEQUENCES") = ModelParams::kMaxSequences;  // the most sequences one context holds
    Struct<ModelParams>(m, "ModelParams", "How to load a model and size its context (model.h documents each).")
        .field("path", &ModelParams::path)
        .field("n_ctx", &ModelParams::n_ctx)
        .field("n_threads", &ModelParams::n_threads)
        .field("n_gpu_layers", &ModelParams::n_gpu_layers)
        .field("n_batch", &ModelParams::n_batch)
        .field("flash_attn", &ModelParams::flash_attn)
        .field("n_seq_max", &ModelParams::n_seq_max)
        .field("verbose", &ModelParams::verbose)
        .field("repack", &ModelParams::repack)
        .field("excluded_buffer_types", &ModelParams::excluded_buffer_types)
        .field("rpc", &ModelParams::rpc)
        .field("local_output", &ModelParams::local_output)
        .field("tensor_split", &ModelParams::tensor_split)
        .done();
    const ModelParams defaults;  // the keyword constructor's defaults
    py::class_<Model>(m, "Model")
        .def(py::init([](const ModelParams& p) {
                 py::gil_scoped_release release;
                 return std::make_unique<Model>(p);
             }),
             py::arg("params"))
        .def(py::init([](const std::string& path, int32_t n_ctx, int32_t n_threads, int32_t n_gpu_layers,
                         int32_t n_batch, bool verbose, int32_t flash_attn, int32_t n_seq_max) {
                 ModelParams p;
                 p.path = path;
                 p.n_ctx = n_ctx;
                 p.n_threads = n_threads;
                 p.n_gpu_layers = n_gpu_layers;
                 p.n_batch = n_batch;
                 p.verbose = verbose;
                 p.flash_attn = flash_attn;
                 p.n_seq_max = n_seq_max;
                 py::gil_scoped_release release;
                 return std::make_unique<Model>(p);
             }),
             py::arg("path"), py::arg("n_ctx") = defaults.n_ctx, py::arg("n_threads") = defaults.n_threads,
             py::arg("n_gpu_layers") = defaults.n_gpu_layers, py::arg("n_batch") = defaults.n_batch,
             py::arg("verbose") = defaults.verbose, py::arg("flash_attn") = defaults.flash_attn,
             py::arg("n_seq_max") = defaults.n_seq_max)
        .def_property_readonly("params", [](const Model& m) { return m.params(); }, "the ModelParams it was loaded with (a copy)")
        .def_property_readonly("path", [](const Model& m) { return m.params().path; })
        .def_property_readonly("n_vocab", &Model::n_vocab)
        .def_property_readonly("n_ctx", &Model::n_ctx)
        .def_property_readonly("n_batch", &Model::n_batch)
        .def_property_readonly("n_seq", &Model::n_seq, "sequences the context holds (one unified KV cache)")
        .def_property_readonly("n_threads", [](const Model& m) { return m.params().n_threads; })
        .def_property_readonly("n_gpu_layers", [](const Model& m) { return m.params().n_gpu_layers; })
        .def_property_readonly("rpc", [](const Model& m) { return m.params().rpc; },
                               "the RPC workers holding its layers (\"host:port\"); empty when local")
        .def_property_readonly("tensor_split", [](const Model& m) { return m.params().tensor_split; })
        .def_property_readonly("flash_attn", &Model::flash_attn, "as run: 1 on, 0 off, -1 auto and unreported")
        .def_property_readonly("flash_attn_requested", [](const Model& m) { return m.params().flash_attn; })
        .def_property_readonly("description", &Model::description)
        .def_property_readonly("n_params", &Model::n_params)
        .def_property_readonly("file_type", &Model::file_type, "llama_model_ftype (LLAMA_FTYPE_*)")
        .def_property_readonly("weight_buffers", &Model::weight_buffers,
                               "[(buffer name, MiB)] holding its weights, as llama.cpp reported them while loading "
                               "(\"CPU_Mapped\", \"CPU_REPACK\", \"AMX\", ...)")
        .def_property_readonly("vocab_type", &Model::vocab_type)
        .def_property_readonly("bos", &Model::bos)
        .def_property_readonly("eos", &Model::eos)
        .def_property_readonly("eot", &Model::eot)
        .def_property_readonly("add_bos", &Model::add_bos)
        .def_property_readonly("add_eos", &Model::add_eos)
        .def_property_readonly(
            "chat_template",
            [](const Model& m) -> py::object {
                const auto t = m.chat_template();
                return t ? py::object(py::bytes(*t)) : py::object(py::none());
            },
            "the file's Jinja chat template (bytes, as stored), or None")
        .def("is_eog", &Model::is_eog, py::arg("token"))
        .def("token_text", &Model::token_text, py::arg("token"))
        .def("token_attr", &Model::token_attr, py::arg("token"))
        .def("infill_vocab", [](const Model& m) { return std::const_pointer_cast<pyspec::InfillVocab>(m.infill_vocab()); },
             "the vocabulary as the infill sampler reads it (built on first use; sampling.distribution(infill=))")
        .def_property_readonly(
            "fim_tokens",
            [](const Model& m) {
                const Model::FimTokens f = m.fim_tokens();
                py::dict d;  // -1 (LLAMA_TOKEN_NULL) where the vocabulary has none
                d["pre"] = f.pre, d["suf"] = f.suf, d["mid"] = f.mid;
                d["pad"] = f.pad, d["rep"] = f.rep, d["sep"] = f.sep;
                return d;
            },
            "fill-in-the-middle token ids {pre, suf, mid, pad, rep, sep}, -1 where absent (pyspec/fim.py)")
        .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = false)
        .def("token_to_piece",
             [](const Model& m, int32_t t, bool special) { return py::bytes(m.token_to_piece(t, special)); },
             py::arg("token"), py::arg("special") = false)
        .def("detokenize",
             [](const Model& m, const std::vector<int32_t>& t, bool special) {
                 return py::bytes(m.detokenize(t, special));
             },
             py::arg("tokens"), py::arg("special") = false)
        .def("apply_chat_template", &Model::apply_chat_template, py::arg("messages"),
             py::arg("add_assistant") = true)
        .def("decode",
             [](Model& m, const std::vector<int32_t>& tokens, int32_t pos0, int32_t n_logits, int32_t seq) {
                 py::gil_scoped_release release;
                 m.decode(tokens.data(), static_cast<int32_t>(tokens.size()), pos0, n_logits, seq);
             },
             py::arg("tokens"), py::arg("pos0"), py::arg("n_logits") = 1, py::arg("seq") = 0,
             "Decode tokens at positions pos0.. of a sequence, keeping logits for the last n_logits (tests, tools).")
        .def("decode_rows",
             [](Model& m, const std::vector<std::tuple<int32_t, int32_t, int32_t, bool>>& rows) {
                 std::vector<Model::Row> rs;
                 for (const auto& [seq, pos, token, logits] : rows) rs.push_back(Model::Row{seq, pos, token, logits});
                 py::gil_scoped_release release;
                 m.decode_rows(rs.data(), static_cast<int32_t>(rs.size()));
             },
             py::arg("rows"),
             "One llama_decode over rows (seq, pos, token, logits) of any sequences; logits(i) is the i-th row "
             "that asked for logits.")
        .def("logits",
             [](const Model& m, int32_t row) {
                 std::vector<float> copy;  // for tests and tools, not the hot loop
                 {
                     py::gil_scoped_release release;  // the lock's holder may need the GIL
                     const auto held = m.lock();
                     const float* p = m.logits(row);
                     copy.assign(p, p + m.n_vocab());
                 }
                 return py::array_t<float>(static_cast<py::ssize_t>(copy.size()), copy.data());
             },
             py::arg("row") = 0)
        .def("test_simulate_async", &Model::simulate_async, py::arg("latency_s"), py::arg("synced") = true,
             py::call_guard<py::gil_scoped_release>(),
             "TEST-ONLY: behave as an asynchronous backend whose every decode finishes latency_s after its "
             "launch; synced=False is the clock tests' negative control (model.h).")
        .def("test_share_cell", &Model::test_share_cell, py::arg("src"), py::arg("dst"), py::arg("pos"),
             py::call_guard<py::gil_scoped_release>(),
             "TEST-ONLY: the cell of src at pos becomes visible to dst too (a row-law control, model.h).")
        .def("test_hide_cell", &Model::test_hide_cell, py::arg("seq"), py::arg("pos"),
             py::call_guard<py::gil_scoped_release>(),
             "TEST-ONLY: the cell of seq at pos is hidden from its later rows (a row-law control, model.h).")
        .def("truncate", &Model::truncate, py::arg("pos"), py::arg("seq") = 0,
             py::call_guard<py::gil_scoped_release>())
        .def("copy_prefix", &Model::copy_prefix, py::arg("src"), py::arg("dst"), py::arg("n"),
             py::call_guard<py::gil_scoped_release>(),
             "Make sequence dst hold the first n tokens of sequence src (shared cells, no copy).")
        .def("pos_max", &Model::pos_max, py::arg("seq") = 0, py::call_guard<py::gil_scoped_release>())
        .def("cached", [](const Model& m, int32_t seq) {
            std::vector<int32_t> out;
            {
                py::gil_scoped_release release;
                const auto held = m.lock();
                out = m.cached(seq);
            }
            return out;
        }, py::arg("seq") = 0, "The token ids the KV cache holds for a sequence, by position.")
        .def_property_readonly("n_decoded", &Model::n_decoded,
                               "Tokens this context has evaluated over its life (all sequences, drafts included).")
        .def("save_state",
             [](const Model& m, int32_t seq) {
                 std::string s;
                 {
                     py::gil_scoped_release release;
                     s = m.save_state(seq);
                 }
                 return py::bytes(s);
             },
             py::arg("seq") = 0,
             "A sequence's cache as bytes (llama.cpp's per-sequence state; cached(seq) names its tokens).")
        .def("load_state",
             [](Model& m, int32_t seq, const py::bytes& state, const std::vector<int32_t>& tokens) {
                 std::string s = state;
                 py::gil_scoped_release release;
                 return m.load_state(seq, s, tokens);
             },
             py::arg("seq"), py::arg("state"), py::arg("tokens"),
             "Replace sequence seq's cache with save_state bytes whose cells hold `tokens`; False (left empty) "
             "when there is no room or the bytes do not fit this model.");
    m.def("gguf_metadata", &gguf_metadata, py::arg("path"),
          "A GGUF file's header key-values as (key, text) pairs in file order (as llama.cpp renders them; arrays "
          "left out), read with ggml's "
          "bounds-checked reader; InvalidModelError for a damaged header.");
}
