// Lookup (suffix: this text, a batch's siblings, memory) when it has a confident
// match (at least min_match tokens, or a copy re-anchored where it diverged),
// the draft model otherwise; the length policy sets the length either way. When
// it declines a lookup draft (length <= 0) the model is offered instead, and
// when it declines the model, any shorter lookup match.
#pragma once

#include <memory>

#include "drafters/model_drafter.h"

namespace pyspec {

class HybridDrafter : public Drafter {
public:
    HybridDrafter(std::unique_ptr<ModelDrafter> model, std::unique_ptr<Drafter> ngram, int32_t min_match = 2)
        : model_(std::move(model)), ngram_(std::move(ngram)), min_match_(min_match) {}

    DraftPlan plan(const std::vector<int32_t>& history) override {
        DraftPlan p = ngram_->plan(history);
        return confident(p) ? p : model_->plan(history);
    }
    DraftPlan choose(const std::vector<int32_t>& history, const LengthFor& length_for) override {
        DraftPlan lookup = ngram_->plan(history);
        if (confident(lookup)) {
            lookup.length = length_for(lookup);
            if (lookup.length > 0) return use(lookup);
        }
        DraftPlan m = model_->plan(history);
        m.length = length_for(m);
        if (m.length > 0) return use(m);
        // The model declined too (on a CPU it usually cannot pay): a shorter
        // match is still worth its own chance, so that having a draft model
        // costs nothing against lookup alone.
        if (lookup.match_len > 0 && !confident(lookup)) lookup.length = length_for(lookup);
        // Report the n-gram plan where there is one: a plain round checks its guess for free.
        return use(lookup.match_len > 0 ? lookup : m);
    }
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) override {
        model_->begin(prompt, sampling);
        ngram_->begin(prompt, sampling);
    }
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) override {
        Drafter& d = chosen_ == DraftSource::kNgram ? static_cast<Drafter&>(*ngram_) : static_cast<Drafter&>(*model_);
        return d.draft(history, max_n, rng, tokens, q, stop);
    }

    Model* model() const override { return model_->model(); }
    int32_t model_seq() const override { return model_->model_seq(); }
    ModelDrafter* model_drafter() override { return chosen_ == DraftSource::kModel ? model_.get() : nullptr; }
    bool use_memory(std::shared_ptr<const SuffixStore> store) override { return ngram_->use_memory(std::move(store)); }

private:
    bool confident(const DraftPlan& p) const { return p.match_len >= min_match_ || (p.near_copy && p.match_len > 0); }
    DraftPlan use(const DraftPlan& p) {
        chosen_ = p.source;
        return p;
    }

    std::unique_ptr<ModelDrafter> model_;
    std::unique_ptr<Drafter> ngram_;  // lookup: a SuffixDrafter (over NgramDrafter, or ConsensusDrafter in a batch)
    int32_t min_match_;
    DraftSource chosen_ = DraftSource::kModel;
};

}  // namespace pyspec
