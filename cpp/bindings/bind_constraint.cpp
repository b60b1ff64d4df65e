// Bindings of constrained generation (constraint/): a model's vocabulary as
// llguidance sees it, compiled grammars, and a grammar walked by hand for
// tests and the mask benchmark. pyspec/structured.py is the Python side.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <vector>

#include "bindings/bind.h"
#include "constraint/grammar.h"
#include "model/model.h"

namespace py = pybind11;
using namespace pyspec;
using namespace pybind11::literals;

namespace {

// A fresh place in `g`, after `prefix` (each token must be allowed).
std::unique_ptr<GrammarState> walked(const std::shared_ptr<Grammar>& g, const std::vector<int32_t>& prefix) {
    auto c = std::make_unique<GrammarState>(g);
    for (int32_t t : prefix) {
        if (!GrammarState::allows(c->mask(0), t)) {
            throw std::invalid_argument("token " + std::to_string(t) + " is not allowed by the grammar there");
        }
        c->commit(0, t);
    }
    return c;
}

}  // namespace

void bind_constraint(py::module_& m) {
    py::class_<GrammarVocab, std::shared_ptr<GrammarVocab>>(
        m, "GrammarVocab", "A model's vocabulary as llguidance sees it (grammar.h); build once per model.")
        .def(py::init<const Model&, const std::string&>(), py::arg("model"), py::arg("library"),
             py::keep_alive<1, 2>(), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("n_vocab", &GrammarVocab::n_vocab)
        .def_property_readonly("version", &GrammarVocab::version, "llguidance's version string");

    py::class_<Grammar, std::shared_ptr<Grammar>>(
        m, "Grammar", "A compiled grammar (kind 'json_schema', 'lark' or 'regex'); ConstraintError if it does not compile.")
        .def(py::init<std::shared_ptr<const GrammarVocab>, const std::string&, const std::string&>(), py::arg("vocab"),
             py::arg("kind"), py::arg("text"), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("kind", &Grammar::kind)
        .def("valid_prefix",
             [](const std::shared_ptr<Grammar>& g, const std::vector<int32_t>& tokens) {
                 GrammarState c(g);
                 int32_t n = 0;
                 for (int32_t t : tokens) {
                     if (!GrammarState::allows(c.mask(0), t)) break;
                     c.commit(0, t);
                     ++n;
                 }
                 return n;
             },
             py::arg("tokens"), "How many leading tokens the grammar allows, one after the other.")
        .def("allowed",
             [](const std::shared_ptr<Grammar>& g, const std::vector<int32_t>& prefix) {
                 auto c = walked(g, prefix);
                 const uint32_t* mask = c->mask(0);
                 py::array_t<bool> out(c->n_vocab());
                 auto w = out.mutable_unchecked<1>();
                 for (int32_t i = 0; i < c->n_vocab(); ++i) w(i) = GrammarState::allows(mask, i);
                 return out;
             },
             py::arg("prefix") = std::vector<int32_t>{}, "The tokens allowed after `prefix` (bool per id).")
        .def("forced",
             [](const std::shared_ptr<Grammar>& g, const std::vector<int32_t>& prefix, int32_t max_n) {
                 auto c = walked(g, prefix);
                 std::vector<int32_t> out;
                 c->forced(max_n, out);
                 return out;
             },
             py::arg("prefix") = std::vector<int32_t>{}, py::arg("max_n") = 64,
             "The tokens the grammar forces after `prefix` (at most max_n).")
        .def("time_masks",
             [](const std::shared_ptr<Grammar>& g, const std::vector<int32_t>& tokens) {
                 // Seconds of the mask at each position of `tokens` (an answer the grammar allows).
                 py::gil_scoped_release release;
                 GrammarState c(g);
                 std::vector<double> s;
                 for (int32_t t : tokens) {
                     const auto t0 = std::chrono::steady_clock::now();
                     const uint32_t* mask = c.mask(0);
                     s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                     if (!GrammarState::allows(mask, t)) break;
                     c.commit(0, t);
                 }
                 return s;
             },
             py::arg("tokens"), "Seconds of the mask at each position of tokens (stops at a refused one).");
}
