#include "drafters/model_drafter.h"

#include <llama.h>

#include <algorithm>
#include <stdexcept>

#include "core/errors.h"
#include "core/tokens.h"

namespace pyspec {

ModelDrafter::ModelDrafter(Model& model, int32_t seq, int32_t window)
    : model_(model), seq_(seq), window_(std::max(window, 0)) {
    if (seq < 0 || seq >= model.n_seq()) {
        throw std::invalid_argument("the draft model's context holds " + std::to_string(model.n_seq()) +
                                    " sequences; a drafter for sequence " + std::to_string(seq) +
                                    " needs it loaded with n_seq_max >= " + std::to_string(seq + 1));
    }
}

size_t ModelDrafter::kept(const std::vector<int32_t>& history, bool& windowed) {
    windowed = false;
    if (offset_ >= history.size()) offset_ = 0;  // a shorter history: start from its beginning
    const size_t keep = common_prefix_at(model_.cached(seq_), history, offset_);
    // Re-anchor when the catch-up would be long, or when the context is full
    // (a window lets the draft model go on drafting there).
    const size_t missing = history.size() - offset_ - keep;
    const bool full = history.size() - offset_ >= static_cast<size_t>(model_.n_ctx());
    if (window_ > 0 && window_ < model_.n_ctx() && (missing > static_cast<size_t>(window_) || full)) {
        offset_ = history.size() - static_cast<size_t>(window_);
        windowed = true;
        return 0;
    }
    return keep;
}

DraftPlan ModelDrafter::plan(const std::vector<int32_t>& history) {
    DraftPlan p;
    bool windowed = false;
    const size_t from = offset_;
    p.lag = static_cast<int32_t>(history.size() - offset_ - kept(history, windowed));
    offset_ = from;  // planning only measures; the draft re-anchors
    return p;
}

void ModelDrafter::begin(const std::vector<int32_t>& prompt, const SamplingParams& sampling) {
    sampling.validate();
    sampling_ = sampling;
    belief_sampling_ = sampling;
    belief_sampling_.temperature = 1.0;
    // Reuse what the cache already holds of the prompt: a window of an earlier
    // turn of this conversation (its text, found where it sits in the prompt),
    // or a prefix, in this sequence or copied from another (samples of one
    // prompt process it once). The first draft catches up on the rest.
    const std::vector<int32_t>& c = model_.cached(seq_);
    size_t best = 0, at = 0;
    for (size_t o = 1; !c.empty() && o < prompt.size(); ++o) {
        if (prompt[o] != c[0]) continue;
        const size_t m = common_prefix_at(c, prompt, o);
        if (m > best) best = m, at = o;
        if (best == c.size()) break;
    }
    if (best > common_prefix(c, prompt)) {
        offset_ = at;
        model_.truncate(static_cast<int32_t>(best), seq_);
        return;
    }
    offset_ = 0;
    model_.adopt_prefix(seq_, prompt, prompt.size());
}

int32_t ModelDrafter::draft(const std::vector<int32_t>& history, int32_t max_n, Rng& rng,
                            std::vector<int32_t>& tokens, std::vector<Distribution>& q, DraftStopRule* stop) {
    std::vector<ModelDraftJob> one{{this, &history, max_n, &rng, &tokens, &q, stop}};
    draft_together(one);
    return static_cast<int32_t>(tokens.size());
}

bool ModelDrafter::next(ModelDraftJob& job, int32_t row, int32_t i) {
    const int32_t n_vocab = model_.n_vocab();
    const bool greedy = sampling_.greedy();
    DraftStopRule* stop = job.stop;
    Distribution& qi = (*job.q)[static_cast<size_t>(i)];
    // q as the target's row p is computed (core/row.h): the grammar's mask (the
    // target's anyway), then the penalties over history and this draft's tokens so far.
    static const std::vector<int32_t> no_window;
    const RowMask mask = job.grammar ? RowMask{job.grammar->mask(i), job.grammar->n_vocab()} : RowMask{};
    const bool penalized = job.penalties && job.penalties->active();
    const std::vector<int32_t>& window =
        penalized ? row_.window(*job.penalties, job.n_prompt, *job.history, job.tokens->data(), job.tokens->size())
                  : no_window;
    const float* logits = row_.adjusted(model_.logits(row), n_vocab, mask, job.penalties, window);
    try {
        row_.distribution(logits, n_vocab, sampling_, qi);
    } catch (const std::invalid_argument& e) {
        throw DecodeError(std::string("the draft model produced invalid logits: ") + e.what());
    }
    // The stop rules' view (drafter.h): q itself, or for a greedy draft (q one-hot)
    // its T = 1 distribution, with the token it will propose known in advance.
    const Distribution* belief = &qi;
    if (stop && greedy) {
        row_.distribution(logits, n_vocab, belief_sampling_, belief_);
        belief = &belief_;
    }
    if (stop && stop->stop_before(i, *belief, greedy ? qi.argmax() : -1)) return false;
    const int32_t tok = greedy ? qi.argmax() : qi.sample(job.rng->uniform());
    job.tokens->push_back(tok);
    const bool ends = stop && stop->stop_after(i, *belief, tok);
    if (ends && stop->discards_test_only()) {
        job.tokens->pop_back();
        return false;
    }
    if (job.grammar) job.grammar->push(tok);
    return !ends && i + 1 < job.max_n;
}

int32_t draft_together(std::vector<ModelDraftJob>& jobs) {
    if (jobs.empty()) return 0;
    Model& m = jobs.front().drafter->model_;
    std::vector<ModelDraftJob*> open;
    for (ModelDraftJob& job : jobs) {
        if (&job.drafter->model_ != &m) throw std::invalid_argument("draft_together: jobs of different models");
        job.tokens->clear();
        job.windowed = false;
        if (job.max_n > 0 && !job.history->empty()) open.push_back(&job);
    }
    if (open.empty()) return 0;
    const auto held = m.lock();
    int32_t decodes = 0;
    // Sync each cache with its committed sequence: drop a rejected tail, then
    // feed what is missing (usually one or two tokens; at most a window),
    // logits for the last one, all in the first decode. A long lag (a new
    // prompt, a hybrid that drafted by lookup for a while) is caught up on its
    // own first, to keep that decode small. Positions count from the offset.
    std::vector<Model::Row> rows;
    size_t total = 0;
    std::vector<size_t> keep;
    std::vector<ModelDraftJob*> syncing;
    for (ModelDraftJob* job : open) {
        ModelDrafter& d = *job->drafter;
        const size_t size = job->history->size();
        size_t k = d.kept(*job->history, job->windowed);
        if (d.offset_ + k == size) --k;  // need logits for the last token
        m.truncate(static_cast<int32_t>(k), d.seq_);
        // Never write past the draft's context: position of the last fed token < n_ctx.
        job->max_n = std::min<int32_t>(job->max_n, m.n_ctx() - static_cast<int32_t>(size - d.offset_));
        if (job->max_n <= 0) continue;
        keep.push_back(k);
        syncing.push_back(job);
        total += size - d.offset_ - k;
    }
    open.swap(syncing);
    if (open.empty()) return decodes;
    for (size_t j = 0; j < open.size(); ++j) {
        const int32_t* h = open[j]->history->data() + open[j]->drafter->offset_;
        const size_t size = open[j]->history->size() - open[j]->drafter->offset_;
        const int32_t seq = open[j]->drafter->seq_;
        if (total > static_cast<size_t>(m.n_batch()) && size - keep[j] > 1) {
            m.decode(h + keep[j], static_cast<int32_t>(size - 1 - keep[j]), static_cast<int32_t>(keep[j]), 0, seq);
            keep[j] = size - 1;
            ++decodes;
        }
        for (size_t p = keep[j]; p < size; ++p) rows.push_back({seq, static_cast<int32_t>(p), h[p], p + 1 == size});
    }
    m.decode_rows(rows.data(), static_cast<int32_t>(rows.size()));
    ++decodes;
    // One draft position per decode: each open job draws its token; those that
    // go on feed it back together.
    for (int32_t i = 0; !open.empty(); ++i) {
        std::vector<ModelDraftJob*> still;
        rows.clear();
        for (size_t j = 0; j < open.size(); ++j) {
            ModelDraftJob& job = *open[j];
            // Each open job has one logits row, in job order, in every decode.
            if (job.drafter->next(job, static_cast<int32_t>(j), i)) {
                const int32_t seq = job.drafter->seq_;
                rows.push_back({seq, static_cast<int32_t>(m.cached(seq).size()), job.tokens->back(), true});
                still.push_back(&job);
            }
        }
        open.swap(still);
        if (open.empty()) break;
        m.decode_rows(rows.data(), static_cast<int32_t>(rows.size()));
        ++decodes;
    }
    return decodes;
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
