// Bindings of the length policies (policies/): built by name, and the engine's
// side of the conversation, for tests and tools that drive a policy directly.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/bind.h"
#include "bindings/bind_struct.h"
#include "policies/auto_policy.h"
#include "policies/policy.h"

namespace py = pybind11;
using namespace pyspec;
using pyspec_bind::Struct;

namespace {

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

}  // namespace

void bind_policies(py::module_& m) {
    m.attr("MAX_DRAFT") = kMaxDraft;  // the longest draft, and the largest draft_max (policy.h)
    Struct<PolicyParams>(m, "PolicyParams", "Which length policy to build, and its settings.")
        .field("name", &PolicyParams::name)
        .field("draft_max", &PolicyParams::draft_max)  // None: the policy's default
        .field("p_min", &PolicyParams::p_min)
        .field("gamma", &PolicyParams::gamma)
        .field("h", &PolicyParams::h)
        .done();
    pyspec_bind::def_catalog(m, "policies", &policy_catalog, "default_draft_max", &PolicyInfo::default_draft_max,
                             "Every length policy: name, default draft_max, a one-line summary.");
    m.def("make_policy", &make_policy, py::arg("params"));
    // The engine's side of the conversation, for tests and tools that drive a
    // policy directly: LengthPolicy's hooks here, auto's joint planning below.
    py::class_<LengthPolicy>(m, "LengthPolicy")
        .def_property_readonly("name", &LengthPolicy::name)
        .def_property_readonly("draft_max", &LengthPolicy::draft_max)
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
             "Report a round: verify_s is its target decode's seconds (the public name), round_s its whole wall "
             "time (0: unknown, the clock ignores it); length the length the policy chose (default: drafted).")
        // Calibrated (policy.h), as the engine asks for it: [] and no-op for a policy without one.
        .def("calibration_sizes",
             [](LengthPolicy& p, int32_t max_batch) {
                 Calibrated* c = p.as_calibrated();
                 return c ? c->calibration_sizes(max_batch) : std::vector<int32_t>{};
             },
             py::arg("max_batch"), "Target batch sizes still to be timed ([] for a policy that needs none).")
        .def("calibrated",
             [](LengthPolicy& p, const std::vector<int32_t>& sizes, const std::vector<double>& seconds, bool fresh) {
                 if (Calibrated* c = p.as_calibrated()) c->calibrated(sizes, seconds, fresh);
             },
             py::arg("sizes"), py::arg("seconds"), py::arg("fresh") = true,
             "Timings of target batch sizes; fresh=False: read from disk (take_new_timings leaves them out).")
        .def("begin_generation", &LengthPolicy::begin_generation);
    py::class_<AutoPolicy, LengthPolicy>(m, "AutoPolicy", "The cost-aware policy; exposes its estimates.")
        // JointPlanner (policy.h): what the engine tells and asks a batch-aware policy.
        .def("set_remaining", &AutoPolicy::set_remaining, py::arg("tokens"),
             "At most this many tokens are left to generate in the current generation.")
        .def("set_batch", &AutoPolicy::set_batch, py::arg("other_rows"), py::arg("other_seqs"),
             "The next round's decode also holds other_rows rows of other_seqs other sequences (0, 0: alone).")
        .def("plans_jointly", &AutoPolicy::plans_jointly, py::arg("model") = false,
             "Whether a batch may allot this policy's draft lengths jointly (model: its drafter may use a draft "
             "model).")
        .def("allot_lengths",
             [](const AutoPolicy& p, const std::vector<std::tuple<double, double, int32_t>>& bids,
                int32_t max_rows) {
                 std::vector<LengthBid> b;
                 for (const auto& [alpha, cost, longest] : bids) b.push_back({alpha, cost, longest});
                 return p.allot_lengths(b, max_rows);
             },
             py::arg("bids"), py::arg("max_rows") = 512,
             "Joint planning of a shared decode: one draft length per (alpha, cost, longest) bid, each "
             "sequence also holding one row; [] when this policy cannot allot.")
        .def("may_draft", [](const AutoPolicy& p, const std::string& s) { return p.may_draft(parse_source(s)); },
             py::arg("source"))
        .def("catch_up_pays", &AutoPolicy::catch_up_pays, py::arg("lag"),
             "Whether the draft model's catch-up on `lag` tokens could pay back within the next 128 tokens.")
        .def_property_readonly("catch_up_cost", &AutoPolicy::catch_up_cost,
                               "The draft model's seconds per caught-up token (measured, else its prior; -1: neither).")
        // Its estimates.
        .def("verify_cost", &AutoPolicy::verify_cost, py::arg("batch"),
             "V(n): seconds of a target decode of n rows (-1: not measured).")
        .def("draft_cost", [](const AutoPolicy& p, const std::string& s) { return p.draft_cost(parse_source(s)); },
             py::arg("source"), "Estimated drafter seconds per token (-1: not measured).")
        .def("recorded_draft_cost", &AutoPolicy::recorded_draft_cost, py::arg("seconds"),
             "The draft model's seconds per token from an earlier process; used until measured here.")
        .def("draft_cost_prior", &AutoPolicy::draft_cost_prior, py::arg("steps"),
             "With no cost measured or on record: the draft model's step estimated as this many target steps "
             "(it only decides whether measuring the draft model could pay).")
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
             "Estimated host seconds (distributions, the accept test, emitting) of a round of n rows.")
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
        .def_property("learn_costs", &AutoPolicy::learn_costs, &AutoPolicy::set_learn_costs,
                      "Whether round timings refine its costs (default True; False: they stay as calibrated or "
                      "recorded, while acceptance is still learnt).")
        .def_property_readonly("clock_suspensions", &AutoPolicy::clock_suspensions,
                               "Kinds (source x draft length) the clock suspended, since construction.")
        .def_property_readonly("clock_vetoes", &AutoPolicy::clock_vetoes,
                               "Rounds where the model's choice was suspended by the clock, since construction.")
        .def_property_readonly("calibration", [](const AutoPolicy& p) {
            return std::map<int32_t, double>(p.calibration().begin(), p.calibration().end());
        }, "The target batch timings it has ({size: seconds}): calibrated, or a round's.")
        .def("take_new_timings", [](AutoPolicy& p) {
            const auto t = p.take_new_timings();
            return std::map<int32_t, double>(t.begin(), t.end());
        }, "Timings first measured in this process since the last call ({size: seconds}): new to keep on disk.");
    m.def("expected_tokens", py::overload_cast<const std::vector<double>&, int32_t>(&expected_tokens),
          py::arg("alpha"), py::arg("k"));
}
