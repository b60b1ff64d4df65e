// The cost-aware length policy ("auto"). Each round it picks the draft length k,
// 0 (a plain decoding step) included, that maximises expected tokens per second:
//
//   rate(0) = 1 / V(1)
//   rate(k) = E_b(k) / T_b(k),  E_b(k) = 1 + a + a^2 + ... + a^k   (a = alpha_b; expected_tokens())
//                               T_b(k) = k * c_b + V(k + 1)
//
//   b        where the draft comes from: the draft model, an n-gram match of
//            1, 2, 3, 4-7, 8-11 or >= 12 tokens (long matches, and long runs the
//            copy cursor has followed, are copied text), or a copy re-anchored
//            near where it diverged (ngram_drafter.h);
//   alpha_b  acceptance of a draft token given the earlier ones were accepted
//            (a lookup's lengths are chosen at its lower bound, alpha_b less one
//            standard error of the evidence behind it: Bucket::alpha_low)
//            (measured: about the same at every position of a bucket's drafts).
//            Text decides it, so this generation's own counts weigh most, and
//            its latest positions most of all:
//            alpha_b = (accepted_g + w * A_b) / (tried_g + w), w = 2, with A_b a
//            running average over all generations (from a prior) and accepted_g /
//            tried_g the draft positions verified in this generation, each
//            earlier one discounted by 0.85 per later one (a source that just
//            failed here loses credit within a few positions; credit learnt on
//            other text cannot outweigh what this text shows);
//   c_b      drafter seconds per drafted token (n-gram lookup: ~0), measured on
//            rounds where the drafter was in step (a catch-up after plain rounds
//            is a one-off, not a per-token cost), a draft that stopped before its
//            first token included (it ran the draft model once); the draft
//            model's is kept on disk per machine (pyspec/calibration.py);
//   batches  in a decode shared with other sequences (o rows of s others), the
//            round's cost is what the whole decode costs, and its yield the
//            others' tokens (counted as one each) plus this one's:
//            rate(k) = (s + E_b(k)) / (k * c_b + V(o + 1 + k)), rate(0) = (s + 1) / V(o + 1).
//            On a jagged CPU curve the draft then fills the decode up to the
//            next cheap size, where the rows are nearly free (V(16) ~ V(9));
//            alone (o = s = 0) this is the rule above;
//   jointly  when every sequence of a batch drafts by lookup (or from a draft
//            model that cannot pay), the session plans the round for all of
//            them at once (policy.h, plans_jointly): n sequences with one row
//            each and m more rows to allot; the j-th drafted token of sequence
//            i adds alpha_i^j expected tokens, so the m rows go to the m largest
//            of those (each sequence's in order), and the round rates
//            (n + their sum) / (V(n + m) + drafting cost), m = 0 or a measured size;
//   V(n)     target seconds to evaluate n tokens in one batch, V(n) = v1 * r(n):
//            v1 the current single-token step, r(n) a running ratio. Sizes 1, 2,
//            4, 8, 16, 32, 64 (up to the cap) are timed once per model and machine
//            (the Python layer keeps them on disk), never before the first answer:
//            a first run starts plainly (its first step measures v1), judges a
//            size not yet timed by an estimate (interpolated, or the prior slope
//            of auto_tuning.h), and the size is timed by the first round that
//            uses it or by the engine between rounds within a small share of the
//            time (engine/calibrate.cpp). Every round refines its own size, so a
//            slower machine or a longer context moves all sizes together. Other
//            sizes are candidates only once measured: CPU batch costs are jagged
//            (16 tokens can cost less than 15).
//
// During a draft-model proposal it re-plans at each position: the draft's belief
// in its own token, mapped to an acceptance probability by a learned table,
// replaces alpha for the tokens already drafted. Before token i is drawn it stops
// when drafting i tokens rates better than i + 1 or more (judged on the table
// averaged over q_i, or on the greedy token's belief, which q_i decides); after
// the draw it may end the draft with token i kept. It never discards a drawn
// token (drafter.h: that would bias the output at T > 0).
//
// Guesses: a source that knows its next token without drafting (n-gram lookup)
// is checked on every plain round against the token the target emitted, which is
// exactly what a 1-token draft would have shown, for free; such sources need no
// probes, so text that turns repetitive is noticed at once and text that does not
// costs nothing.
//
// Host work: a round also costs host time besides the target decode (the
// distributions of its rows over the vocabulary, verification, emitting text):
// H(n) = h_1 + h_row * (n - 1) for n rows, learnt from every round that ran
// alone (its wall time less drafting and decoding), so every cost above is
// V(n) + H(n), not V(n) alone.
//
// The clock has the last word. The model above is a prior that picks what to
// try; every round that ran alone is also judged by its wall time. A kind
// (source: draft model or lookup, x length class 1, 2-3, 4-7, 8+) keeps, for its rounds,
//   d = tokens emitted - round wall time / plain round wall time,
// the tokens it gained over plain decoding in the same time (plain rounds'
// wall time is a running average). When d's mean is below 0 with confidence
// (mean + z * se < 0, z = 1, at least 3 rounds, se from a variance floor of
// 0.25 tokens^2) the kind is suspended: the policy does not choose it, whatever
// the model predicts, for `backoff` rounds (8, doubling to 256 each time it is
// suspended again), and then re-probes it: its next round is judged again.
// A new generation carries half the evidence of the last one, and a kind still
// suspended then stays so for at most its first 4 rounds: what earlier text
// taught is a prior, and it cannot cost new text its gains for long.
// Suspending is a decision made before a draft is drawn: lossless.
//
// Long copies: drafts are at most 16 tokens, except from a lookup whose
// evidence (tokens matched and followed) is >= 32: text known to repeat, such
// as an answer copied from memory. Its alpha is then at least (r + 1) / (r + 2)
// for a run of r (the rule of succession), so drafts of 32-63 tokens are chosen
// where the measured V(32), V(64) make them pay (the default cap is 63).
//
// Exploration a short answer cannot pay back is not started: paid probes and
// the first draft that measures a drafter's cost need at least 32 tokens left
// to generate (set_remaining).
//
// Probes: while plain decoding wins for a source, a 1-token draft after every
// `interval` plain rounds refreshes alpha, so the policy leaves plain mode when
// the text changes character. The interval doubles (8 .. 256) after each failed
// probe; an accepted probe is followed by another at once, until drafting wins
// (the interval then resets) or a probe fails. Sources that
// could not pay even at 90 % acceptance per position with the measured costs are
// not probed: a draft model that cannot break even on this hardware is not kept
// in step (and its prompt is not processed) at the target's expense. That is
// judged in the batch the sequence runs in (set_batch): on a CPU a draft model
// that pays alone cannot pay beside 15 others, whose decode already costs ~7
// steps, so the draft model steps aside and lookups stay.
//
// Catch-ups: a draft model behind the text by `lag` tokens (a new prompt, which
// is never prefilled before the first token; plain or lookup rounds since it
// last drafted) first processes them, up to a window (model_drafter.h). It
// drafts only when what drafting could save over the next kPaybackTokens (at
// the acceptance expected of it) exceeds that catch-up, at
// the measured cost per caught-up token (prior: kPrefillShare of a draft step).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "policies/policy.h"

namespace pyspec {

// Its three models live in three files: auto_lengths.cpp (acceptance, the
// length of each round, joint allotment, re-planning within a draft),
// auto_costs.cpp (V(n), H(n), c_b, calibration, memory) and auto_clock.cpp.
class AutoPolicy : public LengthPolicy, public JointPlanner, public Calibrated {
public:
    explicit AutoPolicy(int32_t draft_max);

    // LengthPolicy.
    std::string name() const override { return "auto"; }
    int32_t draft_max() const override { return draft_max_; }
    void begin_generation() override;
    int32_t next_length(int32_t round_max, const DraftPlan& plan) override;
    bool stops_early() const override { return true; }
    bool stop_before(int32_t i, const Distribution& belief, int32_t known) override;
    bool stop_after(int32_t i, const Distribution& belief, int32_t token) override;
    void observe(const RoundReport& round) override;
    JointPlanner* as_planner() override { return this; }
    Calibrated* as_calibrated() override { return this; }

    // JointPlanner (policy.h).
    void set_batch(int32_t other_rows, int32_t other_seqs) override;
    void set_remaining(int32_t tokens) override { remaining_ = tokens; }
    // Whether drafting from `source` could pay at all (the probe condition
    // above; false while the draft model's cost is unknown: it is measured by a probe).
    bool may_draft(DraftSource source) const;
    // Whether the draft model's catch-up on `lag` tokens could pay back (above).
    bool catch_up_pays(int32_t lag) const;
    double catch_up_cost() const;  // seconds per caught-up token: measured, else the prior (-1: neither)
    bool plans_jointly(bool model) const override;
    LengthBid bid(int32_t round_max, const DraftPlan& plan) const override;
    std::vector<int32_t> allot_lengths(const std::vector<LengthBid>& bids, int32_t max_rows) const override;
    void allotted(const DraftPlan& plan, int32_t k) override;

    // Calibrated (policy.h): sizes 1, 2, 4, ... 64 up to max_batch not timed yet.
    std::vector<int32_t> calibration_sizes(int32_t max_batch) override;
    void calibrated(const std::vector<int32_t>& sizes, const std::vector<double>& seconds, bool fresh) override;
    // Timings first measured in this process (by the engine or by rounds) since
    // the last call: what is new to keep on disk.
    std::vector<std::pair<int32_t, double>> take_new_timings();

    // Introspection for tests and tools.
    double verify_cost(int32_t batch) const;    // V(n) in seconds, -1 if not measured
    double draft_cost(DraftSource source) const;  // c_b of the model / of n-gram lookups, -1 unknown
    // The draft model's c_b as an earlier process measured it (kept on disk per
    // model and machine): used until this process measures its own, so that a
    // draft model that cannot pay here is not prefilled or probed once per process.
    void recorded_draft_cost(double seconds);
    // A first run's estimate of the draft model's step, in target steps (its
    // cost is then this times V(1)), until one is measured or recorded: it only
    // decides whether measuring the draft model could pay. pyspec/calibration.py
    // gives the ratio of the file sizes where both models decode on this CPU
    // (a step reads every weight once).
    void draft_cost_prior(double steps);
    double acceptance(const DraftPlan& plan) const;  // alpha_b, this generation's blend
    int32_t probe_interval(const DraftPlan& plan) const;
    double host_cost(int32_t rows) const;  // H(n): host seconds of a round of n rows (0 until measured)
    double plain_round_cost() const { return plain_round_s_; }  // wall time of a plain round, -1 unknown
    // Whether the clock has suspended drafting k tokens from this plan's source (its kind).
    bool suspended(const DraftPlan& plan, int32_t k) const;
    // Kinds the clock suspended, and rounds where the model's choice was a suspended
    // kind and the policy chose otherwise: counters since construction.
    int64_t clock_suspensions() const { return suspensions_; }
    int64_t clock_vetoes() const { return vetoes_; }
    // Whether the clock judges (default). Off, choices follow the cost model alone,
    // so they no longer depend on how each round's wall time fell.
    bool clock() const { return clock_on_; }
    void set_clock(bool on) { clock_on_ = on; }
    // Whether round timings refine the costs: V(n), the drafters' c_b, the host's
    // H(n) (default). Off, they stay as calibrated, recorded or remembered, so
    // that with the clock off too the choices no longer depend on how any round's
    // time fell (acceptance is still learnt).
    bool learn_costs() const { return learn_costs_; }
    void set_learn_costs(bool on) { learn_costs_ = on; }
    // What it has learnt that outlives a process (pyspec/calibration.py keeps it on
    // disk per model and machine): the long-run acceptance of each lookup bucket
    // (1..7; the model's depends on the draft pair) and the host costs h_1, h_row.
    // remember() takes it only before this policy has seen a round of its own.
    std::vector<double> memory() const;
    void remember(const std::vector<double>& memory);
    int64_t rounds_seen() const { return rounds_seen_; }
    // The batch timings it has (size, seconds): given by calibrated(), or a round's.
    const std::vector<std::pair<int32_t, double>>& calibration() const { return calibration_; }

    static constexpr int32_t kMaxBatch = 512;  // largest batch whose cost it tracks
    static constexpr int32_t kBuckets = 8;     // model + 6 n-gram match-length buckets + re-anchored copies
    static constexpr int kModelBucket = 0;
    static constexpr int kNearCopyBucket = 7;
    static constexpr int32_t kConfBins = 6;
    static constexpr double kWeight = 2;     // pseudo-observations behind A_b in a new generation
    static constexpr double kRecency = 0.85; // per-position decay of this generation's counts
    static constexpr double kAlphaZ = 1.0;   // standard errors below the mean that lengths are chosen at
    static constexpr int kLengthClasses = 4;  // the clock's draft lengths: 1, 2-3, 4-7, 8+

private:
    struct Bucket {
        double long_run = 0;           // A_b: acceptance over all generations (running average)
        double accepted = 0;         // draft positions accepted in this generation
        double tried = 0;            // ... and verified
        double alpha() const { return (accepted + kWeight * long_run) / (tried + kWeight); }
        // What a length is chosen by: alpha less one standard error of its evidence
        // (tried + kWeight observations). Choosing by the mean trusts a lucky streak
        // (a 15-token draft after two 3-token hits, on math: -8 steps); a copy that
        // keeps being accepted soon earns the same long drafts.
        double alpha_low() const {
            const double a = alpha();
            return std::max(0.0, a - kAlphaZ * std::sqrt(a * (1 - a) / (tried + kWeight + 1)));
        }
        double cost = -1;            // seconds per drafted token; -1 = not measured
        int32_t plain_streak = 0;    // plain rounds since the last draft from this bucket
        int32_t interval = 8;        // plain rounds between probes
        bool probing = false;        // the last draft from this bucket was a probe
        bool probe_hit = false;      // ... and all of it was accepted
    };

    // Expected rates of the round being drafted, at position i with reach r_i:
    // without token i, with it as the last one, and with the rest of the plan.
    struct Options {
        double without, with, more;
    };
    Options options(int32_t i, double r_i) const;
    bool judging(int32_t i) const;
    // P(accept) of token i from the belief table: for `token` (>= 0), or averaged
    // over a draw from `belief` (token = -1).
    double believed_acceptance(const Distribution& belief, int32_t token) const;

    // One verified draft position (or a plain round's checked guess) of bucket b.
    static void learn(Bucket& b, double hit);
    static int bucket_of(const DraftPlan& plan);
    static int conf_bin(double c);
    int32_t longest_for(int32_t round_max, const DraftPlan& plan) const;  // draft_max, round_max, fresh/long caps
    static double lookup_alpha(const Bucket& b, const DraftPlan& plan);   // alpha_low, or a long copy's run
    double target_cost_estimate(int32_t batch) const;   // V(n), interpolated for unmeasured sizes
    // Whether a batch of n rows may be chosen: measured, or a calibration size
    // still to be timed (judged by its estimate meanwhile).
    bool candidate(int32_t n) const;
    double timed(int32_t n) const;  // n's entry of calibration_, -1 if none
    void record_timing(int32_t n, double seconds, bool fresh);
    void fill_ratios();  // r(n) of timings that arrived before v1
    double rate(const Bucket& b, double alpha, int32_t k) const;
    double round_cost(int32_t own_rows) const;  // V(o + own_rows): the shared decode with this many own rows
    bool could_pay(const Bucket& b) const;
    double cost_of(const Bucket& b) const;  // c_b: measured, else the draft model's prior (-1: neither)
    // A new round's plan (next_length or allotted): its bucket, no beliefs yet.
    Bucket& plan_round(const DraftPlan& plan);
    // The round drafts k tokens from b: its probe schedule starts over. Returns k.
    int32_t drafting_won(Bucket& b, int32_t k);

    // The clock's record of one kind (source x length class): its rounds' gains d.
    struct Clock {
        double n = 0, sum = 0, sum2 = 0;  // rounds (earlier generations' weighted down), sums of d, d^2
        int32_t until = 0;                // suspended while round_ < until
        int32_t backoff = 8;              // rounds of the next suspension
    };
    static int kind_of(int bucket, int32_t k);
    bool kind_suspended(int bucket, int32_t k) const;
    void judge(const RoundReport& r, int bucket);  // the clock's verdict on a round that ran alone
    void clock_new_generation();  // begin_generation's part: the clock's evidence becomes a prior
    void learn_target(const RoundReport& r, int32_t rows);  // V(n) from a round's target decode of n rows
    void learn_host(const RoundReport& r, int32_t rows);

    int32_t draft_max_;
    std::array<Bucket, kBuckets> buckets_;
    std::array<Clock, 2 * kLengthClasses> clock_;
    double plain_round_s_ = -1;       // wall time of a plain round that ran alone (running average)
    double host_1_ = -1, host_row_ = -1;  // H(n) = host_1 + host_row * (n - 1); -1 = not measured
    int32_t round_ = 0;               // rounds observed in this generation
    int32_t remaining_ = 1 << 30;     // tokens left to generate (set_remaining)
    int64_t suspensions_ = 0, vetoes_ = 0;
    int64_t rounds_seen_ = 0;
    bool clock_on_ = true;
    bool learn_costs_ = true;
    double v1_ = -1;                  // single-token step, seconds
    double draft_prior_ = -1;         // draft_cost_prior: the draft model's step in target steps
    double catch_up_s_ = -1;          // the draft model's seconds per caught-up token; -1 = not measured
    std::vector<double> ratio_;       // r(n) = V(n) / v1, index n; -1 = not measured
    int32_t grid_max_ = 0;            // largest batch calibration_sizes() was asked for
    std::vector<std::pair<int32_t, double>> calibration_;  // timed sizes, ascending
    std::vector<int32_t> fresh_;      // sizes of calibration_ new to this process (take_new_timings)
    std::array<double, kConfBins> conf_acc_;  // P(accept | belief bin), learned

    // The round being drafted.
    int32_t other_rows_ = 0, other_seqs_ = 0;  // set_batch(): who shares its decode
    int planned_bucket_ = -1;
    int32_t planned_k_ = 0;
    std::vector<double> beliefs_;        // belief in each kept draft token
    std::vector<double> reach_;       // P(tokens 0..i all accepted), belief-adjusted
};

}  // namespace pyspec
