#include "model_drafter.h"

#include <llama.h>

#include <algorithm>
#include <stdexcept>

#include "errors.h"

namespace pyspec {

ModelDrafter::ModelDrafter(Model& model) : model_(model) {}

DraftPlan ModelDrafter::plan(const std::vector<int32_t>& history) {
    DraftPlan p;
    p.lag = static_cast<int32_t>(history.size() - common_prefix(model_.cached(), history));
    return p;
}

void ModelDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling, bool prefill) {
    sampling.validate();
    sampling_ = sampling;
    belief_sampling_ = sampling;
    belief_sampling_.temperature = 1.0;
    // Reuse whatever prefix of the prompt the cache already holds.
    const size_t keep = common_prefix(model_.cached(), prompt);
    model_.truncate(static_cast<int32_t>(keep));
    if (prefill && keep < prompt.size()) {
        model_.decode(prompt.data() + keep, static_cast<int32_t>(prompt.size() - keep), static_cast<int32_t>(keep), 0);
    }
}

int32_t ModelDrafter::draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                            std::vector<int32_t>& tokens, std::vector<Distribution>& q, DraftStopRule* stop) {
    tokens.clear();
    // Never write past the draft's context: position of the last fed token < n_ctx.
    max_n = std::min<int32_t>(max_n, model_.n_ctx() - static_cast<int32_t>(history.size()));
    if (max_n <= 0 || history.empty()) return 0;

    // Sync the cache with the committed sequence: drop a rejected tail, then feed
    // everything missing (usually one token; two after a fully accepted round).
    size_t keep = common_prefix(model_.cached(), history);
    if (keep == history.size()) --keep;  // need logits for the last token
    model_.decode(history.data() + keep, static_cast<int32_t>(history.size() - keep), static_cast<int32_t>(keep), 1);

    const int32_t n_vocab = model_.n_vocab();
    const bool greedy = sampling_.greedy();
    for (int32_t i = 0; i < max_n; ++i) {
        Distribution& qi = q[static_cast<size_t>(i)];
        try {
            compute_distribution(model_.logits(0), n_vocab, sampling_, qi, ws_);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the draft model produced invalid logits: ") + e.what());
        }
        // The stop rules' view (drafter.h): q itself, or for a greedy draft (q one-hot)
        // its T = 1 distribution, with the token it will propose known in advance.
        const Distribution* belief = &qi;
        if (stop && greedy) {
            compute_distribution(model_.logits(0), n_vocab, belief_sampling_, belief_, ws_);
            belief = &belief_;
        }
        if (stop && stop->stop_before(i, *belief, greedy ? qi.argmax() : -1)) break;
        const int32_t tok = greedy ? qi.argmax() : qi.sample(rng.uniform());
        tokens.push_back(tok);
        if (stop && stop->stop_after(i, *belief, tok)) {
            if (stop->discards_test_only()) tokens.pop_back();
            break;
        }
        if (i + 1 == max_n) break;
        model_.decode(&tok, 1, static_cast<int32_t>(model_.cached().size()), 1);
    }
    return static_cast<int32_t>(tokens.size());
}

// ---------------------------------------------------------------- compatibility

namespace {

// Ids beyond the other vocabulary are tolerated only when they are padding
// that no tokenizer path can produce.
bool is_padding(const Model& m, int32_t id) {
    const int32_t attr = m.token_attr(id);
    if (attr == LLAMA_TOKEN_ATTR_UNDEFINED || (attr & LLAMA_TOKEN_ATTR_UNUSED)) return true;
    const std::string text = m.token_text(id);
    return text.empty() || text.find("PAD") != std::string::npos || text.find("pad") != std::string::npos;
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

void check_compatible(const Model& target, const Model& draft) {
    if (target.vocab_type() != draft.vocab_type()) {
        throw IncompatibleModelsError("draft and target use different tokenizer types (" +
                                      std::to_string(target.vocab_type()) + " vs " +
                                      std::to_string(draft.vocab_type()) +
                                      "); speculative decoding needs one shared vocabulary");
    }
    auto same_special = [&](const char* what, int32_t a, int32_t b) {
        if (a != b) {
            throw IncompatibleModelsError(std::string("draft and target disagree on the ") + what + " token (" +
                                          std::to_string(a) + " vs " + std::to_string(b) + ")");
        }
    };
    same_special("BOS", target.bos(), draft.bos());
    same_special("EOS", target.eos(), draft.eos());
    same_special("EOT", target.eot(), draft.eot());
    const int32_t shared = std::min(target.n_vocab(), draft.n_vocab());
    for (int32_t id = 0; id < shared; ++id) {
        const std::string a = target.token_text(id);
        const std::string b = draft.token_text(id);
        if (a != b) {
            throw IncompatibleModelsError("draft and target vocabularies differ at token " + std::to_string(id) +
                                          ": target " + quoted(a) + " vs draft " + quoted(b));
        }
        if (target.is_eog(id) != draft.is_eog(id)) {
            throw IncompatibleModelsError("draft and target disagree on whether token " + std::to_string(id) + " (" +
                                          quoted(a) + ") ends generation");
        }
    }
    const Model& bigger = target.n_vocab() > draft.n_vocab() ? target : draft;
    for (int32_t id = shared; id < bigger.n_vocab(); ++id) {
        if (!is_padding(bigger, id)) {
            throw IncompatibleModelsError(std::string(&bigger == &target ? "target" : "draft") +
                                          " has extra token " + std::to_string(id) + " " +
                                          quoted(bigger.token_text(id)) + " that the other model lacks");
        }
    }
}

}  // namespace pyspec
