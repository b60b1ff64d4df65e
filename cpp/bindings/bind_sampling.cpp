// Python bindings for the sampling core: submodule pyspec._core.sampling.
// The public, documented Python surface is pyspec/sampling.py; this layer checks
// shapes again (it must never read out of bounds whatever it is given) and turns
// std::invalid_argument into ValueError (pybind11's built-in translation).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bind.h"
#include "tools/bench_verify.h"
#include "core/penalties.h"
#include "core/rng.h"
#include "core/sampling.h"

namespace py = pybind11;

namespace {

using pyspec::Distribution;
using pyspec::Rng;
using pyspec::SamplingParams;
using pyspec::SamplingWorkspace;
using pyspec::Storage;
using pyspec::AcceptVariant;

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;
using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// pybind11 holds no shared_ptr<const T>: Python sees the vocabulary through this one, read-only (no setters).
using InfillVocabPtr = std::shared_ptr<pyspec::InfillVocab>;

SamplingParams make_params(double temperature, int32_t top_k, double top_p, double min_p,
                           InfillVocabPtr infill = nullptr) {
    SamplingParams params;
    params.temperature = temperature;
    params.top_k = top_k;
    params.top_p = top_p;
    params.min_p = min_p;
    params.infill = infill != nullptr;
    params.infill_vocab = std::move(infill);
    params.validate();
    return params;
}

Storage parse_storage(const std::string& s) {
    if (s == "auto") return Storage::kAuto;
    if (s == "dense") return Storage::kDense;
    if (s == "sparse") return Storage::kSparse;
    throw std::invalid_argument("storage must be 'auto', 'dense' or 'sparse', got '" + s + "'");
}

int32_t checked_vocab(py::ssize_t v) {
    if (v <= 0) throw std::invalid_argument("the vocabulary is empty (size 0)");
    if (v > INT32_MAX) throw std::invalid_argument("vocabulary size must be < 2^31, got " + std::to_string(v));
    return static_cast<int32_t>(v);
}

// Fills `out` with one Distribution per row of a 2-D array; row errors name the row.
void load_rows(const double* data, py::ssize_t rows, int32_t n_vocab, Storage storage,
               const char* name, std::vector<Distribution>& out) {
    out.resize(static_cast<size_t>(rows));
    for (py::ssize_t r = 0; r < rows; ++r) {
        try {
            out[static_cast<size_t>(r)].assign(data + r * n_vocab, n_vocab, storage);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(std::string(name) + "[" + std::to_string(r) +
                                        "]: " + e.what());
        }
    }
}

py::array_t<double> to_numpy(const Distribution& d) {
    py::array_t<double> out(d.n_vocab());
    d.to_dense(out.mutable_data());
    return out;
}

Distribution from_logits(const F32Array& logits, double temperature, int32_t top_k, double top_p,
                         double min_p, InfillVocabPtr infill = nullptr) {
    if (logits.ndim() != 1) throw std::invalid_argument("logits must be 1-D");
    const int32_t n_vocab = checked_vocab(logits.shape(0));
    const SamplingParams params = make_params(temperature, top_k, top_p, min_p, std::move(infill));
    Distribution d;
    SamplingWorkspace ws;
    {
        py::gil_scoped_release nogil;
        pyspec::compute_distribution(logits.data(), n_vocab, params, d, ws);
    }
    return d;
}

double check_u(double u) {
    if (!(u >= 0.0 && u < 1.0)) throw std::invalid_argument("u must be in [0, 1)");
    return u;
}

py::tuple verify_many(const F64Array& p, const F64Array& q, const py::object& draft_obj,
                      int64_t n_rounds, uint64_t seed, const std::string& variant_name,
                      const std::string& storage_name, bool return_drafts) {
    const AcceptVariant variant = pyspec::parse_accept_variant(variant_name);
    const Storage storage = parse_storage(storage_name);
    if (p.ndim() != 2) throw std::invalid_argument("p must be 2-D (n+1, n_vocab)");
    if (q.ndim() != 2) throw std::invalid_argument("q must be 2-D (n, n_vocab)");
    if (n_rounds < 0) throw std::invalid_argument("n_rounds must be >= 0");
    const py::ssize_t n_draft = q.shape(0);
    if (p.shape(0) != n_draft + 1) {
        throw std::invalid_argument("p must have one more row than q (" +
                                    std::to_string(p.shape(0)) + " vs " +
                                    std::to_string(n_draft) + ")");
    }
    const int32_t n_vocab = checked_vocab(p.shape(1));
    // q may have fewer or more columns (vocabularies differing by padding ids).
    const int32_t n_vocab_q = checked_vocab(q.shape(1));
    if (n_draft > INT32_MAX) throw std::invalid_argument("too many drafts");
    const int32_t n = static_cast<int32_t>(n_draft);

    const bool sample_drafts = draft_obj.is_none();
    I32Array fixed_draft;
    if (!sample_drafts) {
        fixed_draft = draft_obj.cast<I32Array>();
        if (fixed_draft.ndim() != 1 || fixed_draft.shape(0) != n_draft) {
            throw std::invalid_argument("draft must have shape (n,): one token per row of q");
        }
    }
    if (return_drafts && !sample_drafts) {
        throw std::invalid_argument("return_drafts needs draft=None (drafts sampled from q)");
    }

    py::array_t<int32_t> n_accepted(n_rounds);
    py::array_t<int32_t> next_token(n_rounds);
    py::array_t<int32_t> drafts_out(std::vector<py::ssize_t>{
        return_drafts ? static_cast<py::ssize_t>(n_rounds) : 0, n_draft});

    const double* p_data = p.data();
    const double* q_data = q.data();
    const int32_t* fixed = sample_drafts ? nullptr : fixed_draft.data();
    int32_t* acc = n_accepted.mutable_data();
    int32_t* nxt = next_token.mutable_data();
    int32_t* dout = drafts_out.mutable_data();
    {
        py::gil_scoped_release nogil;
        std::vector<Distribution> pd;
        std::vector<Distribution> qd;
        load_rows(p_data, n + 1, n_vocab, storage, "p", pd);
        load_rows(q_data, n, n_vocab_q, storage, "q", qd);
        std::vector<int32_t> draft(static_cast<size_t>(n));
        if (!sample_drafts) draft.assign(fixed, fixed + n);
        Rng rng(seed);
        for (int64_t r = 0; r < n_rounds; ++r) {
            if (sample_drafts) {
                for (int32_t i = 0; i < n; ++i) {
                    draft[static_cast<size_t>(i)] = qd[static_cast<size_t>(i)].sample(rng.uniform());
                }
                if (return_drafts) {
                    std::copy(draft.begin(), draft.end(), dout + r * n);
                }
            }
            const pyspec::AcceptResult res =
                pyspec::accept_drafts(pd.data(), qd.data(), draft.data(), n, rng, variant);
            acc[r] = res.n_accepted;
            nxt[r] = res.next_token;
        }
    }
    if (return_drafts) return py::make_tuple(n_accepted, next_token, drafts_out);
    return py::make_tuple(n_accepted, next_token);
}

py::dict bench_verify(const F32Array& logits_p, const F32Array& logits_q, double temperature,
                      int32_t top_k, double top_p, double min_p, double seconds, uint64_t seed) {
    if (logits_p.ndim() != 2 || logits_q.ndim() != 2) {
        throw std::invalid_argument("logits_p and logits_q must be 2-D");
    }
    const py::ssize_t n_draft = logits_q.shape(0);
    if (logits_p.shape(0) != n_draft + 1 || logits_q.shape(1) != logits_p.shape(1)) {
        throw std::invalid_argument("logits_p must be (n+1, V) and logits_q (n, V)");
    }
    if (!(seconds > 0.0)) throw std::invalid_argument("seconds must be > 0");
    const int32_t n_vocab = checked_vocab(logits_p.shape(1));
    const int32_t n = static_cast<int32_t>(n_draft);
    const SamplingParams params = make_params(temperature, top_k, top_p, min_p);
    pyspec::VerifyBench b;
    {
        py::gil_scoped_release nogil;
        b = pyspec::bench_verify(logits_p.data(), logits_q.data(), n, n_vocab, params, seconds, seed);
    }
    py::dict out;
    out["n_vocab"] = n_vocab;
    out["n_draft"] = n;
    out["verify_only_rounds"] = b.verify_only_rounds;
    out["verify_only_seconds"] = b.verify_only_seconds;
    out["verify_only_rounds_per_s"] = static_cast<double>(b.verify_only_rounds) / b.verify_only_seconds;
    out["full_rounds"] = b.full_rounds;
    out["full_seconds"] = b.full_seconds;
    out["full_rounds_per_s"] = static_cast<double>(b.full_rounds) / b.full_seconds;
    out["mean_accepted"] = b.mean_accepted;
    return out;
}

}  // namespace

void bind_sampling(py::module_& m) {
    py::module_ sm = m.def_submodule(
        "sampling",
        "Sampling core (C++): logits -> distribution, and lossless speculative verification. "
        "Use pyspec.sampling for the documented Python API.");

    py::class_<pyspec::InfillVocab, InfillVocabPtr>(
        sm, "InfillVocab", "A vocabulary as the infill sampler reads it (Model.infill_vocab(); core/infill.h).")
        .def_property_readonly("n_vocab", [](const pyspec::InfillVocab& v) { return v.pieces.size(); })
        .def_readonly("end", &pyspec::InfillVocab::end);

    py::class_<Distribution>(sm, "Distribution",
                             "A probability vector over a vocabulary (sparse or dense storage).")
        .def_static("from_logits", &from_logits, py::arg("logits"), py::arg("temperature") = 1.0,
                    py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("min_p") = 0.0,
                    py::arg("infill") = nullptr)
        .def_static(
            "from_probs",
            [](const F64Array& p, const std::string& storage) {
                if (p.ndim() != 1) throw std::invalid_argument("probabilities must be 1-D");
                Distribution d;
                d.assign(p.data(), checked_vocab(p.shape(0)), parse_storage(storage));
                return d;
            },
            py::arg("p"), py::arg("storage") = "auto")
        .def_static(
            "one_hot",
            [](int32_t token, int32_t n_vocab) {
                Distribution d;
                d.set_one_hot(token, n_vocab);
                return d;
            },
            py::arg("token"), py::arg("n_vocab"))
        .def_property_readonly("n_vocab", &Distribution::n_vocab)
        .def_property_readonly("dense", &Distribution::dense)
        .def_property_readonly("support_size", &Distribution::support_size)
        .def_property_readonly("total", &Distribution::total)
        .def("prob", &Distribution::prob, py::arg("token"))
        .def("argmax", &Distribution::argmax)
        .def("entropy", &Distribution::entropy)
        .def(
            "sample", [](const Distribution& d, double u) { return d.sample(check_u(u)); },
            py::arg("u"))
        .def("to_numpy", &to_numpy);

    sm.def(
        "distribution",
        [](const F32Array& logits, double temperature, int32_t top_k, double top_p, double min_p,
           InfillVocabPtr infill) {
            return to_numpy(from_logits(logits, temperature, top_k, top_p, min_p, std::move(infill)));
        },
        py::arg("logits"), py::arg("temperature") = 1.0, py::arg("top_k") = 0,
        py::arg("top_p") = 1.0, py::arg("min_p") = 0.0, py::arg("infill") = nullptr);

    sm.def(
        "penalize",
        [](const F32Array& logits, const I32Array& history, const pyspec::Penalties& pen, size_t n_prompt) {
            if (logits.ndim() != 1) throw std::invalid_argument("logits must be 1-D");
            if (history.ndim() != 1) throw std::invalid_argument("history must be 1-D");
            const int32_t n_vocab = checked_vocab(logits.shape(0));
            pen.validate(n_vocab);
            const size_t n = static_cast<size_t>(history.shape(0));
            const size_t start = pen.window_start(n_prompt, n);
            std::vector<float> out;
            std::vector<int32_t> counts;
            pyspec::apply_penalties(logits.data(), n_vocab, pen, history.data() + start, n - start, out, counts);
            return py::array_t<float>(static_cast<py::ssize_t>(out.size()), out.data());
        },
        py::arg("logits"), py::arg("history"), py::arg("penalties"), py::arg("n_prompt") = 0,
        "The logits of the row after `history` (whose first n_prompt tokens are the prompt) under "
        "penalties.logit_bias and the penalties of its window: core/penalties.h.");
    sm.def("residual_mass", &pyspec::residual_mass, py::arg("p"), py::arg("q"));
    sm.def(
        "sample_residual",
        [](const Distribution& p, const Distribution& q, double u) {
            return pyspec::sample_residual(p, q, check_u(u));
        },
        py::arg("p"), py::arg("q"), py::arg("u"));
    sm.attr("RESIDUAL_MIN_MASS") = pyspec::kResidualMinMass;
    sm.attr("VARIANTS") = py::tuple(py::cast(pyspec::accept_variant_names()));

    sm.def("verify_many", &verify_many, py::arg("p"), py::arg("q"), py::arg("draft"),
           py::arg("n_rounds"), py::arg("seed"), py::arg("variant") = "correct",
           py::arg("storage") = "auto", py::arg("return_drafts") = false);

    sm.def("bench_verify", &bench_verify, py::arg("logits_p"), py::arg("logits_q"),
           py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
           py::arg("seconds"), py::arg("seed"));
}
