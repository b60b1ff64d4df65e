// pybind11 module pyspec._core: the model wrapper, drafters, policies and the
// generation loop. The sampling math is bound in bind_sampling.cpp, llama.cpp's
// build facts in bind_info.cpp; the typed surface is pyspec/_core.pyi. Structs
// cross as bound classes built from keyword arguments over their C++ defaults,
// so each field and default is written once (in its header). Heavy work releases
// the GIL; the per-token callback takes it back briefly to stream text and to
// notice Ctrl-C.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <llama.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "errors.h"
#include "engine.h"
#include "model.h"
#include "auto_policy.h"
#include "bind_struct.h"
#include "drafters.h"
#include "ngram_drafter.h"
#include "consensus_drafter.h"
#include "policy.h"

namespace py = pybind11;
using namespace pyspec;

using namespace pybind11::literals;
using pyspec_bind::CancelToken;
using pyspec_bind::Struct;

void bind_sampling(py::module_& m);
void bind_info(py::module_& m);
void bind_tools(py::module_& m);

namespace {

// Raise the pyspec.errors class of the same name (it owns the Python hierarchy).
[[noreturn]] void raise_pyspec(const char* name, const char* what) {
    py::object cls = py::module_::import("pyspec.errors").attr(name);
    PyErr_SetString(cls.ptr(), what);
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
    GenerateParams params;
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

DraftSource parse_source(const std::string& name) {
    if (name == "model") return DraftSource::kModel;
    if (name == "ngram") return DraftSource::kNgram;
    throw std::invalid_argument("unknown draft source '" + name + "' (model, ngram)");
}

DraftPlan make_plan(const std::string& source, int32_t match_len, int32_t lag, bool near_copy = false,
                    int32_t next_guess = -1, bool fresh = false) {
    DraftPlan p;
    p.fresh = fresh;
    p.source = parse_source(source);
    p.match_len = match_len;
    p.lag = lag;
    p.near_copy = near_copy;
    p.next_guess = next_guess;
    return p;
}

void bind_stats(py::module_& m) {
    Struct<BatchStats>(m, "BatchStats", "What a batch of sequences measured (engine.h documents each field).")
        .field("n_seq", &BatchStats::n_seq)
        .field("rounds", &BatchStats::rounds)
        .field("rows", &BatchStats::rows)
        .field("max_rows", &BatchStats::max_rows)
        .field("prompt_rows", &BatchStats::prompt_rows)
        .field("draft_decodes", &BatchStats::draft_decodes)
        .field("joint_rounds", &BatchStats::joint_rounds)
        .field("prompt_s", &BatchStats::prompt_s)
        .field("decode_s", &BatchStats::decode_s)
        .field("n_generated", &BatchStats::n_generated)
        .field("aggregate_tok_s", &BatchStats::aggregate_tok_s)
        .done();
    Struct<GenerationStats>(m, "GenerationStats", "What one generation measured (stats.h documents each field).")
        .field("n_prompt_tokens", &GenerationStats::n_prompt_tokens)
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
        .field("ngram_guesses", &GenerationStats::ngram_guesses)
        .field("ngram_guess_hits", &GenerationStats::ngram_guess_hits)
        .field("stops_before", &GenerationStats::stops_before)
        .field("stops_after", &GenerationStats::stops_after)
        .done();
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

    py::class_<Model>(m, "Model")
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
             py::arg("path"), py::arg("n_ctx") = 4096, py::arg("n_threads") = 0, py::arg("n_gpu_layers") = 0,
             py::arg("n_batch") = 512, py::arg("verbose") = false,
             py::arg("flash_attn") = -1, py::arg("n_seq_max") = 1)
        .def_property_readonly("path", [](const Model& m) { return m.params().path; })
        .def_property_readonly("n_vocab", &Model::n_vocab)
        .def_property_readonly("n_ctx", &Model::n_ctx)
        .def_property_readonly("n_batch", &Model::n_batch)
        .def_property_readonly("n_seq", &Model::n_seq, "sequences the context holds (one unified KV cache)")
        .def_property_readonly("n_threads", [](const Model& m) { return m.params().n_threads; })
        .def_property_readonly("n_gpu_layers", [](const Model& m) { return m.params().n_gpu_layers; })
        .def_property_readonly("flash_attn", &Model::flash_attn, "as run: 1 on, 0 off, -1 auto and unreported")
        .def_property_readonly("flash_attn_requested", [](const Model& m) { return m.params().flash_attn; })
        .def_property_readonly("description", &Model::description)
        .def_property_readonly("n_params", &Model::n_params)
        .def_property_readonly("file_type", &Model::file_type, "llama_model_ftype (LLAMA_FTYPE_*)")
        .def_property_readonly("vocab_type", &Model::vocab_type)
        .def_property_readonly("bos", &Model::bos)
        .def_property_readonly("eos", &Model::eos)
        .def_property_readonly("eot", &Model::eot)
        .def_property_readonly("add_bos", &Model::add_bos)
        .def("is_eog", &Model::is_eog, py::arg("token"))
        .def("token_text", &Model::token_text, py::arg("token"))
        .def("token_attr", &Model::token_attr, py::arg("token"))
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
        }, py::arg("seq") = 0, "The token ids the KV cache holds for a sequence, by position.");

    py::class_<CancelToken>(m, "CancelToken")
        .def(py::init<>())
        .def("set", [](CancelToken& c) { c.flag.store(true); }, "Ask the generation using this token to stop.")
        .def_property_readonly("is_set", [](const CancelToken& c) { return c.flag.load(); });

    // Drafters: built by name (drafters.h); the n-gram index is also bound on its own for tests.
    py::class_<Drafter>(m, "Drafter");
    py::class_<NgramDrafter, Drafter>(m, "NgramDrafter")
        .def(py::init<int32_t, int32_t, int32_t>(), py::arg("n_vocab"), py::arg("n_min") = 1, py::arg("n_max") = 16)
        .def("begin", [](NgramDrafter& d, const std::vector<int32_t>& prompt) { d.begin(prompt, SamplingParams{}, true); })
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
        .def("propose",
             [](NgramDrafter& d, const std::vector<int32_t>& history, int32_t max_n) {
                 Rng rng(0);
                 std::vector<int32_t> tokens;
                 std::vector<Distribution> q(static_cast<size_t>(std::max(max_n, 1)));
                 d.draft(history, max_n, rng, tokens, q, nullptr);
                 return tokens;
             },
             py::arg("history"), py::arg("max_n"));
    py::class_<ConsensusPool, std::shared_ptr<ConsensusPool>>(m, "ConsensusPool",
                                                              "The siblings' texts that consensus drafters share.")
        .def(py::init<int32_t, int32_t, int32_t>(), py::arg("n_seq"), py::arg("n_min") = 2, py::arg("n_max") = 8)
        .def_property_readonly("n_seq", &ConsensusPool::n_seq);
    py::class_<ConsensusDrafter, Drafter>(m, "ConsensusDrafter")
        .def(py::init<std::shared_ptr<ConsensusPool>, int32_t, int32_t, int32_t, int32_t>(), py::arg("pool"),
             py::arg("seq"), py::arg("n_vocab"), py::arg("n_min") = 1, py::arg("n_max") = 16)
        .def("begin",
             [](ConsensusDrafter& d, const std::vector<int32_t>& prompt) { d.begin(prompt, SamplingParams{}, true); })
        .def("plan",
             [](ConsensusDrafter& d, const std::vector<int32_t>& history) {
                 const DraftPlan p = d.plan(history);
                 return py::dict("match_len"_a = p.match_len, "next_guess"_a = p.next_guess);
             },
             py::arg("history"))
        .def("propose",
             [](ConsensusDrafter& d, const std::vector<int32_t>& history, int32_t max_n) {
                 Rng rng(0);
                 std::vector<int32_t> tokens;
                 std::vector<Distribution> q(static_cast<size_t>(std::max(max_n, 1)));
                 d.draft(history, max_n, rng, tokens, q, nullptr);
                 return tokens;
             },
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

    // Length policies: built by name (policy.h); make_policy returns the most derived class.
    Struct<PolicyParams>(m, "PolicyParams", "Which length policy to build, and its settings.")
        .field("name", &PolicyParams::name)
        .field("draft_max", &PolicyParams::draft_max)
        .field("p_min", &PolicyParams::p_min)
        .field("gamma", &PolicyParams::gamma)
        .field("h", &PolicyParams::h)
        .done();
    m.def("policies", [] {
        py::list out;
        for (const PolicyInfo& i : policy_catalog()) {
            out.append(py::dict("name"_a = i.name, "default_draft_max"_a = i.default_draft_max,
                                "summary"_a = i.summary));
        }
        return out;
    }, "Every length policy: name, default draft_max, a one-line summary.");
    m.def("make_policy", &make_policy, py::arg("params"));
    py::class_<LengthPolicy>(m, "LengthPolicy")
        .def_property_readonly("name", &LengthPolicy::name)
        .def_property_readonly("draft_max", &LengthPolicy::draft_max)
        // The engine's side of the conversation, for tests and tools that drive a policy directly.
        .def("next_length",
             [](LengthPolicy& p, int32_t round_max, const std::string& source, int32_t match_len, int32_t lag,
                bool near_copy, int32_t next_guess, bool fresh) {
                 return p.next_length(round_max, make_plan(source, match_len, lag, near_copy, next_guess, fresh));
             },
             py::arg("round_max"), py::arg("source") = "model", py::arg("match_len") = 0, py::arg("lag") = 1,
             py::arg("near_copy") = false, py::arg("next_guess") = -1, py::arg("fresh") = false)
        .def("stop_before", &LengthPolicy::stop_before, py::arg("i"), py::arg("belief"), py::arg("known") = -1,
             "Whether the draft ends before token i is drawn (known: the token a greedy draft will propose, "
             "else -1).")
        .def("stop_after", &LengthPolicy::stop_after, py::arg("i"), py::arg("belief"), py::arg("token"),
             "Whether the draft ends right after token i, which it keeps.")
        .def("observe",
             [](LengthPolicy& p, int32_t drafted, int32_t accepted, double draft_s, double verify_s,
                const std::string& source, int32_t match_len, int32_t lag, bool near_copy, int32_t next_guess,
                int32_t guess_hit, int32_t batch_rows, double round_s, int32_t length) {
                 DraftPlan plan = make_plan(source, match_len, lag, near_copy, next_guess);
                 plan.length = length < -1 ? drafted : length;  // the length the policy chose (default: drafted)
                 p.observe({plan, drafted, accepted, draft_s, verify_s, batch_rows, guess_hit, round_s});
             },
             py::arg("drafted"), py::arg("accepted"), py::arg("draft_s"), py::arg("verify_s"),
             py::arg("source") = "model", py::arg("match_len") = 0, py::arg("lag") = 1, py::arg("near_copy") = false,
             py::arg("next_guess") = -1, py::arg("guess_hit") = -1, py::arg("batch_rows") = 0,
             py::arg("round_s") = 0.0, py::arg("length") = -2,
             "Report a round: round_s is its whole wall time (0: unknown, the clock ignores it); length the "
             "length the policy chose (default: drafted).")
        .def("set_remaining", &LengthPolicy::set_remaining, py::arg("tokens"),
             "At most this many tokens are left to generate in the current generation.")
        .def("set_batch", &LengthPolicy::set_batch, py::arg("other_rows"), py::arg("other_seqs"),
             "The next round's decode also holds other_rows rows of other_seqs other sequences (0, 0: alone).")
        .def("plans_jointly", &LengthPolicy::plans_jointly, py::arg("model") = false,
             "Whether a batch may allot this policy's draft lengths jointly (model: its drafter may use a draft "
             "model).")
        .def("allot_lengths",
             [](const LengthPolicy& p, const std::vector<std::tuple<double, double, int32_t>>& bids,
                int32_t max_rows) {
                 std::vector<LengthBid> b;
                 for (const auto& [alpha, cost, longest] : bids) b.push_back({alpha, cost, longest});
                 return p.allot_lengths(b, max_rows);
             },
             py::arg("bids"), py::arg("max_rows") = 512,
             "Joint planning of a shared decode: one draft length per (alpha, cost, longest) bid, each "
             "sequence also holding one row; [] when this policy cannot allot.")
        .def("calibration_sizes", &LengthPolicy::calibration_sizes, py::arg("max_batch"))
        .def("calibrated", &LengthPolicy::calibrated, py::arg("sizes"), py::arg("seconds"))
        .def("may_draft", [](const LengthPolicy& p, const std::string& s) { return p.may_draft(parse_source(s)); },
             py::arg("source"))
        .def("begin_generation", &LengthPolicy::begin_generation);
    py::class_<AutoPolicy, LengthPolicy>(m, "AutoPolicy", "The cost-aware policy; exposes its estimates.")
        .def("verify_cost", &AutoPolicy::verify_cost, py::arg("batch"),
             "Estimated seconds for an n-token target batch (-1: not measured).")
        .def("draft_cost", [](const AutoPolicy& p, const std::string& s) { return p.draft_cost(parse_source(s)); },
             py::arg("source"), "Estimated drafter seconds per token (-1: not measured).")
        .def("recorded_draft_cost", &AutoPolicy::recorded_draft_cost, py::arg("seconds"),
             "The draft model's seconds per token from an earlier process; used until measured here.")
        .def("acceptance",
             [](const AutoPolicy& p, const std::string& s, int32_t match_len) {
                 return p.acceptance(make_plan(s, match_len, 0));
             },
             py::arg("source") = "model", py::arg("match_len") = 0,
             "Estimated acceptance of a draft token (this generation's evidence blended with the past).")
        .def("probe_interval",
             [](const AutoPolicy& p, const std::string& s, int32_t match_len) {
                 return p.probe_interval(make_plan(s, match_len, 0));
             },
             py::arg("source") = "model", py::arg("match_len") = 0)
        .def("host_cost", &AutoPolicy::host_cost, py::arg("rows"),
             "Estimated host seconds (distributions, verification, emitting) of a round of n rows.")
        .def_property_readonly("plain_round_cost", &AutoPolicy::plain_round_cost,
                               "Wall time of a plain round that ran alone (running average; -1 unknown).")
        .def("suspended",
             [](const AutoPolicy& p, int32_t k, const std::string& s, int32_t match_len, bool near_copy) {
                 return p.suspended(make_plan(s, match_len, 0, near_copy), k);
             },
             py::arg("k"), py::arg("source") = "model", py::arg("match_len") = 0, py::arg("near_copy") = false,
             "Whether the clock has suspended drafting k tokens from this source now.")
        .def_property_readonly("memory", &AutoPolicy::memory,
                               "What it learnt that outlives a process: long-run acceptance of the lookup buckets "
                               "(match 1, 2, 3, 4-7, 8-11, >= 12, re-anchored copy), then host seconds h_1, h_row.")
        .def("remember", &AutoPolicy::remember, py::arg("memory"),
             "Start from an earlier process's memory (ignored once this policy has seen a round).")
        .def_property_readonly("rounds_seen", &AutoPolicy::rounds_seen)
        .def_property("clock", &AutoPolicy::clock, &AutoPolicy::set_clock,
                      "Whether the clock judges choices by their wall time (default True; False: the cost model "
                      "alone decides, independent of how round times fell).")
        .def_property_readonly("clock_suspensions", &AutoPolicy::clock_suspensions,
                               "Kinds (source x draft length) the clock suspended, since construction.")
        .def_property_readonly("clock_vetoes", &AutoPolicy::clock_vetoes,
                               "Rounds where the model's choice was suspended by the clock, since construction.")
        .def_property_readonly("calibration", [](const AutoPolicy& p) {
            return std::map<int32_t, double>(p.calibration().begin(), p.calibration().end());
        }, "The target batch timings it was calibrated with ({size: seconds}), to keep on disk.");
    m.def("expected_tokens", py::overload_cast<const std::vector<double>&, int32_t>(&expected_tokens),
          py::arg("alpha"), py::arg("k"));

    // One generation: parameters in, tokens, text and statistics out.
    Struct<GenerateParams>(m, "GenerateParams", "Settings of one generation (engine.h documents each).")
        .field("max_tokens", &GenerateParams::max_tokens)
        .field("sampling", &GenerateParams::sampling)
        .field("draft_sampling", &GenerateParams::draft_sampling)
        .field("seed", &GenerateParams::seed)
        .field("stop", &GenerateParams::stop)
        .field("draft_max", &GenerateParams::draft_max)
        .property("variant", [](const GenerateParams& p) { return verify_variant_names()[static_cast<size_t>(p.variant)]; },
                  [](GenerateParams& p, const std::string& v) { p.variant = parse_verify_variant(v); })
        .field("test_discard_below", &GenerateParams::test_discard_below)
        .field("test_shared_stream", &GenerateParams::test_shared_stream)
        .field("parallel_prefill", &GenerateParams::parallel_prefill)
        .field("prefill_chunk", &GenerateParams::prefill_chunk)
        .field("logprobs", &GenerateParams::logprobs)
        .done();
    bind_stats(m);
    py::class_<GenerateResult>(m, "GenerateResult")
        .def_readonly("tokens", &GenerateResult::tokens)
        .def_property_readonly("text", [](const GenerateResult& r) { return py::bytes(r.text); }, "UTF-8 bytes")
        .def_readonly("stop_reason", &GenerateResult::stop_reason)
        .def_readonly("stats", &GenerateResult::stats)
        .def_property_readonly("logprobs", [](const GenerateResult& r) { return logprob_tuples(r.logprobs); },
                               "[(logprob, [(token, logprob), ...top])] per token (GenerateParams.logprobs >= 0)");

    py::class_<Engine>(m, "Engine")
        .def(py::init<Model&, Drafter*>(), py::arg("target"), py::arg("drafter") = nullptr,
             py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
        .def("generate",
             [](Engine& e, const std::vector<int32_t>& prompt, GenerateParams params, LengthPolicy* policy,
                py::object on_token, CancelToken* cancel) {
                 params.cancel = cancel ? &cancel->flag : nullptr;
                 PyTokenSink sink;
                 sink.callback = std::move(on_token);
                 GenerateResult r;
                 {
                     py::gil_scoped_release release;
                     r = e.generate(prompt, params, std::ref(sink), policy);
                 }
                 if (sink.error) throw std::move(*sink.error);
                 return r;
             },
             py::arg("prompt"), py::arg("params"), py::arg("policy") = nullptr, py::arg("on_token") = py::none(),
             py::arg("cancel") = nullptr, "One generation (the C++ loop, without the GIL).")
        .def("generate_batch",
             [](Engine& e, const std::vector<std::vector<int32_t>>& prompts, GenerateParams params,
                const std::vector<Drafter*>& drafters, const std::vector<LengthPolicy*>& policies,
                py::object on_token, CancelToken* cancel) {
                 if ((!drafters.empty() && drafters.size() != prompts.size()) ||
                     (!policies.empty() && policies.size() != prompts.size())) {
                     throw std::invalid_argument("drafters and policies: one per prompt (or none)");
                 }
                 std::vector<SequenceSpec> specs;
                 for (size_t j = 0; j < prompts.size(); ++j) {
                     specs.push_back({prompts[j], drafters.empty() ? nullptr : drafters[j],
                                      policies.empty() ? nullptr : policies[j]});
                 }
                 params.cancel = cancel ? &cancel->flag : nullptr;
                 PyTokenSink sink;
                 sink.callback = std::move(on_token);
                 std::vector<GenerateResult> r;
                 BatchStats bs;
                 {
                     py::gil_scoped_release release;
                     r = e.generate_batch(specs, params, std::ref(sink), &bs);
                 }
                 if (sink.error) throw std::move(*sink.error);
                 return std::make_pair(std::move(r), bs);
             },
             py::arg("prompts"), py::arg("params"), py::arg("drafters") = std::vector<Drafter*>{},
             py::arg("policies") = std::vector<LengthPolicy*>{}, py::arg("on_token") = py::none(),
             py::arg("cancel") = nullptr,
             "Many sequences, one target decode per round; each its own drafter and policy (engine.h). "
             "on_token(seq, token, text, drafted). Returns (results in order, BatchStats).")
        .def("session",
             [](Engine& e, const GenerateParams& params, py::object on_token, CancelToken* cancel,
                const std::vector<Model*>& draft_models) {
                 auto ps = std::make_unique<PySession>();
                 ps->params = params;
                 ps->params.cancel = cancel ? &cancel->flag : nullptr;
                 ps->sink.callback = std::move(on_token);
                 PyTokenSink* sink = &ps->sink;
                 BatchTokenCallback cb = [sink](int32_t seq, int32_t token, const std::string& text, bool drafted) {
                     return (*sink)(seq, token, text, drafted);
                 };
                 py::gil_scoped_release release;
                 ps->session = std::make_unique<BatchSession>(e, ps->params, cb, draft_models, false);
                 return ps;
             },
             py::arg("params"), py::arg("on_token") = py::none(), py::arg("cancel") = nullptr,
             py::arg("draft_models") = std::vector<Model*>{}, py::keep_alive<0, 1>(), py::keep_alive<0, 4>(),
             py::keep_alive<0, 5>(),
             "A BatchSession on this engine's target: draft_max, variant and prefill_chunk come from params; "
             "each add() brings its own sampling settings. on_token(handle, token, text, drafted).");
    py::class_<PySession>(m, "BatchSession",
                          "Continuous batching (engine.h): sequences join with add() and leave when they finish "
                          "or are cancelled; each step() is one round with one target decode. Use it from one "
                          "thread at a time; close() (or the with-block) releases the models.")
        .def("add",
             [](PySession& ps, const std::vector<int32_t>& prompt, const GenerateParams& params, py::object drafter,
                py::object policy, int32_t stream) {
                 SequenceSpec spec{prompt, drafter.is_none() ? nullptr : drafter.cast<Drafter*>(),
                                   policy.is_none() ? nullptr : policy.cast<LengthPolicy*>(), params, stream};
                 int32_t h;
                 {
                     py::gil_scoped_release release;
                     h = ps.get().add(spec);
                 }
                 ps.refs[h] = py::make_tuple(drafter, policy);  // alive while the sequence is
                 return h;
             },
             py::arg("prompt"), py::arg("params"), py::arg("drafter") = py::none(), py::arg("policy") = py::none(),
             py::arg("stream") = 0,
             "Queue a sequence (its own max_tokens, sampling, seed, stop); returns its handle. "
             "ValueError when every slot is taken (see free_slots).")
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

    bind_info(m);
    bind_tools(m);
}
