// Lookup (n-gram, or consensus over a batch's samples) when it has a confident
// match (at least min_match tokens, or a copy re-anchored where it diverged),
// the draft model otherwise; the length policy sets the length either way, and
// when it declines a lookup draft (length <= 0) the model is offered instead.
#pragma once

#include <memory>

#include "model_drafter.h"

namespace pyspec {

class HybridDrafter : public Drafter {
public:
    HybridDrafter(std::unique_ptr<ModelDrafter> model, std::unique_ptr<Drafter> ngram, int32_t min_match = 2)
        : model_(std::move(model)), ngram_(std::move(ngram)), min_match_(min_match) {}

    DraftPlan plan(const std::vector<int32_t>& history) override {
        DraftPlan p = ngram_->plan(history);
        return p.match_len >= min_match_ || (p.near_copy && p.match_len > 0) ? p : model_->plan(history);
    }
    DraftPlan choose(const std::vector<int32_t>& history, const LengthFor& length_for) override {
        DraftPlan p = plan(history);
        if (p.source == DraftSource::kNgram) {
            p.length = length_for(p);
            if (p.length > 0) return use(p);
            DraftPlan m = model_->plan(history);
            m.length = length_for(m);
            // Both declined: report the n-gram plan, whose guess the plain round checks for free.
            return use(m.length > 0 ? m : p);
        }
        p.length = length_for(p);
        return use(p);
    }
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool prefill) override {
        model_->begin(prompt, sampling, prefill);
        ngram_->begin(prompt, sampling, prefill);
    }
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) override {
        Drafter& d = chosen_ == DraftSource::kNgram ? static_cast<Drafter&>(*ngram_) : static_cast<Drafter&>(*model_);
        return d.draft(history, max_n, rng, tokens, q, stop);
    }

    Model* model() const override { return model_->model(); }
    int32_t model_seq() const override { return model_->model_seq(); }
    ModelDrafter* model_drafter() override { return chosen_ == DraftSource::kModel ? model_.get() : nullptr; }

private:
    DraftPlan use(const DraftPlan& p) {
        chosen_ = p.source;
        return p;
    }

    std::unique_ptr<ModelDrafter> model_;
    std::unique_ptr<Drafter> ngram_;  // lookup: NgramDrafter, or ConsensusDrafter in a batch
    int32_t min_match_;
    DraftSource chosen_ = DraftSource::kModel;
};

}  // namespace pyspec
