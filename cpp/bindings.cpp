// pybind11 module pyspec._core: the model wrapper and the generation loop.
// The sampling math is bound in bind_sampling.cpp. Heavy work releases the GIL;
// the per-token callback takes it back briefly to stream text and to notice Ctrl-C.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <llama.h>

#include <atomic>
#include <map>
#include <memory>

#include "errors.h"
#include "engine.h"
#include "model.h"
#include "hybrid_drafter.h"
#include "model_drafter.h"
#include "ngram_drafter.h"
#include "auto_policy.h"
#include "policy.h"

namespace py = pybind11;
using namespace pyspec;

void bind_sampling(py::module_& m);
void bind_info(py::module_& m);

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
    }
}

py::dict stats_to_dict(const GenerationStats& s) {
    py::dict d;
    d["n_prompt_tokens"] = s.n_prompt_tokens;
    d["n_generated"] = s.n_generated;
    d["prompt_s"] = s.prompt_s;
    d["ttft_s"] = s.ttft_s;
    d["decode_s"] = s.decode_s;
    d["decode_tok_s"] = s.decode_tok_s;
    d["rounds"] = s.rounds;
    d["drafted"] = s.drafted;
    d["accepted"] = s.accepted;
    d["draft_s"] = s.draft_s;
    d["verify_s"] = s.verify_s;
    d["overhead_s"] = s.overhead_s;
    d["calibrate_s"] = s.calibrate_s;
    d["drafted_at"] = s.drafted_at;
    d["accepted_at"] = s.accepted_at;
    d["length_hist"] = s.length_hist;
    d["policy_plain"] = s.policy_plain;
    d["ngram_rounds"] = s.ngram_rounds;
    d["ngram_drafted"] = s.ngram_drafted;
    d["ngram_accepted"] = s.ngram_accepted;
    d["stops_before"] = s.stops_before;
    d["stops_after"] = s.stops_after;
    return d;
}

// A flag another thread sets to stop a generation (the Python layer sets it on Ctrl-C).
struct CancelToken {
    std::atomic<bool> flag{false};
};

// Streams to an optional Python callable and checks for Ctrl-C between tokens.
// A Python exception (KeyboardInterrupt included) stops generation; it is
// re-raised once the C++ loop has unwound and the model is in a clean state.
struct PyTokenSink {
    py::object callback;
    std::unique_ptr<py::error_already_set> error;

    bool operator()(int32_t token, const std::string& text, bool drafted) {
        py::gil_scoped_acquire gil;
        try {
            if (!callback.is_none()) {
                py::object r = callback(token, py::bytes(text), drafted);
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

DraftSource parse_source(const std::string& name) {
    if (name == "model") return DraftSource::kModel;
    if (name == "ngram") return DraftSource::kNgram;
    throw std::invalid_argument("unknown draft source '" + name + "' (model, ngram)");
}

DraftPlan make_plan(const std::string& source, int32_t match_len, int32_t lag) {
    DraftPlan p;
    p.source = parse_source(source);
    p.match_len = match_len;
    p.lag = lag;
    return p;
}

const AutoPolicy& as_auto(const LengthPolicy& p) {
    const auto* a = dynamic_cast<const AutoPolicy*>(&p);
    if (!a) throw std::invalid_argument("only the auto policy keeps cost estimates");
    return *a;
}

VerifyVariant parse_variant(const std::string& name) {
    if (name == "correct") return VerifyVariant::kCorrect;
    if (name == "residual_is_p") return VerifyVariant::kResidualIsP;
    if (name == "accept_all") return VerifyVariant::kAcceptAll;
    if (name == "sample_and_match") return VerifyVariant::kSampleAndMatch;
    throw std::invalid_argument("unknown verification variant '" + name + "'");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "pyspec C++ core over llama.cpp";
    llama_backend_init();
    install_log_filter();
    py::register_exception_translator(&translate_errors);

    py::class_<SamplingParams>(m, "SamplingParams")
        .def(py::init([](double temperature, int32_t top_k, double top_p, double min_p) {
                 SamplingParams p{temperature, top_k, top_p, min_p};
                 p.validate();
                 return p;
             }),
             py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("min_p") = 0.0)
        .def_readonly("temperature", &SamplingParams::temperature)
        .def_readonly("top_k", &SamplingParams::top_k)
        .def_readonly("top_p", &SamplingParams::top_p)
        .def_readonly("min_p", &SamplingParams::min_p);

    m.def("llama_system_info", []() { return std::string(llama_print_system_info()); });

    py::class_<Model>(m, "Model")
        .def(py::init([](const std::string& path, int32_t n_ctx, int32_t n_threads, int32_t n_gpu_layers,
                         int32_t n_batch, bool verbose, int32_t flash_attn) {
                 ModelParams p;
                 p.path = path;
                 p.n_ctx = n_ctx;
                 p.n_threads = n_threads;
                 p.n_gpu_layers = n_gpu_layers;
                 p.n_batch = n_batch;
                 p.verbose = verbose;
                 p.flash_attn = flash_attn;
                 py::gil_scoped_release release;
                 return std::make_unique<Model>(p);
             }),
             py::arg("path"), py::arg("n_ctx") = 4096, py::arg("n_threads") = 0, py::arg("n_gpu_layers") = 0,
             py::arg("n_batch") = 512, py::arg("verbose") = false,
             py::arg("flash_attn") = -1)
        .def_property_readonly("path", [](const Model& m) { return m.params().path; })
        .def_property_readonly("n_vocab", &Model::n_vocab)
        .def_property_readonly("n_ctx", &Model::n_ctx)
        .def_property_readonly("n_batch", &Model::n_batch)
        .def_property_readonly("n_threads", [](const Model& m) { return m.params().n_threads; })
        .def_property_readonly("n_gpu_layers", [](const Model& m) { return m.params().n_gpu_layers; })
        .def_property_readonly("flash_attn", &Model::flash_attn, "as run: 1 on, 0 off, -1 auto and unreported")
        .def_property_readonly("flash_attn_requested", [](const Model& m) { return m.params().flash_attn; })
        .def_property_readonly("description", &Model::description)
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
             [](Model& m, const std::vector<int32_t>& tokens, int32_t pos0, int32_t n_logits) {
                 py::gil_scoped_release release;
                 m.decode(tokens.data(), static_cast<int32_t>(tokens.size()), pos0, n_logits);
             },
             py::arg("tokens"), py::arg("pos0"), py::arg("n_logits") = 1,
             "Decode tokens at positions pos0.. keeping logits for the last n_logits (tests, tools).")
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
        .def("truncate", &Model::truncate, py::arg("pos"), py::call_guard<py::gil_scoped_release>())
        .def("pos_max", &Model::pos_max, py::call_guard<py::gil_scoped_release>())
        .def("cached", [](const Model& m) {
            std::vector<int32_t> out;
            {
                py::gil_scoped_release release;
                const auto held = m.lock();
                out = m.cached();
            }
            return out;
        }, "The token ids the KV cache holds, by position.");

    py::class_<CancelToken>(m, "CancelToken")
        .def(py::init<>())
        .def("set", [](CancelToken& c) { c.flag.store(true); }, "Ask the generation using this token to stop.")
        .def_property_readonly("is_set", [](const CancelToken& c) { return c.flag.load(); });

    py::class_<Drafter>(m, "Drafter");
    py::class_<ModelDrafter, Drafter>(m, "ModelDrafter")
        .def(py::init<Model&>(), py::arg("model"), py::keep_alive<1, 2>());
    py::class_<NgramDrafter, Drafter>(m, "NgramDrafter")
        .def(py::init<int32_t, int32_t, int32_t>(), py::arg("n_vocab"), py::arg("n_min") = 1, py::arg("n_max") = 16)
        .def("begin", [](NgramDrafter& d, const std::vector<int32_t>& prompt) { d.begin(prompt, SamplingParams{}, true); })
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
    py::class_<HybridDrafter, Drafter>(m, "HybridDrafter")
        .def(py::init<ModelDrafter&, NgramDrafter&, int32_t>(), py::arg("model"), py::arg("ngram"),
             py::arg("min_match") = 2, py::keep_alive<1, 2>(), py::keep_alive<1, 3>());

    py::class_<LengthPolicy>(m, "LengthPolicy")
        .def(py::init([](const std::string& name, int32_t k, double p_min, double gamma, double h, int32_t cap) {
                 PolicyParams p;
                 p.name = name;
                 p.k = k;
                 p.p_min = p_min;
                 p.gamma = gamma;
                 p.h = h;
                 p.cap = cap;
                 return make_policy(p);
             }),
             py::arg("name"), py::arg("k") = 4, py::arg("p_min") = 0.75, py::arg("gamma") = 0.15, py::arg("h") = 0.3,
             py::arg("cap") = 40)
        .def_property_readonly("name", &LengthPolicy::name)
        // The engine's side of the conversation, for tests and tools that drive a policy directly.
        .def("next_length",
             [](LengthPolicy& p, int32_t k_cap, const std::string& source, int32_t match_len, int32_t lag) {
                 return p.next_length(k_cap, make_plan(source, match_len, lag));
             },
             py::arg("k_cap"), py::arg("source") = "model", py::arg("match_len") = 0, py::arg("lag") = 1)
        .def("stop_before", &LengthPolicy::stop_before, py::arg("i"), py::arg("belief"), py::arg("known") = -1,
             "Whether the draft ends before token i is drawn (known: the token a greedy draft will propose, "
             "else -1).")
        .def("stop_after", &LengthPolicy::stop_after, py::arg("i"), py::arg("belief"), py::arg("token"),
             "Whether the draft ends right after token i, which it keeps.")
        .def("observe",
             [](LengthPolicy& p, int32_t drafted, int32_t accepted, double draft_s, double verify_s,
                const std::string& source, int32_t match_len, int32_t lag) {
                 p.observe({make_plan(source, match_len, lag), drafted, accepted, draft_s, verify_s});
             },
             py::arg("drafted"), py::arg("accepted"), py::arg("draft_s"), py::arg("verify_s"),
             py::arg("source") = "model", py::arg("match_len") = 0, py::arg("lag") = 1)
        .def("calibration_sizes", &LengthPolicy::calibration_sizes, py::arg("max_batch"))
        .def("calibrated", &LengthPolicy::calibrated, py::arg("sizes"), py::arg("seconds"))
        .def("may_draft", [](const LengthPolicy& p, const std::string& s) { return p.may_draft(parse_source(s)); },
             py::arg("source"))
        .def("verify_cost", [](const LengthPolicy& p, int32_t n) { return as_auto(p).verify_cost(n); },
             py::arg("batch"), "auto: estimated seconds for an n-token target batch (-1: not measured)")
        .def("draft_cost",
             [](const LengthPolicy& p, const std::string& s) { return as_auto(p).draft_cost(parse_source(s)); },
             py::arg("source"), "auto: estimated drafter seconds per token (-1: not measured)")
        .def("acceptance",
             [](const LengthPolicy& p, const std::string& s, int32_t match_len) {
                 return as_auto(p).acceptance(make_plan(s, match_len, 0));
             },
             py::arg("source") = "model", py::arg("match_len") = 0,
             "auto: estimated acceptance of a draft token (this generation's evidence blended with the past)")
        .def("begin_generation", &LengthPolicy::begin_generation)
        .def("probe_interval",
             [](const LengthPolicy& p, const std::string& s, int32_t match_len) {
                 return as_auto(p).probe_interval(make_plan(s, match_len, 0));
             },
             py::arg("source") = "model", py::arg("match_len") = 0);
    m.def("expected_tokens", &expected_tokens, py::arg("alpha"), py::arg("k"));

    m.def("check_compatible", &check_compatible, py::arg("target"), py::arg("draft"),
          "Raise IncompatibleModelsError unless the two models share one vocabulary.");

    py::class_<Engine>(m, "Engine")
        .def(py::init<Model&, Drafter*>(), py::arg("target"), py::arg("drafter") = nullptr,
             py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
        .def("generate",
             [](Engine& e, const std::vector<int32_t>& prompt, int32_t max_tokens, const SamplingParams& sampling,
                const SamplingParams& draft_sampling, uint64_t seed, const std::vector<std::string>& stop,
                int32_t draft_max, const std::string& variant, bool parallel_prefill, LengthPolicy* policy,
                py::object on_token, CancelToken* cancel, const std::map<int32_t, double>& known_batch_costs,
                double test_discard_below) {
                 GenerateParams p;
                 p.max_tokens = max_tokens;
                 p.sampling = sampling;
                 p.draft_sampling = draft_sampling;
                 p.seed = seed;
                 p.stop = stop;
                 p.draft_max = draft_max;
                 p.variant = parse_variant(variant);
                 p.parallel_prefill = parallel_prefill;
                 p.cancel = cancel ? &cancel->flag : nullptr;
                 p.known_batch_costs.assign(known_batch_costs.begin(), known_batch_costs.end());
                 p.test_discard_below = test_discard_below;
                 PyTokenSink sink;
                 sink.callback = std::move(on_token);
                 GenerateResult r;
                 {
                     py::gil_scoped_release release;
                     r = e.generate(prompt, p, std::ref(sink), policy);
                 }
                 if (sink.error) throw std::move(*sink.error);
                 py::dict out;
                 out["tokens"] = r.tokens;
                 out["text"] = py::bytes(r.text);
                 out["stop_reason"] = r.stop_reason;
                 out["stats"] = stats_to_dict(r.stats);
                 out["calibrated"] = std::map<int32_t, double>(r.stats.calibrated.begin(), r.stats.calibrated.end());
                 return out;
             },
             py::arg("prompt"), py::arg("max_tokens"), py::arg("sampling"), py::arg("draft_sampling"),
             py::arg("seed"), py::arg("stop"), py::arg("draft_max"), py::arg("variant") = "correct",
             py::arg("parallel_prefill") = false, py::arg("policy") = nullptr, py::arg("on_token") = py::none(),
             py::arg("cancel") = nullptr, py::arg("known_batch_costs") = std::map<int32_t, double>{},
             py::arg("test_discard_below") = 0.0,
             "One generation (the C++ loop, without the GIL). known_batch_costs: target batch timings from "
             "earlier runs; the result's 'calibrated' holds those timed now. test_discard_below is a TEST-ONLY "
             "negative control (a biased stop rule).");

    bind_sampling(m);
    bind_info(m);
}
