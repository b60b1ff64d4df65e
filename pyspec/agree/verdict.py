"""Is a quantised model healthy? Its mean KL divergence from the reference,
held against what its quantisation type costs in published measurements.

Published means (KL(F16 || quant), nats, llama-perplexity --kl-divergence on
wikitext-2, 512-token chunks) for LLaMA-3-8B, from llama.cpp's perplexity README
(tools/perplexity/README.md, the table added in ggml-org/llama.cpp#6936):
Q8_0 0.00136, Q6_K 0.00545, Q5_K_M 0.0108, Q4_K_M 0.0313, Q3_K_M 0.102,
Q2_K 0.445. Tails run about 10x the mean at p99 and 30-35x at p99.9
(ggml-org/llama.cpp#12557); small models lose more to the same type (a 0.8B
model's Q4_K_M measured 0.036, about LLaMA-3-8B's) and short, varied texts
scatter more than wikitext.

Bands, on the candidate's mean KL:
  healthy     <= HEALTHY x the published mean (x SMALL more under 2B parameters),
              and <= 1 nat;
  broken      >= BROKEN x the published mean or >= 1 nat (3 for the 1- and 2-bit
              types), yet never below twice the healthy edge; or top-1 agreement
              below half, or any non-finite logits: no quantisation error does that;
  suspicious  in between: a worse quant than its type promises (a bad imatrix, an
              unlucky tensor mix) or a damaged file worth a second look.
The reference may itself be quantised (a requantisation is compared with its
source): the bands then bound the error added, which is what the candidate's
type promises. A candidate that is not a quantisation of the reference (another
parameter count) gets no health verdict: the numbers then say how well it drafts.

Same type. The bands above measure a quantisation against its source. Two files
of the same type (the same llama_ftype, declared by both: a type llama.cpp had
to guess, LLAMA_FTYPE_GUESSED, names only the commonest tensor type, not the
tensor mix, so such a pair keeps the bands above) and exactly the same parameter
count are instead expected to hold the same weights, a copy or a re-download,
and to agree almost exactly (measured on the test model, gemma-3-270m Q4_K_M,
over the built-in texts):
  healthy     mean KL <= SAME_TYPE_FLOOR (1e-4 nats), the floor of numerical
              noise. Both models run the same kernels over the same chunks
              (cpp/tools/agreement.h), so the same weights give bit-identical
              logits: the test model against itself, or against its re-write by
              `pyspec quantize --type Q4_K_M` (the same tensor bytes), measures
              a mean KL of exactly 0. The floor leaves room for a backend whose
              reductions are not bit-reproducible and stays more than 10x under
              the least any change measured here costs: a Q8_0 requantisation
              0.0070 (LLaMA-3-8B's Q8_0: 0.00136), the same weights computed
              another way 0.0066 (flash attention on vs off) and 0.0049 (a batch
              vs token by token), which is why `pyspec agree` loads both alike;
  broken      mean KL >= the type's healthy edge above: what a sound quantisation
              of the type may cost even against its source, and twice what two
              sound ones from the same source typically differ by (each about
              HEALTHY times less, their errors adding). Or top-1 agreement below
              half, or non-finite logits. A copy of the test model with one FFN
              weight tensor zeroed measures 0.28 (layer 8) to 0.44 (layer 17;
              layer 0: 1.2) against Q4_K_M's edge of 0.25; the bands above
              called the first two suspicious;
  suspicious  in between: not the same weights. A damaged file, or the same type
              quantised from another source or with another imatrix, which may
              legitimately differ by up to about that much: this check does not
              cover that case (judge each against its source).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

#: llama_ftype -> name (llama.h's LLAMA_FTYPE_MOSTLY_*; only what GGUF files commonly declare).
FILE_TYPES: Dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
}
_GUESSED = 1024  # LLAMA_FTYPE_GUESSED: the file did not say; llama.cpp guessed

#: Published mean KL (nats) of LLaMA-3-8B per type (module docstring); types not
#: measured there borrow the nearest measured one of the same size class.
PUBLISHED_KL: Dict[str, float] = {
    "F32": 0.0005, "F16": 0.0005, "BF16": 0.0005,  # the logit-storage floor of the measurement
    "Q8_0": 0.00136, "Q6_K": 0.00545, "Q5_K_M": 0.0108, "Q5_K_S": 0.0108, "Q5_0": 0.0123, "Q5_1": 0.0108,
    "Q4_K_M": 0.0313, "Q4_K_S": 0.0313, "Q4_0": 0.0313, "Q4_1": 0.0313, "IQ4_XS": 0.0363, "IQ4_NL": 0.0363,
    "Q3_K_L": 0.102, "Q3_K_M": 0.102, "Q3_K_S": 0.102, "IQ3_M": 0.1025, "IQ3_S": 0.1025, "IQ3_XS": 0.184,
    "IQ3_XXS": 0.184, "Q2_K": 0.445, "Q2_K_S": 0.445, "IQ2_M": 0.326, "IQ2_S": 0.326, "IQ2_XS": 0.812,
    "IQ2_XXS": 0.812, "IQ1_M": 1.39, "IQ1_S": 2.2,
}
HEALTHY = 4.0      # x the published mean: text and model scatter
SMALL = 2.0        # more for models under SMALL_PARAMS parameters
SMALL_PARAMS = 2_000_000_000
HEALTHY_NATS = 1.0  # no type is healthy beyond this, whatever its published mean
BROKEN = 40.0      # x the published mean
BROKEN_NATS = 1.0  # a mean KL no sound quantisation of a 2-bit or better type reaches...
BROKEN_NATS_LOW_BIT = 3.0  # ...except the 1- and 2-bit types, whose published means approach it
MIN_TOP1 = 0.5
SAME_TYPE_FLOOR = 1e-4  # nats: a same-type pair agreeing this well is the same weights (module docstring)


def type_name(file_type: int) -> str:
    return FILE_TYPES.get(file_type & ~_GUESSED, f"ftype {file_type & ~_GUESSED}")


def same_type(cand_type: Optional[int], ref_type: Optional[int], cand_params: int, ref_params: int) -> bool:
    """Both files declare the same llama_ftype (neither guessed) and hold exactly
    as many parameters: expected to be the same weights (module docstring)."""
    return (cand_type is not None and ref_type is not None and not (cand_type | ref_type) & _GUESSED
            and cand_type == ref_type and bool(ref_params) and cand_params == ref_params)


@dataclass
class Verdict:
    verdict: str       # "healthy", "suspicious", "broken", or "not-a-quantization"
    reason: str
    type: str          # the candidate's quantisation type
    healthy_below: Optional[float] = None  # the band edges applied (mean KL, nats)
    broken_above: Optional[float] = None
    same_type: bool = False  # judged as a same-type pair (SAME_TYPE_FLOOR), not by the type's bands


def judge(*, kl_mean: float, top1: float, nonfinite: int, cand_type: int, cand_params: int,
          ref_params: int, ref_type: Optional[int] = None) -> Verdict:
    """The verdict for a candidate of type ``cand_type`` (llama_ftype) against its
    reference (of type ``ref_type``; None: unknown, never a same-type pair)."""
    name = type_name(cand_type)
    if ref_params and abs(cand_params - ref_params) > 0.02 * ref_params:
        return Verdict("not-a-quantization", f"the candidate has {cand_params / 1e6:.0f}M parameters and the "
                       f"reference {ref_params / 1e6:.0f}M: another model, not a quantisation of it (see the "
                       "speculation view for how well it drafts)", name)
    borrowed = name not in PUBLISHED_KL  # judged by the loosest band, and said so
    published = PUBLISHED_KL.get(name, PUBLISHED_KL["Q2_K"])
    healthy = min(HEALTHY * published * (SMALL if cand_params < SMALL_PARAMS else 1.0), HEALTHY_NATS)
    if same_type(cand_type, ref_type, cand_params, ref_params):
        return _judge_same_type(kl_mean, top1, nonfinite, name, healthy)
    low_bit = borrowed or name.startswith(("Q2", "IQ2", "IQ1"))
    broken = min(BROKEN * published, BROKEN_NATS_LOW_BIT if low_bit else BROKEN_NATS)
    broken = max(broken, 2 * healthy)
    edges = dict(type=name, healthy_below=healthy, broken_above=broken)
    if borrowed:
        name = f"{name} (no published band: Q2_K's applied)"
    if nonfinite:
        return Verdict("broken", f"the candidate's logits were NaN or infinite at {nonfinite} positions", **edges)
    if kl_mean >= broken:
        return Verdict("broken", f"mean KL {kl_mean:.4g} nats >= {broken:.3g}: far beyond any sound {name} "
                                 f"(published mean for {name}: {published:.3g})", **edges)
    if top1 < MIN_TOP1:
        return Verdict("broken", f"the candidate's top token agrees with the reference's at only {top1:.0%} of "
                                 "positions", **edges)
    if kl_mean > healthy:
        return Verdict("suspicious", f"mean KL {kl_mean:.4g} nats > {healthy:.3g}, more than a sound {name} "
                                     f"loses (published mean: {published:.3g})", **edges)
    return Verdict("healthy", f"mean KL {kl_mean:.4g} nats <= {healthy:.3g}, within what {name} costs "
                              f"(published mean: {published:.3g})", **edges)


def _judge_same_type(kl_mean: float, top1: float, nonfinite: int, name: str, type_healthy: float) -> Verdict:
    """A candidate of the reference's own type and parameter count: healthy at the
    floor of numerical noise, broken from what a sound ``name`` may cost against
    its source (``type_healthy``, never below twice the floor)."""
    broken = max(type_healthy, 2 * SAME_TYPE_FLOOR)
    edges = dict(type=name, healthy_below=SAME_TYPE_FLOOR, broken_above=broken, same_type=True)
    same = f"same type ({name}) and parameter count as the reference, so it should agree almost exactly"
    if nonfinite:
        return Verdict("broken", f"{same}, yet its logits were NaN or infinite at {nonfinite} positions", **edges)
    if kl_mean <= SAME_TYPE_FLOOR:
        return Verdict("healthy", f"{same}: mean KL {kl_mean:.3g} nats <= {SAME_TYPE_FLOOR:g}, the floor of "
                                  "numerical noise (the same weights)", **edges)
    if kl_mean >= broken:
        return Verdict("broken", f"{same}; mean KL {kl_mean:.4g} nats is far above the floor ({SAME_TYPE_FLOOR:g}), "
                                 f">= {broken:.3g}, more than a sound {name} costs even against its source: a "
                                 "damaged file, or not the same model", **edges)
    if top1 < MIN_TOP1:
        return Verdict("broken", f"{same}; its top token agrees with the reference's at only {top1:.0%} of "
                                 "positions", **edges)
    return Verdict("suspicious", f"{same}; mean KL {kl_mean:.4g} nats is above the floor ({SAME_TYPE_FLOOR:g}): "
                                 f"not the same weights. A damaged file, or a {name} from another source or "
                                 f"imatrix, which may differ this much (< {broken:.3g}): that case is not covered "
                                 "here, judge each against its source", **edges)
