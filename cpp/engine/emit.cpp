// Committing a sequence's round: streaming its tokens, the stop rule (EOG, a
// stop string, max_tokens, the callback's word), and finishing it.
#include <algorithm>
#include <string>

#include "engine/sequence.h"

namespace pyspec {

void BatchSession::emit(Sequence& s) {
    GenerateResult& r = s.result;
    const AcceptResult& vr = s.vr;
    for (int32_t i = 0; i <= vr.n_accepted && !s.done; ++i) {
        const bool drafted = i < vr.n_accepted;
        const int32_t token = drafted ? s.drafts[static_cast<size_t>(i)] : vr.next_token;
        if (s.params.logprobs >= 0) {
            // Row first_row + i scored the position of emitted token i (its logits
            // stay in place until the next decode).
            r.logprobs.push_back(token_logprobs(target_.logits(s.first_row + i), target_.n_vocab(), token,
                                                s.params.logprobs));
        }
        s.history.push_back(token);
        r.tokens.push_back(token);
        const auto now = Clock::now();
        if (r.tokens.size() == 1) {
            s.t_first = now;
            r.stats.ttft_s = std::chrono::duration<double>(s.t_first - s.t_start).count();
            if (!any_token_) first_token_ = now;
            any_token_ = true;
        }
        last_token_ = now;
        if (target_.is_eog(token)) {
            finish(s, "eog");
            break;
        }
        const std::string delta = s.stream.push(target_.token_to_piece(token));
        const bool keep_going = !on_token_ || on_token_(s.handle, token, delta, drafted);
        if (s.stream.stopped()) {
            finish(s, "stop");
        } else if (!keep_going) {
            s.callback_stopped = true;
            finish(s, "cancelled");
        } else if (s.generated() >= s.max_tokens) {
            finish(s, "max_tokens");
        }
    }
}

void BatchSession::finish(Sequence& s, const char* reason) {
    s.done = true;
    s.result.stop_reason = reason;
    // A stop inside a round leaves drafts past the last emitted token in the
    // cache; drop them so the cache holds exactly the committed sequence (all
    // of the prompt is then kept: a retry or a chat's next turn reuses it).
    target_.truncate(std::min(static_cast<int32_t>(s.history.size()) - 1,
                              static_cast<int32_t>(target_.cached(s.id).size())), s.id);
    const std::string tail = s.stream.finish();
    // A callback that asked to stop is not called again.
    if (!tail.empty() && on_token_ && !s.callback_stopped && s.result.stop_reason != "cancelled") {
        on_token_(s.handle, -1, tail, false);
    }
    s.result.text = s.stream.text();
    GenerationStats& st = s.stats();
    st.n_generated = s.generated();
    if (s.grammar) {
        st.masks = s.grammar->masks();
        st.mask_s = s.grammar->mask_s();
    }
    if (!s.started) {
        // Ended before its prompt was in (cancelled, superseded, no room): the rest
        // of the prompt was neither found cached nor decoded.
        st.prompt_s = since(s.t_start);
        const int32_t held = std::min(static_cast<int32_t>(target_.cached(s.id).size()),
                                      static_cast<int32_t>(s.history.size()));
        st.n_cached_tokens = std::max(0, held - s.prompt_decoded);
        st.n_prompt_decoded = s.prompt_decoded;
    }
    if (st.n_generated > 0) {
        st.decode_s = since(s.t_first);
        if (st.n_generated > 1 && st.decode_s > 0) st.decode_tok_s = (st.n_generated - 1) / st.decode_s;
        bs_.n_generated += st.n_generated;
        after_first_ += st.n_generated - 1;
    }
    slot_owner_[static_cast<size_t>(s.id)] = -1;
    slot_used_[static_cast<size_t>(s.id)] = ++tick_;
    finished_.emplace_back(s.handle, std::move(s.result));
}

void BatchSession::cancel_all() {
    // Every decode that was cut short restored its cache; keep what was committed.
    for (Sequence& s : seqs_) {
        if (!s.done) finish(s, "cancelled");
    }
}

}  // namespace pyspec
