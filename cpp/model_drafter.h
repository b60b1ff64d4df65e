// The classic drafter: a smaller model sharing the target's vocabulary, sampled
// autoregressively with its own settings. Its KV cache follows the committed
// sequence lazily: after a rejection it drops the tail, after a fully accepted
// round it catches up on the missing tokens in one batch.
#pragma once

#include "drafter.h"
#include "model.h"

namespace pyspec {

class ModelDrafter : public Drafter {
public:
    explicit ModelDrafter(Model& model);

    DraftPlan plan(const std::vector<int32_t>& history) override;
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool prefill) override;
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) override;
    Model* model() const override { return &model_; }

private:
    Model& model_;
    SamplingParams sampling_;
    SamplingParams belief_sampling_;  // sampling_ at T = 1: the stop rules' view of a greedy draft
    Distribution belief_;
    SamplingWorkspace ws_;
};

// Throws IncompatibleModelsError unless the draft's vocabulary matches the
// target's: same tokenizer type, same BOS/EOS, identical token texts over the
// shared id range; extra ids in either model must be unused padding.
void check_compatible(const Model& target, const Model& draft);

}  // namespace pyspec
