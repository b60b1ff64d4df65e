// Step 2 of a round: the one target decode of every active sequence's draft
// rows (its last committed token and its drafts) and a chunk of waiting
// prompts, and what a full cache gives up to make it fit. With
// SessionParams::first_with_prompt, a prompt whose last chunk is in the decode
// starts there: its first token is read from the decode's row of its last
// token (a plain first round), so a new request's first token costs one
// decode, as in plain decoding, not the prompt's and then a round's; its draft
// model catches up after that token.
#include <algorithm>
#include <thread>

#include "core/errors.h"
#include "engine/sequence.h"

namespace pyspec {

void BatchSession::run_target(std::vector<Sequence*>& active) {
    const int32_t n_batch = target_.n_batch();
    while (true) {
        rows_.clear();
        joining_.clear();
        const int32_t draft_rows = add_draft_rows(active);
        int32_t budget = n_batch - draft_rows;
        if (!active.empty() && session_.prefill_chunk > 0) budget = std::min(budget, session_.prefill_chunk);
        add_prompt_rows(budget, draft_rows);  // (every draft row has logits)
        const int32_t n = static_cast<int32_t>(rows_.size());
        if (n == 0) return;
        try {
            target_.decode_rows(rows_.data(), n);
            bs_.prompt_rows += n - draft_rows - static_cast<int32_t>(joining_.size());  // joined: round 1's rows
            for (int32_t i = draft_rows; i < n; ++i) {
                const Model::Row& row = rows_[static_cast<size_t>(i)];
                if (row.logits) continue;  // a joined last token: its first round's, as it is for the others
                if (Sequence* s = find(slot_owner_[static_cast<size_t>(row.seq)])) ++s->prompt_decoded;
            }
            for (const auto& [s, logits_row] : joining_) {
                start(*s);
                begin_round(*s);  // plain: no drafts, its policy not asked (nor told: Sequence::joined)
                s->draft_s = 0;
                s->first_row = logits_row;
                s->joined = true;
                s->stats().first_with_prompt = 1;
                active.push_back(s);
            }
            return;
        } catch (const ContextOverflowError&) {
            // The unified cache is full. Free cells in order of what they cost to
            // lose: prefix caches of finished sequences (least recently used
            // first, into the host cache if any), then this round's drafts
            // and prompt rows, then the sequence holding the most cells ends
            // ("context"); its cells go back to the others.
            const int32_t victim = lru_cached_slot();
            if (victim >= 0) {
                drop_cache(victim);
                continue;
            }
            bool had_drafts = false;
            for (Sequence* s : active) {
                had_drafts |= !s->drafts.empty();
                s->drafts.clear();
            }
            if (had_drafts) continue;
            Sequence* biggest = nullptr;
            for (Sequence* s : active) {
                if (!biggest || s->history.size() > biggest->history.size()) biggest = s;
            }
            if (!biggest) {
                // Only prompt rows, and nothing else holds cells: a waiting prompt
                // cannot fit beside the others; it ends.
                for (Sequence& s : seqs_) {
                    if (!s.done && !s.started) {
                        finish(s, "context");
                        break;
                    }
                }
                if (n_waiting() == 0) return;
                continue;
            }
            finish(*biggest, "context");
            target_.truncate(0, biggest->id);
            active.erase(std::find(active.begin(), active.end(), biggest));
        }
    }
}

int32_t BatchSession::add_draft_rows(const std::vector<Sequence*>& active) {
    std::vector<Model::Row>& rows = rows_;
    int32_t n_logits = 0;
    for (Sequence* s : active) {
        // The cache holds the committed tokens but the last, which is (re)evaluated
        // with the drafts. (A longer uncommitted tail, which only a cache changed
        // behind the engine's back could leave, is caught up on its own first.)
        const size_t last = s->history.size() - 1;
        const size_t keep = std::min(common_prefix(target_.cached(s->id), s->history), last);
        if (keep < last) {
            target_.decode(s->history.data() + keep, static_cast<int32_t>(last - keep), static_cast<int32_t>(keep), 0,
                           s->id);
        }
        target_.truncate(static_cast<int32_t>(last), s->id);
        int32_t pos = static_cast<int32_t>(last);
        rows.push_back({s->id, pos++, s->history[last], true});
        for (int32_t t : s->drafts) rows.push_back({s->id, pos++, t, true});
        s->first_row = n_logits;
        n_logits += static_cast<int32_t>(s->drafts.size()) + 1;
    }
    return static_cast<int32_t>(rows.size());
}

void BatchSession::add_prompt_rows(int32_t budget, int32_t n_logits) {
    for (Sequence& s : seqs_) {
        if (budget <= 0) break;
        if (s.done || s.started || waits_for_prefix(s)) continue;
        const int32_t want = static_cast<int32_t>(s.history.size()) - 1;
        int32_t pos = static_cast<int32_t>(target_.cached(s.id).size());
        int32_t n = std::min(budget, want - pos);
        if (s.chunked && session_.prefill_chunk > 0) n = std::min(n, session_.prefill_chunk);
        for (int32_t i = 0; i < n; ++i, ++pos) {
            rows_.push_back({s.id, pos, s.history[static_cast<size_t>(pos)], false});
        }
        budget -= n;
        // The rest of the prompt is in: its last token joins with logits. Not for a
        // warm-up (max_tokens 0: nothing is sampled, the last token waits as it
        // always has) nor a prompt that fills the context (it generates nothing).
        const bool joins = session_.first_with_prompt && pos == want && want > 0 && budget > 0 &&
                           s.max_tokens > 0 && !s.cancel_requested && want + 1 < target_.n_ctx();
        if (joins) {
            const int32_t token = s.history[static_cast<size_t>(session_.test.stale_join ? want - 1 : want)];
            rows_.push_back({s.id, want, token, true});
            joining_.emplace_back(&s, n_logits++);
            --budget;
        }
    }
}

}  // namespace pyspec
