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


def type_name(file_type: int) -> str:
    return FILE_TYPES.get(file_type & ~_GUESSED, f"ftype {file_type & ~_GUESSED}")


@dataclass
class Verdict:
    verdict: str       # "healthy", "suspicious", "broken", or "not-a-quantization"
    reason: str
    type: str          # the candidate's quantisation type
    healthy_below: Optional[float] = None  # the band edges applied (mean KL, nats)
    broken_above: Optional[float] = None


def judge(*, kl_mean: float, top1: float, nonfinite: int, cand_type: int, cand_params: int,
          ref_params: int) -> Verdict:
    """The verdict for a candidate of type ``cand_type`` (llama_ftype) against its reference."""
    name = type_name(cand_type)
    if ref_params and abs(cand_params - ref_params) > 0.02 * ref_params:
        return Verdict("not-a-quantization", f"the candidate has {cand_params / 1e6:.0f}M parameters and the "
                       f"reference {ref_params / 1e6:.0f}M: another model, not a quantisation of it (see the "
                       "speculation view for how well it drafts)", name)
    borrowed = name not in PUBLISHED_KL  # judged by the loosest band, and said so
    published = PUBLISHED_KL.get(name, PUBLISHED_KL["Q2_K"])
    healthy = min(HEALTHY * published * (SMALL if cand_params < SMALL_PARAMS else 1.0), HEALTHY_NATS)
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
