// The drafters a user can name, and the one place they are built.
// They are described once, in the README.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "drafters/drafter.h"
#include "drafters/model_drafter.h"
#include "model/model.h"

namespace pyspec {

struct DrafterInfo {
    const char* name;
    bool needs_draft_model;
    const char* summary;  // one line, for --help
};
const std::vector<DrafterInfo>& drafter_catalog();

struct DrafterParams {
    std::string name;          // empty: "hybrid" with a draft model, "suffix" without
    int32_t ngram_min = 1;     // shortest n-gram match that proposes a draft
    int32_t ngram_max = 16;    // longest n-gram matched
    int32_t hybrid_min_match = 2;  // hybrid: n-gram matches at least this long win over the model
    // A draft model catches up on at most this many tokens (model_drafter.h; 0: all).
    int32_t draft_window = ModelDrafter::kDefaultWindow;
};

// The resolved name of `params.name` (its default when empty). Throws
// std::invalid_argument for an unknown name or a missing draft model.
std::string drafter_name(const DrafterParams& params, bool have_draft_model);

// Builds the drafter. `draft` may be null for drafters that need no model;
// it must share the target's vocabulary (IncompatibleModelsError otherwise).
std::unique_ptr<Drafter> make_drafter(const DrafterParams& params, const Model& target, Model* draft);

// One drafter per sequence of a batch of n (drafters keep per-sequence state):
// "ngram", "consensus" (one pool over the n samples) and "suffix" (consensus
// and memory) need no model; "model" and "hybrid" (the model beside suffix
// lookup) give sequence j sequence j of the draft model's context, which must
// hold n (n_seq_max). With `siblings` false (a server's slots, whose sequences
// belong to different requests and users) each sequence's lookup sees only its
// own text: its consensus pool holds it alone.
std::vector<std::unique_ptr<Drafter>> make_batch_drafters(const DrafterParams& params, const Model& target,
                                                          Model* draft, int32_t n, bool siblings = true);

}  // namespace pyspec
