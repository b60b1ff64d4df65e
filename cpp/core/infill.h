// The infill step: llama.cpp's `infill` sampler, which editor plugins (llama.vim,
// llama.vscode) put in their chains ("samplers": ["top_k", "top_p", "infill"]), as a
// rule on the candidates that top-k, top-p and min-p left (sampling.h, step 5b).
// It decides whether a suggestion goes on and with which tokens: without it an
// editor's suggestions, sampled at temperature 1 from 40 candidates, are often
// not what llama-server's, near-greedy, would be.
//
// On the candidates' T = 1 probabilities p (renormalised over them, n of them):
//   a. End: if 3 * P(end-of-generation tokens) * n > P(text tokens), only the
//      end-of-generation candidates are kept (the suggestion stops).
//   b. Merge: candidates in order (p descending, id ascending); for each token i0 and
//      each other token i1 still in, when i0's bytes are a non-empty prefix of i1's,
//      the less likely of the two (i1 on ties) gives its mass to the other and leaves;
//      once i0 has left, the next i0. ("ret" and "return" count as one choice.)
//   c. Text tokens whose (merged) mass is below 0.2 leave; end-of-generation tokens
//      stay. If no text token is left, the answer ends: InfillVocab::end alone. Where
//      the row forbids that token (a constraint's mask: healing, a grammar), the
//      step leaves the row's candidates as they came instead.
//   d. The masses of those kept are renormalised; text tokens below 1 / (n_text + 1)
//      leave.
// n counts the candidates with a finite logit (llama.cpp's top-k also keeps -inf
// entries when a row has fewer than k finite ones: only masked rows do).
// The survivors keep their own logits: temperature and the final softmax (step 6)
// act on them as on any truncation. So merged mass decides who stays, not how
// likely each is, as in llama.cpp, whose final draw recomputes a softmax over the
// logits. A truncation is a function of the row's logits, so drafting under it
// stays lossless: p and q are both computed after it (row.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pyspec {

// What the infill step needs of a vocabulary (a Model builds it once: Model::infill_vocab).
struct InfillVocab {
    std::vector<std::string> pieces;  // each token's bytes, control tokens ""
    std::vector<uint8_t> eog;         // 1: an end-of-generation token
    int32_t end = -1;                 // the answer's end when nothing is likely enough (EOT, else EOS)
};

// Most candidates the step takes (top_k's bound when infill is on): step b
// compares every pair.
constexpr int32_t kInfillMaxCandidates = 256;

struct InfillCandidate {
    float logit;
    int32_t id;
};

// Steps a-d on `cand` (sorted or not, ids < vocab.pieces.size(), logits finite).
// Returns the survivors in `cand`, or an empty `cand` when the answer ends with
// vocab.end alone (step c; only if `end_allowed`). `mass` is scratch.
void infill_truncate(std::vector<InfillCandidate>& cand, const InfillVocab& vocab, std::vector<double>& mass,
                     bool end_allowed);

}  // namespace pyspec
