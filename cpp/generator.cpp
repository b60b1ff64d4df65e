#include "generator.h"

#include <chrono>
#include <stdexcept>

#include "errors.h"
#include "text_stream.h"

namespace pyspec {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Generator::Generator(Model& target) : target_(target) {}

GenerateResult Generator::generate(const std::vector<int32_t>& prompt, const GenerateParams& params,
                                   const TokenCallback& on_token) {
    params.sampling.validate();
    if (params.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
    if (prompt.empty()) throw std::invalid_argument("the prompt is empty (no tokens)");
    const int32_t n_prompt = static_cast<int32_t>(prompt.size());
    if (n_prompt >= target_.n_ctx()) {
        throw ContextOverflowError("prompt has " + std::to_string(n_prompt) +
                                   " tokens but the context holds " + std::to_string(target_.n_ctx()) +
                                   " (raise n_ctx or shorten the prompt)");
    }

    GenerateResult result;
    GenerationStats& st = result.stats;
    st.n_prompt_tokens = n_prompt;
    Rng rng(params.seed);
    TextStream stream(params.stop);
    const int32_t n_vocab = target_.n_vocab();

    const auto t_start = Clock::now();
    target_.truncate(0);
    target_.decode(prompt.data(), n_prompt, 0, 1);
    st.prompt_s = seconds_since(t_start);

    Clock::time_point t_first{};
    int32_t n_past = n_prompt;
    result.stop_reason = "max_tokens";
    while (static_cast<int32_t>(result.tokens.size()) < params.max_tokens) {
        const auto t_host = Clock::now();
        const float* logits = target_.logits(0);
        try {
            compute_distribution(logits, n_vocab, params.sampling, dist_, ws_);
        } catch (const std::invalid_argument& e) {
            throw DecodeError(std::string("the model produced invalid logits: ") + e.what());
        }
        const int32_t token = params.sampling.greedy() ? dist_.argmax() : dist_.sample(rng.uniform());
        if (result.tokens.empty()) {
            t_first = Clock::now();
            st.ttft_s = std::chrono::duration<double>(t_first - t_start).count();
        }
        result.tokens.push_back(token);
        if (target_.is_eog(token)) {
            result.stop_reason = "eog";
            break;
        }
        const std::string delta = stream.push(target_.token_to_piece(token));
        const bool keep_going = !on_token || on_token(token, delta);
        st.overhead_s += seconds_since(t_host);
        if (stream.stopped()) {
            result.stop_reason = "stop";
            break;
        }
        if (!keep_going) {
            result.stop_reason = "cancelled";
            break;
        }
        if (static_cast<int32_t>(result.tokens.size()) >= params.max_tokens) break;
        if (n_past >= target_.n_ctx()) {
            result.stop_reason = "context";
            break;
        }
        target_.decode(&token, 1, n_past, 1);
        ++n_past;
    }
    const std::string tail = stream.finish();
    if (!tail.empty() && on_token) on_token(-1, tail);

    result.text = stream.text();
    st.n_generated = static_cast<int32_t>(result.tokens.size());
    if (st.n_generated > 0) {
        st.decode_s = seconds_since(t_first);
        if (st.n_generated > 1 && st.decode_s > 0) st.decode_tok_s = (st.n_generated - 1) / st.decode_s;
    }
    return result;
}

}  // namespace pyspec
