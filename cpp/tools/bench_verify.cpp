#include "tools/bench_verify.h"

#include <chrono>
#include <vector>

#include "core/rng.h"

namespace pyspec {

VerifyBench bench_verify(const float* lp, const float* lq, int32_t n, int32_t n_vocab, const SamplingParams& params,
                         double seconds, uint64_t seed) {
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    SamplingWorkspace ws;
    std::vector<Distribution> pd(static_cast<size_t>(n + 1)), qd(static_cast<size_t>(n));
    std::vector<int32_t> draft(static_cast<size_t>(n));
    Rng rng(seed);
    auto compute_all = [&] {
        for (int32_t i = 0; i <= n; ++i) {
            compute_distribution(lp + static_cast<size_t>(i) * n_vocab, n_vocab, params, pd[static_cast<size_t>(i)], ws);
        }
        for (int32_t i = 0; i < n; ++i) {
            compute_distribution(lq + static_cast<size_t>(i) * n_vocab, n_vocab, params, qd[static_cast<size_t>(i)], ws);
        }
    };
    auto one_round = [&] {
        for (int32_t i = 0; i < n; ++i) draft[static_cast<size_t>(i)] = qd[static_cast<size_t>(i)].sample(rng.uniform());
        return accept_drafts(pd.data(), qd.data(), draft.data(), n, rng).n_accepted;
    };
    VerifyBench b;
    int64_t accepted = 0;
    compute_all();
    auto t0 = Clock::now();
    do {
        for (int k = 0; k < 64; ++k, ++b.verify_only_rounds) accepted += one_round();
        b.verify_only_seconds = since(t0);
    } while (b.verify_only_seconds < seconds / 2);
    t0 = Clock::now();
    do {
        compute_all();
        accepted += one_round();
        ++b.full_rounds;
        b.full_seconds = since(t0);
    } while (b.full_seconds < seconds / 2);
    b.mean_accepted = static_cast<double>(accepted) / static_cast<double>(b.verify_only_rounds + b.full_rounds);
    return b;
}

}  // namespace pyspec
