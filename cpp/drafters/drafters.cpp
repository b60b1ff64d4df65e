#include "drafters/drafters.h"

#include <algorithm>
#include <stdexcept>

#include "drafters/consensus_drafter.h"
#include "drafters/hybrid_drafter.h"
#include "drafters/model_drafter.h"
#include "drafters/ngram_drafter.h"
#include "drafters/suffix_drafter.h"

namespace pyspec {

const std::vector<DrafterInfo>& drafter_catalog() {
    static const std::vector<DrafterInfo> catalog = {
        {"model", true, "a smaller model with the target's vocabulary"},
        {"ngram", false, "prompt lookup: continue the longest earlier n-gram match (no draft model)"},
        {"hybrid", true, "n-gram lookup on a match of >= 2 tokens, else the draft model"},
        {"consensus", false, "parallel samples draft what their siblings wrote (n > 1; alone: n-gram lookup)"},
        {"suffix", false, "lookup in this text, its sibling samples and memory of earlier requests (no draft model)"},
    };
    return catalog;
}

std::string drafter_name(const DrafterParams& params, bool have_draft_model) {
    const std::string name = !params.name.empty() ? params.name : have_draft_model ? "hybrid" : "suffix";
    std::string names;
    for (const DrafterInfo& info : drafter_catalog()) {
        if (name == info.name) {
            if (info.needs_draft_model && !have_draft_model) {
                throw std::invalid_argument("the '" + name + "' drafter needs a draft model");
            }
            return name;
        }
        names += (names.empty() ? "" : ", ") + std::string(info.name);
    }
    throw std::invalid_argument("unknown drafter '" + name + "'; choose from " + names);
}

std::unique_ptr<Drafter> make_drafter(const DrafterParams& params, const Model& target, Model* draft) {
    const std::string name = drafter_name(params, draft != nullptr);
    const int32_t n_vocab = target.n_vocab();
    auto ngram = [&] { return std::make_unique<NgramDrafter>(n_vocab, params.ngram_min, params.ngram_max); };
    if (name == "ngram") return ngram();
    if (name == "suffix") return std::make_unique<SuffixDrafter>(ngram(), n_vocab);
    if (name == "consensus") {  // a batch gives each sample its own, over one pool (pyspec/speculative.py)
        return std::make_unique<ConsensusDrafter>(std::make_shared<ConsensusPool>(1), 0, n_vocab, params.ngram_min,
                                                  params.ngram_max);
    }
    check_compatible(target, *draft);
    auto model = std::make_unique<ModelDrafter>(*draft, 0, params.draft_window);
    if (name == "model") return model;
    return std::make_unique<HybridDrafter>(std::move(model), std::make_unique<SuffixDrafter>(ngram(), n_vocab),
                                           params.hybrid_min_match);
}

std::vector<std::unique_ptr<Drafter>> make_batch_drafters(const DrafterParams& params, const Model& target,
                                                          Model* draft, int32_t n, bool siblings) {
    if (n < 1) throw std::invalid_argument("a batch needs at least one sequence");
    const std::string name = drafter_name(params, draft != nullptr);
    if (draft) check_compatible(target, *draft);
    const std::shared_ptr<ConsensusPool> shared = siblings ? std::make_shared<ConsensusPool>(n) : nullptr;
    const int32_t n_vocab = target.n_vocab();
    std::vector<std::unique_ptr<Drafter>> out;
    for (int32_t j = 0; j < n; ++j) {
        // Without siblings, sequence j is sample 0 of a pool of its own.
        const std::shared_ptr<ConsensusPool> pool = siblings ? shared : std::make_shared<ConsensusPool>(1);
        const int32_t sample = siblings ? j : 0;
        // Lookup in a batch: the sample's own text and its siblings' (consensus), and memory.
        auto lookup = [&]() -> std::unique_ptr<Drafter> {
            return std::make_unique<SuffixDrafter>(
                std::make_unique<ConsensusDrafter>(pool, sample, n_vocab, params.ngram_min, params.ngram_max), n_vocab);
        };
        if (name == "ngram") {
            out.push_back(std::make_unique<NgramDrafter>(n_vocab, params.ngram_min, params.ngram_max));
        } else if (name == "consensus") {
            out.push_back(std::make_unique<ConsensusDrafter>(pool, sample, n_vocab, params.ngram_min, params.ngram_max));
        } else if (name == "suffix") {
            out.push_back(lookup());
        } else if (name == "model") {
            out.push_back(std::make_unique<ModelDrafter>(*draft, j, params.draft_window));
        } else {
            out.push_back(std::make_unique<HybridDrafter>(std::make_unique<ModelDrafter>(*draft, j, params.draft_window), lookup(),
                                                          params.hybrid_min_match));
        }
    }
    return out;
}

}  // namespace pyspec
