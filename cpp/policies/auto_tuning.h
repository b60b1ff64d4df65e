// The auto policy's tunables (auto_policy.h states the model they belong to),
// in one place for its three files: lengths, costs and the clock.
#pragma once

#include <cstdint>

namespace pyspec {
namespace auto_tuning {

inline constexpr double kAlphaRate = 0.15;   // weight of the newest observation in alpha and the belief table
inline constexpr double kCostRate = 0.1;     // ... in the cost estimates
inline constexpr double kOptimistic = 0.9;   // acceptance per position a probe must be able to pay at
inline constexpr double kTieMargin = 1.0001;    // prefer the shorter draft on (near) ties
inline constexpr int32_t kFirstInterval = 8;
inline constexpr int32_t kFreshCap = 3;        // longest first draft of a newly found n-gram source
inline constexpr int32_t kShortCap = 16;       // longest draft of anything but a long copy
inline constexpr int32_t kLongCopy = 32;       // lookup evidence (tokens matched and followed) of a long copy
inline constexpr int32_t kMaxInterval = 256;
inline constexpr int32_t kCalibration[] = {1, 2, 4, 8, 16, 32, 64};
// V(n) before any size above 1 is measured: v1 * (1 + kPriorSlope * (n - 1)). A
// CPU's curve (16 rows ~ 8 steps here); a GPU's is far flatter (~2.4), so a first
// run drafts only what pays on either until rounds and calibration measure it.
inline constexpr double kPriorSlope = 0.5;
// The clock (auto_policy.h).
inline constexpr double kClockZ = 1.0;          // confidence of a suspension: mean + z * se < 0
inline constexpr double kClockVarFloor = 0.25;  // tokens^2: a few rounds never look certain
inline constexpr double kClockMinRounds = 3;
inline constexpr double kClockCarry = 0.5;      // weight of the last generation's evidence in a new one
inline constexpr int32_t kClockCarryRounds = 4; // longest suspension carried into a new generation
inline constexpr int32_t kExploreMin = 32;      // tokens left below which no paid exploration starts
// Catch-ups (auto_policy.h): a draft model's catch-up must pay back within this
// many tokens; a caught-up token costs this share of a draft step until measured
// (a prefill's per-token share of a single step: ~0.25 for both default models here).
inline constexpr int32_t kPaybackTokens = 128;
inline constexpr double kPrefillShare = 0.3;
inline constexpr int32_t kInStepLag = 2;        // a lag this short is part of the draft's own decode

// Running average: the first observation replaces the "unknown" (-1) start.
inline double ema(double old, double x, double rate) { return old < 0 ? x : (1 - rate) * old + rate * x; }

}  // namespace auto_tuning
}  // namespace pyspec
