#include "core/infill.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/sampling_internal.h"

namespace pyspec {

namespace {

bool is_prefix(const std::string& a, const std::string& b) {
    return !a.empty() && a.size() <= b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

void infill_truncate(std::vector<InfillCandidate>& cand, const InfillVocab& vocab, std::vector<double>& mass,
                     bool end_allowed) {
    std::sort(cand.begin(), cand.end(), [](const InfillCandidate& a, const InfillCandidate& b) {
        return detail::better(a.logit, a.id, b.logit, b.id);
    });
    const size_t n = cand.size();
    const double mx = static_cast<double>(cand.front().logit);
    mass.resize(n);
    double z = 0.0;
    for (size_t i = 0; i < n; ++i) z += mass[i] = detail::rel(cand[i].logit, mx);
    auto eog = [&](size_t i) { return vocab.eog[static_cast<size_t>(cand[i].id)] != 0; };
    double p_eog = 0.0, p_txt = 0.0;
    for (size_t i = 0; i < n; ++i) {
        mass[i] /= z;
        (eog(i) ? p_eog : p_txt) += mass[i];
    }
    auto keep_if = [&](auto&& keep) {
        size_t kept = 0;
        for (size_t i = 0; i < cand.size(); ++i) {
            if (keep(i)) {
                cand[kept] = cand[i];
                mass[kept++] = mass[i];
            }
        }
        cand.resize(kept);
    };

    // a. End.
    if (3.0 * p_eog * static_cast<double>(n) > p_txt) {
        keep_if(eog);
        return;
    }
    // b. Merge (a token that left has mass 0 and is skipped as either side).
    for (size_t i0 = 0; i0 < n; ++i0) {
        for (size_t i1 = 0; i1 < n && mass[i0] > 0.0; ++i1) {
            if (i1 == i0 || mass[i1] <= 0.0) continue;
            if (!is_prefix(vocab.pieces[static_cast<size_t>(cand[i0].id)],
                           vocab.pieces[static_cast<size_t>(cand[i1].id)])) {
                continue;
            }
            const size_t dst = mass[i1] > mass[i0] ? i1 : i0, src = dst == i0 ? i1 : i0;
            mass[dst] += mass[src];
            mass[src] = 0.0;
        }
    }
    // c. Likely enough, else the end (if the row allows it; else the row as it came:
    //    the merge only moved masses, every candidate is still in `cand`).
    auto likely = [&](size_t i) { return eog(i) || mass[i] >= 0.2; };
    size_t n_text = 0;
    for (size_t i = 0; i < n; ++i) n_text += !eog(i) && likely(i);
    if (n_text == 0) {
        if (end_allowed) cand.clear();
        return;
    }
    keep_if(likely);
    double sum = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) sum += mass[i];
    // d. Against the number of choices left.
    const double floor = 1.0 / static_cast<double>(n_text + 1);
    keep_if([&](size_t i) { return eog(i) || mass[i] / sum >= floor; });
}

}  // namespace pyspec
