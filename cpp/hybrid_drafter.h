// n-gram lookup when it has a confident match (at least min_match tokens),
// the draft model otherwise. The length policy sets the length either way.
#pragma once

#include "model_drafter.h"
#include "ngram_drafter.h"

namespace pyspec {

class HybridDrafter : public Drafter {
public:
    HybridDrafter(ModelDrafter& model, NgramDrafter& ngram, int32_t min_match = 2)
        : model_(model), ngram_(ngram), min_match_(min_match) {}

    DraftPlan plan(const std::vector<int32_t>& history) override {
        DraftPlan p = ngram_.plan(history);
        if (p.match_len < min_match_) p = {DraftSource::kModel, 0};
        planned_ = p.source;
        return p;
    }
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) override {
        model_.begin(prompt, sampling);
        ngram_.begin(prompt, sampling);
    }
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, const DraftStopRule& stop) override {
        Drafter& d = planned_ == DraftSource::kNgram ? static_cast<Drafter&>(ngram_) : static_cast<Drafter&>(model_);
        return d.draft(history, max_n, rng, tokens, q, stop);
    }

private:
    ModelDrafter& model_;
    NgramDrafter& ngram_;
    int32_t min_match_;
    DraftSource planned_ = DraftSource::kModel;
};

}  // namespace pyspec
