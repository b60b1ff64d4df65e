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
#include "drafters/suffix_drafter.h"
#include "drafters/suffix_store.h"

namespace py = pybind11;
using namespace pyspec;
using namespace pybind11::literals;
using pyspec_bind::Struct;

namespace {

// A deterministic drafter (n-gram, consensus) as tests drive it: begin() on a
// prompt, then its proposal (its q is one-hot: no draws).
template <class D>
void begin(D& d, const std::vector<int32_t>& prompt) {
    d.begin(prompt, SamplingParams{});
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
    py::class_<SuffixStore, std::shared_ptr<SuffixStore>>(
        m, "SuffixStore", "Memory: earlier texts that suffix drafters look up, under a byte cap (suffix_store.h).")
        .def(py::init<size_t>(), py::arg("cap_bytes"))
        .def("add", &SuffixStore::add, py::arg("tokens"), py::call_guard<py::gil_scoped_release>(),
             "Add one document (token ids); evicts the least recently used documents over the cap.")
        .def("clear", &SuffixStore::clear, py::call_guard<py::gil_scoped_release>())
        .def("documents", &SuffixStore::documents, "The documents, least recently used first.")
        .def("longest_match",
             [](const SuffixStore& store, const std::vector<int32_t>& tokens) {
                 const auto lock = store.read();
                 SuffixAutomaton::Match match;
                 for (int32_t t : tokens) store.automaton().advance(match, t);
                 const SuffixAutomaton::Next next = store.automaton().best_next(match);
                 return py::dict("match_len"_a = match.len, "next_token"_a = next.token, "count"_a = next.count);
             },
             py::arg("tokens"),
             "The longest suffix of tokens found in memory: {match_len, next_token (-1: none), count}.")
        .def_property_readonly("cap_bytes", &SuffixStore::cap_bytes)
        .def_property_readonly("bytes", &SuffixStore::bytes, "Bytes its index and texts hold.")
        .def_property_readonly("n_tokens", &SuffixStore::n_tokens)
        .def_property_readonly("n_documents", &SuffixStore::n_documents)
        .def_property_readonly("epoch", &SuffixStore::epoch, "Changes whenever stored positions move (eviction).");
    py::class_<Drafter>(m, "Drafter")
        .def("use_memory",
             [](Drafter& d, std::shared_ptr<SuffixStore> store) { return d.use_memory(std::move(store)); },
             py::arg("store").none(true),  // the drafter's shared_ptr owns the store: no keep_alive
             "Draw drafts from this memory from now on (None: none); False if this drafter uses no memory.");
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
    py::class_<SuffixDrafter, Drafter>(m, "SuffixDrafter")
        .def(py::init([](int32_t n_vocab, int32_t n_min, int32_t n_max) {
                 return std::make_unique<SuffixDrafter>(std::make_unique<NgramDrafter>(n_vocab, n_min, n_max), n_vocab);
             }),
             py::arg("n_vocab"), py::arg("n_min") = 1, py::arg("n_max") = 16)
        .def("begin", &begin<SuffixDrafter>, py::arg("prompt"))
        .def("plan",
             [](SuffixDrafter& d, const std::vector<int32_t>& history) {
                 const DraftPlan p = d.plan(history);
                 return py::dict("match_len"_a = p.match_len, "near_copy"_a = p.near_copy,
                                 "next_guess"_a = p.next_guess, "fresh"_a = p.fresh, "from_memory"_a = p.from_memory);
             },
             py::arg("history"))
        .def("propose", &propose<SuffixDrafter>, py::arg("history"), py::arg("max_n"))
        .def_property_readonly("memory_drafts", &SuffixDrafter::memory_drafts,
                               "rounds whose draft came from memory since begin()");
    Struct<DrafterParams>(m, "DrafterParams", "Which drafter to build, and its settings.")
        .field("name", &DrafterParams::name)
        .field("ngram_min", &DrafterParams::ngram_min)
        .field("ngram_max", &DrafterParams::ngram_max)
        .field("hybrid_min_match", &DrafterParams::hybrid_min_match)
        .field("draft_window", &DrafterParams::draft_window)
        .done();
    pyspec_bind::def_catalog(m, "drafters", &drafter_catalog, "needs_draft_model", &DrafterInfo::needs_draft_model,
                             "Every drafter: name, whether it needs a draft model, a one-line summary.");
    m.def("drafter_name", &drafter_name, py::arg("params"), py::arg("have_draft_model"),
          "The drafter params.name resolves to (its default when empty); ValueError if unusable.");
    m.def("make_drafter", &make_drafter, py::arg("params"), py::arg("target"), py::arg("draft") = nullptr,
          py::keep_alive<0, 2>(), py::keep_alive<0, 3>(),
          "Build a drafter; IncompatibleModelsError unless the draft model shares the target's vocabulary.");
    m.def("make_batch_drafters",
          [](const DrafterParams& params, const Model& target, Model* draft, int32_t n, bool siblings) {
              std::vector<std::unique_ptr<Drafter>> ds = make_batch_drafters(params, target, draft, n, siblings);
              py::list out;
              // The caller keeps the models alive while it uses the drafters (a list cannot hold keep_alive).
              for (auto& d : ds) out.append(py::cast(d.release(), py::return_value_policy::take_ownership));
              return out;
          },
          py::arg("params"), py::arg("target"), py::arg("draft"), py::arg("n"), py::arg("siblings") = true,
          "One drafter per sequence of a batch of n (drafters.h): ngram, consensus (one pool), suffix (consensus "
          "and memory), model or hybrid (model and suffix; the draft model loaded with n_seq_max >= n). siblings=False "
          "(a server's slots): each sequence's lookup sees only its own text.");
}
