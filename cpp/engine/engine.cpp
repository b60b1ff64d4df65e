// Engine: one generation, or a batch of them run to the end, as a BatchSession.
#include "engine/engine.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pyspec {

const std::vector<std::string>& grammar_control_names() {
    static const std::vector<std::string> names{"off", "unmasked", "stale"};
    return names;
}

GrammarControl parse_grammar_control(const std::string& name) {
    const std::vector<std::string>& names = grammar_control_names();
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == name) return static_cast<GrammarControl>(i);
    }
    throw std::invalid_argument("unknown grammar control '" + name + "' (off, unmasked, stale)");
}

const std::vector<std::string>& penalty_control_names() {
    static const std::vector<std::string> names{"off", "stale", "last_draft"};
    return names;
}

PenaltyControl parse_penalty_control(const std::string& name) {
    const std::vector<std::string>& names = penalty_control_names();
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i] == name) return static_cast<PenaltyControl>(i);
    }
    throw std::invalid_argument("unknown penalty control '" + name + "' (off, stale, last_draft)");
}

uint64_t sequence_seed(uint64_t seed, int32_t j) {
    if (j == 0) return seed;
    // splitmix64 of (seed, j): streams of different j are unrelated, and a
    // sequence's stream does not depend on how many others share its batch.
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(j + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

Engine::Engine(Model& target, Drafter* drafter) : target_(target), drafter_(drafter) {
    if (drafter_ && drafter_->model() == &target_) {
        throw std::invalid_argument("the draft model must be a separate Model from the target (its own context)");
    }
}

GenerateResult Engine::generate(const std::vector<int32_t>& prompt, const SequenceParams& params,
                                const SessionParams& session, const TokenCallback& on_token, LengthPolicy* policy) {
    BatchTokenCallback cb;
    if (on_token) cb = [&](int32_t, int32_t token, const std::string& text, bool drafted) {
        return on_token(token, text, drafted);
    };
    std::vector<GenerateResult> out = generate_batch({SequenceSpec{prompt, drafter_, policy, params, 0}}, session, cb);
    return std::move(out[0]);
}

std::vector<GenerateResult> Engine::generate_batch(const std::vector<SequenceSpec>& specs,
                                                   const SessionParams& params, const BatchTokenCallback& on_token,
                                                   BatchStats* batch_stats) {
    if (specs.empty()) throw std::invalid_argument("no sequences to generate");
    const int32_t n_seq = static_cast<int32_t>(specs.size());
    if (n_seq > std::min(target_.n_seq(), target_.n_batch())) {
        throw std::invalid_argument(std::to_string(n_seq) + " sequences, but the target's context holds " +
                                    std::to_string(target_.n_seq()) + " and one batch " +
                                    std::to_string(target_.n_batch()) + " rows (load it with n_seq_max >= " +
                                    std::to_string(n_seq) + ")");
    }
    std::vector<Model*> draft_models;
    for (const SequenceSpec& spec : specs) {
        const Drafter* d = spec.policy ? spec.drafter : nullptr;  // only drafting sequences use theirs
        if (d && d->model()) draft_models.push_back(d->model());
    }
    BatchSession session(*this, params, on_token, draft_models);
    for (int32_t j = 0; j < n_seq; ++j) {
        SequenceSpec spec = specs[static_cast<size_t>(j)];
        spec.stream = j;
        session.add(spec);
    }
    // One call uses only its own sequences: the rest give their cells back.
    session.release_cache();
    while (session.step()) {
    }
    std::vector<GenerateResult> out(specs.size());
    for (auto& [handle, result] : session.take_finished()) out[static_cast<size_t>(handle)] = std::move(result);
    if (batch_stats) *batch_stats = session.stats();
    return out;
}

}  // namespace pyspec
