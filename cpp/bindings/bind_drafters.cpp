// Bindings of the drafters (drafters/): built by name, and the n-gram and
// consensus drafters on their own for tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "bindings/bind.h"
#include "bindings/bind_struct.h"
#include "drafters/consensus_drafter.h"
#include "drafters/drafters.h"
#include "drafters/ngram_drafter.h"

namespace py = pybind11;
using namespace pyspec;
using namespace pybind11::literals;
using pyspec_bind::Struct;

namespace {

// A deterministic drafter (n-gram, consensus) as tests drive it: begin() on a
// prompt, then its proposal (its q is one-hot: no draws).
template <class D>
void begin(D& d, const std::vector<int32_t>& prompt) {
    d.begin(prompt, SamplingParams{}, true);
}

template <class D>
std::vector<int32_t> propose(D& d, const std::vector<int32_t>& history, int32_t max_n) {
    Rng rng(0);
    std::vector<int32_t> tokens;
    std::vector<Distribution> q(static_cast<size_t>(std::max(max_n, 1)));
    d.draft(history, max_n, rng, tokens, q, nullptr);
    return tokens;
}

}  // namespace

void bind_drafters(py::module_& m) {
    py::class_<Drafter>(m, "Drafter");
    py::class_<NgramDrafter, Drafter>(m, "NgramDrafter")
        .def(py::init<int32_t, int32_t, int32_t>(), py::arg("n_vocab"), py::arg("n_min") = 1, py::arg("n_max") = 16)
        .def("begin", &begin<NgramDrafter>, py::arg("prompt"))
        .def("plan",
             [](NgramDrafter& d, const std::vector<int32_t>& history) {
                 const DraftPlan p = d.plan(history);
                 return py::dict("match_len"_a = p.match_len, "near_copy"_a = p.near_copy,
                                 "next_guess"_a = p.next_guess, "fresh"_a = p.fresh);
             },
             py::arg("history"),
             "What the next proposal rests on: {match_len, near_copy, next_guess, fresh} (match_len 0: none).")
        .def("find",
             [](NgramDrafter& d, const std::vector<int32_t>& history) {
                 int32_t len = 0;
                 const int32_t at = d.find(history, &len);
                 return py::make_tuple(at, len);
             },
             py::arg("history"), "(position whose continuation is proposed or -1, matched n-gram length)")
        .def("propose", &propose<NgramDrafter>,
             py::arg("history"), py::arg("max_n"));
    py::class_<ConsensusPool, std::shared_ptr<ConsensusPool>>(m, "ConsensusPool",
                                                              "The siblings' texts that consensus drafters share.")
        .def(py::init<int32_t, int32_t, int32_t>(), py::arg("n_seq"), py::arg("n_min") = 2, py::arg("n_max") = 8)
        .def_property_readonly("n_seq", &ConsensusPool::n_seq);
    py::class_<ConsensusDrafter, Drafter>(m, "ConsensusDrafter")
        .def(py::init<std::shared_ptr<ConsensusPool>, int32_t, int32_t, int32_t, int32_t>(), py::arg("pool"),
             py::arg("seq"), py::arg("n_vocab"), py::arg("n_min") = 1, py::arg("n_max") = 16)
        .def("begin", &begin<ConsensusDrafter>, py::arg("prompt"))
        .def("plan",
             [](ConsensusDrafter& d, const std::vector<int32_t>& history) {
                 const DraftPlan p = d.plan(history);
                 return py::dict("match_len"_a = p.match_len, "next_guess"_a = p.next_guess);
             },
             py::arg("history"))
        .def("propose", &propose<ConsensusDrafter>,
             py::arg("history"), py::arg("max_n"))
        .def_property_readonly("sibling_drafts", &ConsensusDrafter::sibling_drafts,
                               "rounds whose draft came from a sibling since begin()");
    Struct<DrafterParams>(m, "DrafterParams", "Which drafter to build, and its settings.")
        .field("name", &DrafterParams::name)
        .field("ngram_min", &DrafterParams::ngram_min)
        .field("ngram_max", &DrafterParams::ngram_max)
        .field("hybrid_min_match", &DrafterParams::hybrid_min_match)
        .done();
    m.def("drafters", [] {
        py::list out;
        for (const DrafterInfo& i : drafter_catalog()) {
            out.append(py::dict("name"_a = i.name, "needs_draft_model"_a = i.needs_draft_model,
                                "summary"_a = i.summary));
        }
        return out;
    }, "Every drafter: name, whether it needs a draft model, a one-line summary.");
    m.def("drafter_name", &drafter_name, py::arg("params"), py::arg("have_draft_model"),
          "The drafter params.name resolves to (its default when empty); ValueError if unusable.");
    m.def("make_drafter", &make_drafter, py::arg("params"), py::arg("target"), py::arg("draft") = nullptr,
          py::keep_alive<0, 2>(), py::keep_alive<0, 3>(),
          "Build a drafter; IncompatibleModelsError unless the draft model shares the target's vocabulary.");
    m.def("make_batch_drafters",
          [](const DrafterParams& params, const Model& target, Model* draft, int32_t n) {
              std::vector<std::unique_ptr<Drafter>> ds = make_batch_drafters(params, target, draft, n);
              py::list out;
              // The caller keeps the models alive while it uses the drafters (a list cannot hold keep_alive).
              for (auto& d : ds) out.append(py::cast(d.release(), py::return_value_policy::take_ownership));
              return out;
          },
          py::arg("params"), py::arg("target"), py::arg("draft"), py::arg("n"),
          "One drafter per sequence of a batch of n (drafters.h): ngram, consensus (one pool), model or hybrid "
          "(model and consensus; the draft model loaded with n_seq_max >= n).");
}
