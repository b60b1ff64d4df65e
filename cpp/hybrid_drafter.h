// n-gram lookup when it has a confident match (at least min_match tokens), the
// draft model otherwise; the length policy sets the length either way. When the
// policy declines an n-gram draft (length 0), the engine may fall back to the model.
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
        if (p.match_len < min_match_) return fallback(history);
        p.has_fallback = true;
        planned_ = DraftSource::kNgram;
        return p;
    }
    DraftPlan fallback(const std::vector<int32_t>& history) override {
        planned_ = DraftSource::kModel;
        return model_.plan(history);
    }
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool eager) override {
        model_.begin(prompt, sampling, eager);
        ngram_.begin(prompt, sampling, eager);
    }
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) override {
        Drafter& d = planned_ == DraftSource::kNgram ? static_cast<Drafter&>(ngram_) : static_cast<Drafter&>(model_);
        return d.draft(history, max_n, rng, tokens, q, stop);
    }

    Model* model() const override { return model_.model(); }

private:
    ModelDrafter& model_;
    NgramDrafter& ngram_;
    int32_t min_match_;
    DraftSource planned_ = DraftSource::kModel;
};

}  // namespace pyspec
