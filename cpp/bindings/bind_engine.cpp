// Bindings of the generation loop (engine/): its parameters and results, the
// Engine, and BatchSession. Generation runs without the GIL; the per-token
// callback takes it back briefly to stream text and to notice Ctrl-C.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bind.h"
#include "bindings/bind_struct.h"
#include "engine/engine.h"

namespace py = pybind11;
using namespace pyspec;
using pyspec_bind::CancelToken;
using pyspec_bind::Struct;

namespace {

// Streams to an optional Python callable and checks for Ctrl-C between tokens.
// A Python exception (KeyboardInterrupt included) stops generation; it is
// re-raised once the C++ loop has unwound and the model is in a clean state.
// Calls callback(token, text, drafted), or callback(seq, token, text, drafted)
// for a batch; also where Ctrl-C reaches a generation.
struct PyTokenSink {
    py::object callback;
    std::unique_ptr<py::error_already_set> error;

    bool operator()(int32_t token, const std::string& text, bool drafted) { return call(-1, token, text, drafted); }
    bool operator()(int32_t seq, int32_t token, const std::string& text, bool drafted) {
        return call(seq, token, text, drafted);
    }

private:
    bool call(int32_t seq, int32_t token, const std::string& text, bool drafted) {
        py::gil_scoped_acquire gil;
        try {
            if (!callback.is_none()) {
                py::object r = seq < 0 ? callback(token, py::bytes(text), drafted)
                                       : callback(seq, token, py::bytes(text), drafted);
                // None or anything truthy goes on; a falsy value stops (Python's own rule).
                if (!r.is_none()) {
                    const int truth = PyObject_IsTrue(r.ptr());
                    if (truth < 0) throw py::error_already_set();
                    if (truth == 0) return false;
                }
            }
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        } catch (py::error_already_set& e) {
            error = std::make_unique<py::error_already_set>(std::move(e));
            return false;
        }
        return true;
    }
};

// TokenLogprobs as Python sees them: [(logprob, [(token, logprob), ...top])].
py::list logprob_tuples(const std::vector<TokenLogprobs>& lps) {
    py::list out;
    for (const TokenLogprobs& lp : lps) out.append(py::make_tuple(lp.logprob, lp.top));
    return out;
}

// A BatchSession as Python holds it: the callback it calls, and the drafters
// and policies of its live sequences (kept alive until their results are taken).
struct PySession {
    SessionParams params;
    PyTokenSink sink;
    std::map<int32_t, py::object> refs;
    std::unique_ptr<BatchSession> session;

    BatchSession& get() {
        if (!session) throw std::runtime_error("the batch session is closed");
        return *session;
    }
    ~PySession() {
        py::gil_scoped_release release;  // closing may wait for the models' locks
        session.reset();
    }
};

void bind_stats(py::module_& m) {
    Struct<BatchStats>(m, "BatchStats", "What a batch of sequences measured (engine.h documents each field).")
        .field("n_seq", &BatchStats::n_seq)
        .field("rounds", &BatchStats::rounds)
        .field("rows", &BatchStats::rows)
        .field("max_rows", &BatchStats::max_rows)
        .field("prompt_rows", &BatchStats::prompt_rows)
        .field("cached_tokens", &BatchStats::cached_tokens)
        .field("cache_evictions", &BatchStats::cache_evictions)
        .field("draft_decodes", &BatchStats::draft_decodes)
        .field("joint_rounds", &BatchStats::joint_rounds)
        .field("prompt_s", &BatchStats::prompt_s)
        .field("decode_s", &BatchStats::decode_s)
        .field("n_generated", &BatchStats::n_generated)
        .field("aggregate_tok_s", &BatchStats::aggregate_tok_s)
        .done();
    Struct<GenerationStats>(m, "GenerationStats", "What one generation measured (stats.h documents each field).")
        .field("n_prompt_tokens", &GenerationStats::n_prompt_tokens)
        .field("n_cached_tokens", &GenerationStats::n_cached_tokens)
        .field("n_prompt_decoded", &GenerationStats::n_prompt_decoded)
        .field("n_generated", &GenerationStats::n_generated)
        .field("prompt_s", &GenerationStats::prompt_s)
        .field("ttft_s", &GenerationStats::ttft_s)
        .field("decode_s", &GenerationStats::decode_s)
        .field("decode_tok_s", &GenerationStats::decode_tok_s)
        .field("rounds", &GenerationStats::rounds)
        .field("drafted", &GenerationStats::drafted)
        .field("accepted", &GenerationStats::accepted)
        .field("draft_s", &GenerationStats::draft_s)
        .field("verify_s", &GenerationStats::verify_s)
        .field("overhead_s", &GenerationStats::overhead_s)
        .field("calibrate_s", &GenerationStats::calibrate_s)
        .field("drafted_at", &GenerationStats::drafted_at)
        .field("accepted_at", &GenerationStats::accepted_at)
        .field("length_hist", &GenerationStats::length_hist)
        .field("policy_plain", &GenerationStats::policy_plain)
        .field("ngram_rounds", &GenerationStats::ngram_rounds)
        .field("ngram_drafted", &GenerationStats::ngram_drafted)
        .field("ngram_accepted", &GenerationStats::ngram_accepted)
        .field("ngram_reanchored", &GenerationStats::ngram_reanchored)
        .field("memory_rounds", &GenerationStats::memory_rounds)
        .field("memory_drafted", &GenerationStats::memory_drafted)
        .field("memory_accepted", &GenerationStats::memory_accepted)
        .field("ngram_guesses", &GenerationStats::ngram_guesses)
        .field("ngram_guess_hits", &GenerationStats::ngram_guess_hits)
        .field("stops_before", &GenerationStats::stops_before)
        .field("stops_after", &GenerationStats::stops_after)
        .field("forced_rounds", &GenerationStats::forced_rounds)
        .field("forced_drafted", &GenerationStats::forced_drafted)
        .field("forced_accepted", &GenerationStats::forced_accepted)
        .field("grammar_cuts", &GenerationStats::grammar_cuts)
        .field("draft_windows", &GenerationStats::draft_windows)
        .field("first_with_prompt", &GenerationStats::first_with_prompt)
        .field("masks", &GenerationStats::masks)
        .field("mask_s", &GenerationStats::mask_s)
        .field("pit", &GenerationStats::pit)
        .done();
}

}  // namespace

void bind_engine(py::module_& m) {
    py::class_<CancelToken>(m, "CancelToken")
        .def(py::init<>())
        .def("set", [](CancelToken& c) { c.flag.store(true); }, "Ask the generation using this token to stop.")
        .def_property_readonly("is_set", [](const CancelToken& c) { return c.flag.load(); });

    // One generation: parameters in (a sequence's and its session's), tokens, text and statistics out.
    Struct<TestControls>(m, "TestControls",
                         "TEST-ONLY negative controls the lossless tests must catch, a session's (engine.h); "
                         "pyspec.testing.TestControls builds it.")
        .property("variant",
                  [](const TestControls& t) { return accept_variant_names()[static_cast<size_t>(t.variant)]; },
                  [](TestControls& t, const std::string& v) { t.variant = parse_accept_variant(v); })
        .field("discard_below", &TestControls::discard_below)
        .field("shared_stream", &TestControls::shared_stream)
        .property("grammar", [](const TestControls& t) { return grammar_control_names()[static_cast<size_t>(t.grammar)]; },
                  [](TestControls& t, const std::string& v) { t.grammar = parse_grammar_control(v); })
        .field("pit", &TestControls::pit)
        .property("penalties",
                  [](const TestControls& t) { return penalty_control_names()[static_cast<size_t>(t.penalties)]; },
                  [](TestControls& t, const std::string& v) { t.penalties = parse_penalty_control(v); })
        .field("timing_scale", &TestControls::timing_scale)
        .field("stale_join", &TestControls::stale_join)
        .done();
    m.attr("GRAMMAR_CONTROLS") = py::tuple(py::cast(grammar_control_names()));
    m.attr("PENALTY_CONTROLS") = py::tuple(py::cast(penalty_control_names()));
    Struct<SequenceParams>(m, "SequenceParams", "What one sequence generates and how it samples (engine.h).")
        .field("max_tokens", &SequenceParams::max_tokens)
        .field("sampling", &SequenceParams::sampling)
        .field("draft_sampling", &SequenceParams::draft_sampling)
        .field("seed", &SequenceParams::seed)
        .field("stop", &SequenceParams::stop)
        .field("logprobs", &SequenceParams::logprobs)
        .field("grammar", &SequenceParams::grammar)
        .field("penalties", &SequenceParams::penalties)
        .done();
    Struct<SessionParams>(m, "SessionParams",
                          "How a session runs all its sequences (engine.h); the cancel flag comes as an argument.")
        .field("prefill_chunk", &SessionParams::prefill_chunk)
        .field("calibration_share", &SessionParams::calibration_share)
        .field("first_with_prompt", &SessionParams::first_with_prompt)
        .field("test", &SessionParams::test)
        .done();
    m.def("calibration_rows", &calibration_rows, py::arg("draft_max"), py::arg("n_batch"), py::arg("n_seq"),
          "The largest target batch a policy with this draft_max wants timed: min(n_batch, (draft_max + 1) * "
          "n_seq). The engine and pyspec.calibration both go by it.");
    bind_stats(m);
    py::class_<GenerateResult>(m, "GenerateResult")
        .def_readonly("tokens", &GenerateResult::tokens)
        .def_property_readonly("text", [](const GenerateResult& r) { return py::bytes(r.text); }, "UTF-8 bytes")
        .def_readonly("stop_reason", &GenerateResult::stop_reason)
        .def_readonly("stats", &GenerateResult::stats)
        .def_property_readonly("logprobs", [](const GenerateResult& r) { return logprob_tuples(r.logprobs); },
                               "[(logprob, [(token, logprob), ...top])] per token (SequenceParams.logprobs >= 0)");

    py::class_<Engine>(m, "Engine")
        .def(py::init<Model&, Drafter*>(), py::arg("target"), py::arg("drafter") = nullptr,
             py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
        .def("generate",
             [](Engine& e, const std::vector<int32_t>& prompt, const SequenceParams& params, SessionParams session,
                LengthPolicy* policy, py::object on_token, CancelToken* cancel) {
                 session.cancel = cancel ? &cancel->flag : nullptr;
                 PyTokenSink sink;
                 sink.callback = std::move(on_token);
                 GenerateResult r;
                 {
                     py::gil_scoped_release release;
                     r = e.generate(prompt, params, session, std::ref(sink), policy);
                 }
                 if (sink.error) throw std::move(*sink.error);
                 return r;
             },
             py::arg("prompt"), py::arg("params"), py::arg("session") = SessionParams{}, py::arg("policy") = nullptr,
             py::arg("on_token") = py::none(),
             py::arg("cancel") = nullptr, "One generation (the C++ loop, without the GIL).")
        .def("generate_batch",
             [](Engine& e, const std::vector<std::vector<int32_t>>& prompts, const SequenceParams& params,
                SessionParams session, const std::vector<Drafter*>& drafters, const std::vector<LengthPolicy*>& policies,
                py::object on_token, CancelToken* cancel) {
                 if ((!drafters.empty() && drafters.size() != prompts.size()) ||
                     (!policies.empty() && policies.size() != prompts.size())) {
                     throw std::invalid_argument("drafters and policies: one per prompt (or none)");
                 }
                 std::vector<SequenceSpec> specs;
                 for (size_t j = 0; j < prompts.size(); ++j) {
                     specs.push_back({prompts[j], drafters.empty() ? nullptr : drafters[j],
                                      policies.empty() ? nullptr : policies[j], params, 0});
                 }
                 session.cancel = cancel ? &cancel->flag : nullptr;
                 PyTokenSink sink;
                 sink.callback = std::move(on_token);
                 std::vector<GenerateResult> r;
                 BatchStats bs;
                 {
                     py::gil_scoped_release release;
                     r = e.generate_batch(specs, session, std::ref(sink), &bs);
                 }
                 if (sink.error) throw std::move(*sink.error);
                 return std::make_pair(std::move(r), bs);
             },
             py::arg("prompts"), py::arg("params"), py::arg("session") = SessionParams{},
             py::arg("drafters") = std::vector<Drafter*>{},
             py::arg("policies") = std::vector<LengthPolicy*>{}, py::arg("on_token") = py::none(),
             py::arg("cancel") = nullptr,
             "Many sequences, one target decode per round, all with `params`; each its own drafter and policy "
             "(engine.h). "
             "on_token(seq, token, text, drafted). Returns (results in order, BatchStats).")
        .def("session",
             [](Engine& e, const SessionParams& params, py::object on_token, CancelToken* cancel,
                const std::vector<Model*>& draft_models, HostCache* host_cache) {
                 auto ps = std::make_unique<PySession>();
                 ps->params = params;
                 ps->params.cancel = cancel ? &cancel->flag : nullptr;
                 ps->sink.callback = std::move(on_token);
                 PyTokenSink* sink = &ps->sink;
                 BatchTokenCallback cb = [sink](int32_t seq, int32_t token, const std::string& text, bool drafted) {
                     return (*sink)(seq, token, text, drafted);
                 };
                 py::gil_scoped_release release;
                 ps->session = std::make_unique<BatchSession>(e, ps->params, cb, draft_models, false, host_cache);
                 return ps;
             },
             py::arg("params"), py::arg("on_token") = py::none(), py::arg("cancel") = nullptr,
             py::arg("draft_models") = std::vector<Model*>{}, py::arg("host_cache") = nullptr,
             py::keep_alive<0, 1>(), py::keep_alive<0, 4>(), py::keep_alive<0, 5>(), py::keep_alive<0, 6>(),
             "A BatchSession on this engine's target, run as `params` (SessionParams) says; each add() brings its "
             "own SequenceParams, and drafts when it brings a policy. on_token(handle, token, text, drafted).");
    py::class_<HostCache>(m, "HostCache",
                            "Conversations no slot holds any more, kept in host memory within a byte bound, both "
                            "models' caches together (engine/host_cache.h). Give it to Engine.session().")
        .def(py::init<size_t>(), py::arg("capacity_bytes"))
        .def_property_readonly("stats",
                               [](const HostCache& c) {
                                   const HostCache::Stats s = c.stats();
                                   py::dict d;
                                   d["saved"] = s.saved;
                                   d["restored"] = s.restored;
                                   d["restored_tokens"] = s.restored_tokens;
                                   d["evicted"] = s.evicted;
                                   d["entries"] = s.entries;
                                   d["bytes"] = s.bytes;
                                   d["capacity"] = s.capacity;
                                   return d;
                               },
                               "{saved, restored, restored_tokens, evicted, entries, bytes, capacity}")
        .def("clear", &HostCache::clear, py::call_guard<py::gil_scoped_release>())
        .def("put",
             [](HostCache& c, const std::vector<py::tuple>& parts) {
                 HostCache::Entry e;
                 for (const py::tuple& p : parts) {
                     if (p.size() != 3) throw std::invalid_argument("a part is (model, tokens, state bytes)");
                     e.parts.push_back({p[0].cast<Model*>(), p[1].cast<std::vector<int32_t>>(),
                                        p[2].cast<std::string>()});
                 }
                 py::gil_scoped_release release;
                 return c.put(std::move(e));
             },
             py::arg("parts"),
             "Keep an entry: [(model, tokens, state bytes)], the target's first (Model.save_state). False when "
             "it is too short or larger than the bound.")
        .def("entries",
             [](const HostCache& c) {
                 std::vector<HostCache::Entry> all;
                 {
                     py::gil_scoped_release release;
                     all = c.entries();
                 }
                 py::list out;
                 for (const HostCache::Entry& e : all) {
                     py::list parts;
                     for (const HostCache::Part& p : e.parts) {
                         parts.append(py::make_tuple(py::cast(p.model, py::return_value_policy::reference), p.tokens,
                                                     py::bytes(p.state)));
                     }
                     out.append(parts);
                 }
                 return out;
             },
             "Every entry as [(model, tokens, state bytes)], the target's first; most recently stored first.")
        .def_property_readonly_static("MIN_TOKENS", [](py::object) { return HostCache::kMinTokens; },
                                      "Entries shorter than this many target tokens are not kept.");
    py::class_<PySession>(m, "BatchSession",
                          "Continuous batching (engine.h): sequences join with add() and leave when they finish "
                          "or are cancelled; each step() is one round with one target decode. Use it from one "
                          "thread at a time; close() (or the with-block) releases the models.")
        .def("add",
             [](PySession& ps, const std::vector<int32_t>& prompt, const SequenceParams& params, py::object drafter,
                py::object policy, int32_t stream, int32_t slot, bool chunked) {
                 SequenceSpec spec{prompt, drafter.is_none() ? nullptr : drafter.cast<Drafter*>(),
                                   policy.is_none() ? nullptr : policy.cast<LengthPolicy*>(), params, stream, slot,
                                   chunked};
                 int32_t h;
                 {
                     py::gil_scoped_release release;
                     h = ps.get().add(spec);
                 }
                 ps.refs[h] = py::make_tuple(drafter, policy);  // alive while the sequence is
                 return h;
             },
             py::arg("prompt"), py::arg("params"), py::arg("drafter") = py::none(), py::arg("policy") = py::none(),
             py::arg("stream") = 0, py::arg("slot") = -1, py::arg("chunked") = false,
             "Queue a sequence (its own max_tokens, sampling, seed, stop; a policy and drafter to draft, none: "
             "plain) in `slot` (-1: the session's choice, "
             "pick_slot); returns its handle. `chunked`: its prompt goes in prefill_chunk rows per decode even "
             "alone (a request likely to be cancelled). ValueError when every slot is taken (see free_slots).")
        .def("pick_slot",
             [](PySession& ps, const std::vector<int32_t>& prompt) {
                 py::gil_scoped_release release;
                 return ps.get().pick_slot(prompt);
             },
             py::arg("prompt"),
             "The free slot a sequence with this prompt would run in (-1: none): one whose cache the prompt "
             "continues, else its conversation's last turn, else the least recently used (engine.h).")
        .def("step",
             [](PySession& ps) {
                 bool more;
                 {
                     py::gil_scoped_release release;
                     more = ps.get().step();
                 }
                 if (ps.sink.error) {
                     auto e = std::move(ps.sink.error);
                     throw std::move(*e);
                 }
                 return more;
             },
             "One round; False when nothing is waiting or generating.")
        .def("cancel",
             [](PySession& ps, int32_t handle) {
                 py::gil_scoped_release release;
                 ps.get().cancel(handle);
             },
             py::arg("handle"), "End a sequence at the next step (stop_reason 'cancelled').")
        .def("take_finished",
             [](PySession& ps) {
                 std::vector<std::pair<int32_t, GenerateResult>> done;
                 {
                     py::gil_scoped_release release;
                     done = ps.get().take_finished();
                 }
                 for (const auto& d : done) ps.refs.erase(d.first);
                 return done;
             },
             "[(handle, GenerateResult)] of the sequences finished since the last call.")
        .def("logprobs",
             [](PySession& ps, int32_t handle, size_t start) {
                 std::vector<TokenLogprobs> lp;
                 {
                     py::gil_scoped_release release;
                     lp = ps.get().logprobs(handle, start);
                 }
                 return logprob_tuples(lp);
             },
             py::arg("handle"), py::arg("start") = 0,
             "A running sequence's recorded log-probabilities from index start, as GenerateResult.logprobs.")
        .def_property_readonly("kv_cells", [](PySession& ps) { return ps.get().kv_cells(); },
                               "(cells of running sequences, all cells held): the target's cache use")
        .def("release_cache",
             [](PySession& ps) {
                 py::gil_scoped_release release;
                 ps.get().release_cache();
             },
             "Empty the cells kept for finished sequences (their prefix cache).")
        .def_property_readonly("free_slots", [](PySession& ps) { return ps.get().free_slots(); })
        .def_property_readonly("cached_slots", [](PySession& ps) { return ps.get().cached_slots(); },
                               "Free slots that hold a cache (finished conversations kept)")
        .def_property_readonly("n_active", [](PySession& ps) { return ps.get().n_active(); })
        .def_property_readonly("n_waiting", [](PySession& ps) { return ps.get().n_waiting(); })
        .def_property_readonly("stats", [](PySession& ps) { return ps.get().stats(); })
        .def("close",
             [](PySession& ps) {
                 py::gil_scoped_release release;
                 ps.session.reset();
             },
             "Release the models (idempotent).")
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PySession& ps, py::args) {
            py::gil_scoped_release release;
            ps.session.reset();
        });
    m.def("sequence_seed", &sequence_seed, py::arg("seed"), py::arg("j"),
          "The seed of sequence j of a batch seeded with `seed`.");
}
