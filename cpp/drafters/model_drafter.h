// The classic drafter: a smaller model sharing the target's vocabulary, sampled
// autoregressively with its own settings. Its KV cache follows the committed
// sequence lazily: after a rejection it drops the tail, after a fully accepted
// round it catches up on the missing tokens in the same decode as the next
// draft's first position.
//
// A catch-up feeds at most `window` tokens: when more are missing (a new
// conversation's prompt, a long stretch drafted by lookup) the cache starts
// over on the history's last `window` tokens, at position 0. Drafts are guesses
// the target checks, so a draft model that sees less of the text stays
// lossless; it then costs a window's prefill instead of the whole prompt's
// (~half the target's on a CPU). The cache holds history[offset_:], and is
// content-addressed like every cache here (its tokens at positions 0..n).
//
// Each drafter decodes in its own sequence `seq` of the draft model's context,
// so the sequences of a batch draft together: draft_together() runs one
// llama_decode per draft position for all of them.
#pragma once

#include "constraint/grammar.h"
#include "core/penalties.h"
#include "core/row.h"
#include "drafters/drafter.h"
#include "model/model.h"

namespace pyspec {

class ModelDrafter;

// One sequence's draft in a draft_together() call; the arguments of Drafter::draft.
struct ModelDraftJob {
    ModelDrafter* drafter;
    const std::vector<int32_t>* history;
    int32_t max_n;
    Rng* rng;
    std::vector<int32_t>* tokens;
    std::vector<Distribution>* q;
    DraftStopRule* stop;
    // The sequence's grammar (null: none): q is drawn under its mask and each
    // drawn token is pushed (constraint/grammar.h).
    GrammarState* grammar = nullptr;
    // The target's biases and penalties (null: none), applied to q too with the
    // same window (the history's first n_prompt tokens are the prompt): a draft
    // that follows the penalised target is accepted more often. Any q is lossless.
    const Penalties* penalties = nullptr;
    size_t n_prompt = 0;
    // Out: whether this draft's catch-up started the cache over on a window.
    bool windowed = false;
};

// Draft for several sequences of one draft model at once: each job as its
// drafter's draft() would (same draws from its rng, same stop rules), with one
// llama_decode per draft position holding a row for every job still drafting.
// Every job's drafter must use the same model, each its own sequence.
// Returns the number of draft-model decodes it ran.
int32_t draft_together(std::vector<ModelDraftJob>& jobs);

class ModelDrafter : public Drafter {
public:
    // The most tokens one catch-up feeds (0: all); DrafterParams::draft_window.
    static constexpr int32_t kDefaultWindow = 256;

    // std::invalid_argument unless the model's context holds sequence `seq`.
    explicit ModelDrafter(Model& model, int32_t seq = 0, int32_t window = kDefaultWindow);

    DraftPlan plan(const std::vector<int32_t>& history) override;
    void begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) override;
    int32_t draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng, std::vector<int32_t>& tokens,
                  std::vector<Distribution>& q, DraftStopRule* stop) override;
    Model* model() const override { return &model_; }
    int32_t model_seq() const override { return seq_; }
    ModelDrafter* model_drafter() override { return this; }

private:
    friend int32_t draft_together(std::vector<ModelDraftJob>& jobs);
    // q for the job's next token from logits row `row`; false when its stop rule ends the draft here.
    bool next(ModelDraftJob& job, int32_t row, int32_t i);
    // Tokens of `history` past offset_ that the cache holds; re-anchors offset_
    // on a window (and returns 0, setting `windowed`) when more than window_
    // are missing or the context is full.
    size_t kept(const std::vector<int32_t>& history, bool& windowed);

    Model& model_;
    int32_t seq_;
    int32_t window_;
    size_t offset_ = 0;  // the history index at the cache's position 0
    SamplingParams sampling_;
    SamplingParams belief_sampling_;  // sampling_ at T = 1: the stop rules' view of a greedy draft
    Distribution belief_;
    RowPipeline row_;  // q's pipeline and its scratch (core/row.h)
};

// Throws IncompatibleModelsError unless the draft's vocabulary matches the
// target's: same tokenizer type, same BOS/EOS, identical token texts over the
// shared id range; extra ids in either model must be unused padding.
void check_compatible(const Model& target, const Model& draft);

}  // namespace pyspec
