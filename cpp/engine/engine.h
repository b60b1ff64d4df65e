// The generation loop, plain and speculative alike, for one sequence or many:
// prefill, then rounds (BatchSession::step, round.cpp) of
//   1. draft:      each sequence's policy picks a length k (plan.cpp; k = 0: a plain
//                  step) and its drafter proposes up to k tokens,
//   2. run target: the target decode: every sequence's [last committed token, drafts]
//                  in ONE llama_decode (rows tagged with the sequence's id; decode.cpp),
//   3. accept:     per sequence, the accept test (core/accept.cpp) keeps a prefix of the
//                  drafts and draws the next token,
//   4. roll back:  per sequence, the target's KV cache drops the rejected tail,
//   5. emit:       the new tokens are committed and streamed (emit.cpp).
// A single generation is the batch of one: there is one loop. Runs without the
// GIL; Python sees it through a per-token callback. session.cpp admits and
// starts sequences; calibrate.cpp times batch sizes for the policies between rounds.
// In this code and its docs "target decode" is step 2 and "accept" step 3;
// "verify" survives only in public names kept for users (verify_s: seconds of
// target decodes; AutoPolicy.verify_cost: V(n); verify_many, bench_verify: the
// accept test's benchmark).
//
// Plain or speculative is per sequence: one with a length policy drafts (with
// its drafter, or the engine's), one without decodes plainly. The draft length
// is resolved once, in one direction (policy.h): the user's draft_max goes into
// the policy (make_policy), each round's bound round_max comes from the session
// (plan.cpp), and the policy picks k within both.
//
// Sequence j of a batch is sequence j of the target's context and draws from its
// own random stream, derived from (seed, j) (j = 0 uses the seed itself, so a
// batch of one is the single-sequence generation): its output does not depend on
// which other sequences share the batch, apart from the kernels' rounding.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "constraint/grammar.h"
#include "core/penalties.h"
#include "core/row.h"
#include "drafters/drafter.h"
#include "model/model.h"
#include "policies/policy.h"
#include "core/sampling.h"
#include "engine/host_cache.h"
#include "engine/stats.h"

namespace pyspec {

// TEST-ONLY: under a grammar, the target's rows masked wrongly (TestControls::grammar).
enum class GrammarControl {
    kOff,       // the product: row i under the state after drafts 0..i-1 (grammar.h)
    kUnmasked,  // the draft's q alone is masked
    kStale,     // every row under the mask of the round's start
};
// Its names as Python spells them ("off", "unmasked", "stale"), in the enum's
// order; parse_grammar_control throws std::invalid_argument for others.
const std::vector<std::string>& grammar_control_names();
GrammarControl parse_grammar_control(const std::string& name);

// TEST-ONLY: a verification row's penalty window built wrongly (TestControls::penalties,
// core/penalties.h). Row i's window holds the committed tokens and drafts 0..i-1.
enum class PenaltyControl {
    kOff,        // the product
    kStale,      // the committed tokens only: no draft counts
    kLastDraft,  // the committed tokens and draft i-1 alone (right for rows 0 and 1, wrong from row 2)
};
// Its names as Python spells them ("off", "stale", "last_draft"), as grammar_control_names.
const std::vector<std::string>& penalty_control_names();
PenaltyControl parse_penalty_control(const std::string& name);

// TEST-ONLY negative controls: each breaks losslessness on purpose, and the
// lossless tests must catch it. Never set in the product. A session's, so they
// hold for every sequence it runs (one value; pyspec/testing.py builds it).
//   variant        the accept test's rule (sampling.h, AcceptVariant);
//   discard_below  > 0: a model draft ends by DISCARDING a drawn token whose belief is
//                  below this, the biased rule drafter.h forbids;
//   shared_stream  every sequence draws from the one stream of its seed (correlated
//                  samples) instead of its own;
//   grammar        under a grammar, the target's rows masked wrongly (GrammarControl);
//                  its grammar then tolerates the tokens it refuses instead of failing;
//   penalties      the target's rows penalised with a wrong window (PenaltyControl).
// And one probe (no control: it changes nothing a sequence draws):
//   pit            record, for every token a round decides, its randomized PIT under
//                  the target row it was decided by (Distribution::pit), in
//                  stats.pit: uniform exactly when the output follows the rows the
//                  target computed, on any backend, bit-exact or not (its own random stream).
// And one pin (no control either: it changes what a policy believes, never a law):
//   timing_scale   > 0: a batch timed between rounds (calibrate.cpp) still decodes
//                  and is dropped, but reports this many times the session's fastest
//                  round instead of its clock, so that whether auto drafts next does
//                  not hang on a loaded machine's clock.
struct TestControls {
    AcceptVariant variant = AcceptVariant::kCorrect;
    double discard_below = 0;
    bool shared_stream = false;
    GrammarControl grammar = GrammarControl::kOff;
    bool pit = false;
    // WRONG: a verification row's penalty window leaves out drafts before the row
    // (PenaltyControl, core/penalties.h): the χ² tests must catch it.
    PenaltyControl penalties = PenaltyControl::kOff;
    double timing_scale = 0;
    // WRONG: a prompt's last row, decoded with its final chunk for the first token
    // (decode.cpp, add_prompt_rows), carries the token before the last: the χ²
    // test of that path must catch it.
    bool stale_join = false;
};

// What one sequence generates, and how it samples: a server's requests differ
// in each of these, so each sequence brings its own (SequenceSpec).
struct SequenceParams {
    int32_t max_tokens = 256;
    SamplingParams sampling;           // the target's settings: define the output distribution
    SamplingParams draft_sampling;     // the drafter's own settings (q); any choice stays lossless
    uint64_t seed = 0;
    std::vector<std::string> stop;
    // Log-probabilities recorded for each emitted token (GenerateResult::logprobs):
    // -1 none; k >= 0 the token's own and the k most likely alternatives. They are
    // the target's (token_logprobs in sampling.h), from the verification row that
    // decided the token: plain decoding at the same prefix reports the same.
    int32_t logprobs = -1;
    // The grammar the output must follow (constraint/grammar.h: the constrained
    // target); null: none. Each sequence keeps its own place in it (GrammarState).
    std::shared_ptr<Grammar> grammar;
    // Logit biases and repetition penalties (core/penalties.h), applied to the
    // target's rows before `sampling`, each row with the drafts before it.
    Penalties penalties;
};

// How a session runs all its sequences: one value per BatchSession (and per
// Engine::generate / generate_batch call, each a session of its own).
struct SessionParams {
    // Most prompt tokens a round adds to its target decode while other sequences
    // are generating (0: as many as the batch has room for), and most rows of a
    // `chunked` sequence's prompt per decode, alone too (SequenceSpec). Bounds how
    // long a newly added long prompt can hold up the others' next token, and how
    // long a chunked one holds the engine after its cancel.
    int32_t prefill_chunk = 0;
    // Most share of the session's round time spent timing target batch sizes
    // between rounds for the auto policy (engine/calibrate.cpp): small, so that a
    // first run is not slower than plain decoding; a huge one (1e9) times every
    // size after the first round.
    double calibration_share = 0.03;
    // A new prompt's last token joins its final chunk's decode and its first
    // token is read from that row (decode.cpp): one decode before the first token,
    // as llama-server. Off, the last token waits for the first round (with its
    // drafts), which makes a first token the same whether the prompt was cached
    // or not: a row's logits depend on the batch it was computed in (a row of a
    // prompt batch and the same row alone differ by 0.3 to 0.6 logit on this CPU,
    // enough to flip a near tie). The server turns it on: its batches already
    // mix requests, and its clients wait for first tokens.
    bool first_with_prompt = false;
    TestControls test;
    // Checked between tokens and inside every llama_decode; set from another
    // thread to stop (stop_reason "cancelled", caches left consistent).
    const std::atomic<bool>* cancel = nullptr;
};

struct GenerateResult {
    std::vector<int32_t> tokens;
    std::string text;
    std::string stop_reason;  // "eog", "max_tokens", "stop", "context", "cancelled"
    GenerationStats stats;
    std::vector<TokenLogprobs> logprobs;  // one per token when SequenceParams::logprobs >= 0
};

// Called for every emitted token with the text that became safe to show
// (token -1 carries the final flush). `drafted` tells whether the token was a
// draft the target accepted. Return false to stop (stop_reason "cancelled").
using TokenCallback = std::function<bool(int32_t token, const std::string& text, bool drafted)>;
// The same for a batch: `seq` is the sequence's handle (its index in a
// generate_batch call). Returning false stops that sequence only.
using BatchTokenCallback = std::function<bool(int32_t seq, int32_t token, const std::string& text, bool drafted)>;

// One sequence of a batch. Drafters and adaptive policies keep per-sequence
// state, so each sequence has its own. No policy: plain decoding (its drafter,
// if any, is not used); a policy needs a drafter.
struct SequenceSpec {
    std::vector<int32_t> prompt;
    Drafter* drafter = nullptr;
    LengthPolicy* policy = nullptr;
    SequenceParams params;
    // Which random stream of `params.seed` it draws from (sequence_seed(seed, stream)):
    // sample j of an n-sample request uses stream j.
    int32_t stream = 0;
    // The context sequence (slot) it runs in; -1: the session chooses (pick_slot),
    // or the drafter's own sequence of the draft model, so that slot j of the
    // target and sequence j of the draft model hold the same conversation.
    int32_t slot = -1;
    // Its prompt goes in at most SessionParams::prefill_chunk rows per decode even
    // when nothing else runs: a request likely to go stale (an editor's, cancelled
    // at the next keystroke) holds the engine one chunk after its cancel, not a
    // whole batch (512 rows: ~6 s on 2 cores). 128-row chunks cost 1 to 3 % of prefill speed.
    bool chunked = false;
};

// Figures of a whole batch (each sequence's own are in its GenerateResult).
struct BatchStats {
    int32_t n_seq = 0;           // sequences added
    int32_t rounds = 0;          // target decodes of drafts: one per round for all active sequences
    int64_t rows = 0;            // draft rows (committed token + drafts) in those decodes (prompt rows not counted)
    int32_t max_rows = 0;        // the largest of them
    int64_t prompt_rows = 0;     // prompt tokens decoded (copied prefixes not counted)
    int64_t cached_tokens = 0;   // prompt tokens found in the cache instead (slots, copies, host memory)
    int32_t cache_evictions = 0; // finished sequences' caches dropped (for room, or a slot reused)
    int64_t draft_decodes = 0;   // draft-model decodes (one per draft position for all sequences drafting)
    int32_t joint_rounds = 0;    // rounds whose drafts were allotted jointly (policy.h, JointPlanner)
    double prompt_s = 0;         // decodes that held only prompt rows
    double decode_s = 0;         // from the first emitted token of any sequence to the last
    int64_t n_generated = 0;     // tokens, all sequences
    double aggregate_tok_s = 0;  // tokens after each sequence's first, per second of decode_s
};

// The largest target batch a policy with cap `draft_max` wants timed (its
// calibration_sizes bound): one sequence's draft_max + 1 rows, per sequence the
// context holds (batch-aware policies use those sizes), at most one batch. The
// engine's calibration and pyspec/calibration.py's records both go by it.
int32_t calibration_rows(int32_t draft_max, int32_t n_batch, int32_t n_seq);

// Seed of sequence j of a batch seeded with `seed` (j = 0: the seed itself).
uint64_t sequence_seed(uint64_t seed, int32_t j);

class BatchSession;

class Engine {
public:
    // drafter may be null (plain decoding only). Throws std::invalid_argument if
    // the drafter decodes with the target's own context.
    Engine(Model& target, Drafter* drafter);

    // policy null: plain decoding; with one, the engine's drafter drafts at most
    // policy->draft_max() tokens a round. Holds the locks of the target's and the draft model's contexts for the
    // whole call, so engines sharing a model take turns.
    GenerateResult generate(const std::vector<int32_t>& prompt, const SequenceParams& params,
                            const SessionParams& session, const TokenCallback& on_token,
                            LengthPolicy* policy = nullptr);

    // Many sequences, one target decode per round: a session with these
    // sequences, run to the end. Sequence j draws from stream j of its seed.
    // Sequences whose prompts are equal share one prefill (the cache cells are
    // copied, not recomputed). The target needs n_seq >= seqs.size(). Results
    // come back in the order given.
    std::vector<GenerateResult> generate_batch(const std::vector<SequenceSpec>& seqs, const SessionParams& session,
                                               const BatchTokenCallback& on_token, BatchStats* batch_stats = nullptr);

    Model& target() { return target_; }

private:
    Model& target_;
    Drafter* drafter_;                 // the drafter of generate()
};

// A batch whose sequences join and leave between rounds: continuous batching.
// Each step() is one round: every active sequence drafts, and ONE target
// decode holds all their draft rows plus, where the batch has room, a
// chunk of the prompts of sequences that are waiting to start; then each
// active sequence runs the accept test on its own rows and is rolled back. A waiting
// sequence whose prompt shares a prefix with a cached one copies those cells
// instead of computing them. Finished sequences free their slot at once; their
// cells stay as a prefix cache until the slot is reused, the cells are needed,
// or release_cache().
//
// Uses the target and `draft_models` (those of the drafters it will be given)
// only: with `hold_locks` it holds their locks for its lifetime (one call, one
// thread: generate_batch); without, each method takes them for its duration and
// the session claims the models in between (Model::claim), so that it can live
// across calls and threads (a server's scheduler).
class BatchSession {
public:
    // host_cache (optional, outlives the session): where caches that the
    // context gives up go, and where add() looks for a conversation no slot holds.
    BatchSession(Engine& engine, const SessionParams& session, BatchTokenCallback on_token,
                 std::vector<Model*> draft_models = {}, bool hold_locks = true, HostCache* host_cache = nullptr);
    ~BatchSession();
    BatchSession(const BatchSession&) = delete;
    BatchSession& operator=(const BatchSession&) = delete;

    // The free slot a sequence with this prompt would run in (-1: none free):
    // one whose cache this prompt continues (nothing lost), else the one that
    // holds the most of it when that is more than the rest it holds (this
    // conversation's own last turn), else the least recently used. Any other
    // slot's copy of the prompt's prefix is shared into it anyway (adopt_prefix).
    int32_t pick_slot(const std::vector<int32_t>& prompt) const;
    // Queue a sequence; it starts generating once its prompt is in the cache.
    // Returns its handle (0, 1, 2, ... in the order added). std::invalid_argument
    // (or ContextOverflowError) for a sequence that cannot run; std::length_error
    // when every slot of the target's context is taken.
    int32_t add(const SequenceSpec& spec);
    // End a sequence at the next step (stop_reason "cancelled"). Unknown or
    // finished handles are ignored.
    void cancel(int32_t handle);
    // One round. False when no sequence is waiting or generating.
    bool step();
    // Results of the sequences that finished since the last call, by handle.
    std::vector<std::pair<int32_t, GenerateResult>> take_finished();
    // Empty the cells kept for finished sequences (their prefix cache).
    void release_cache();

    int32_t free_slots() const;
    int32_t n_active() const;   // generating
    int32_t n_waiting() const;  // prompt not yet in the cache
    // Target cache cells held (running sequences', and all: finished sequences'
    // cells stay as a prefix cache that add() reuses and a full cache reclaims).
    std::pair<int32_t, int32_t> kv_cells() const;
    // Free slots that hold a cache (finished conversations kept).
    int32_t cached_slots() const;
    // The log-probabilities a running sequence has recorded so far (from index
    // `start`); empty for unknown or finished handles (their results hold them).
    std::vector<TokenLogprobs> logprobs(int32_t handle, size_t start);
    BatchStats stats() const;

private:
    // The files of cpp/engine/ share these (sequence.h, round.cpp).
    struct Sequence;
    class StopRule;
    class RoundMeter;

    Sequence* find(int32_t handle);
    void check(const SequenceSpec& spec) const;
    // Copy a free slot's caches (both models' sequence `slot`) into the host
    // cache, if there is one and the slot holds enough to be worth it.
    void spill(int32_t slot);
    // Give up a free slot's caches, spilled first.
    void drop_cache(int32_t slot);
    // Put the host cache's best entry for `prompt` into free slot `slot` when
    // it holds more of the prompt than the context does.
    void restore(int32_t slot, const std::vector<int32_t>& prompt);
    // The least recently used free slot that holds cells (-1: none).
    int32_t lru_cached_slot() const;
    // Copy the longest cached prefix of s's prompt from another slot, if longer than its own.
    void reuse_prefix(Sequence& s);
    bool waits_for_prefix(const Sequence& s) const;
    // Waiting sequences whose prompts are in the cache start generating.
    void start_ready();
    void start(Sequence& s);
    // Add a chunk of waiting prompts to rows_ (at most `budget` rows). With
    // first_with_prompt, a prompt whose rest fits adds its last token too, with
    // logits (joining_): it starts in this decode; its first round is plain, read
    // from that row.
    void add_prompt_rows(int32_t budget, int32_t n_logits);
    // The sequences that generate this round (ends those cancelled or out of room).
    std::vector<Sequence*> generating();
    // The steps of a round (step(), in round.cpp), for the active sequences.
    // 1. Plan (plan.cpp), then draft: each sequence drafts up to its plan's k
    //    tokens, those from a draft model together (one decode per position).
    void draft(const std::vector<Sequence*>& active);
    void draft_from_models(std::vector<Sequence*> seqs);
    // Planning (plan.cpp). A sequence's plan: its drafter picks a source and its
    // policy the length k (0: a plain step) within round_max; its rows join a
    // decode that also holds `other_rows` rows of `other_seqs` other sequences.
    void begin_round(Sequence& s);
    void plan_alone(Sequence& s, int32_t round_max, int32_t other_rows, int32_t other_seqs);
    // All active sequences at once, when their policies are joint planners that
    // agree (policy.h, JointPlanner); false: each plans alone.
    bool plan_jointly(const std::vector<Sequence*>& active, int32_t batch_room);
    // round_max: the longest draft s may make this round (context room, tokens
    // left, its share of the batch `batch_room`); its policy's draft_max is the policy's.
    int32_t round_max(const Sequence& s, int32_t batch_room) const;
    // 2. The round's target decode (draft rows, then a chunk of waiting
    //    prompts); on a full cache frees cells (prefix caches, then drafts and
    //    prompt rows, then the longest sequence) and retries.
    void run_target(std::vector<Sequence*>& active);
    // 3. The accept test (sampling.h, accept_drafts) keeps a prefix of s's drafts
    //    and draws the next token from the target's distributions.
    void accept(Sequence& s);
    // 4. s's cache drops the rejected drafts.
    void roll_back(Sequence& s);
    // 5. Commit and stream s's round, stopping at EOG, a stop string,
    //    max_tokens or the callback's word.
    void emit(Sequence& s);
    int32_t add_draft_rows(const std::vector<Sequence*>& active);
    // The target's distributions at s's rows first_row.. (its drafts' and the
    // bonus row): grammar mask, then biases and penalties, then s's sampling.
    void target_distributions(const Sequence& s, int32_t n_rows);
    // Constrained sequences: the grammar's forced text as s's draft (true), and
    // the grammar's cut and masks over whatever s drafted (grammar.h).
    bool draft_forced(Sequence& s, int32_t round_max);
    void constrain_drafts(Sequence& s);
    // calibrate.cpp: hand s's policy the sizes this session timed (returns those
    // still to time); between rounds, time them smallest first, within the share.
    std::vector<int32_t> offer_timings(Sequence& s, Calibrated& policy);
    void calibrate_between_rounds(const std::vector<Sequence*>& active, double round_s);
    void finish(Sequence& s, const char* reason);
    void cancel_all();

    Model& target_;
    SessionParams session_;
    BatchTokenCallback on_token_;
    std::vector<Model*> models_;  // locked, in address order
    using Locks = std::vector<std::unique_lock<std::recursive_mutex>>;
    Locks lock_models() const;   // the models' locks, in address order
    Locks hold() const;          // lock_models(), unless held for the lifetime
    bool hold_locks_;
    Locks locks_;
    std::deque<Sequence> seqs_;   // never moved: a stop rule points into its sequence's stats
    std::vector<int32_t> slot_owner_;  // slot -> handle of the live sequence there, -1: free
    std::vector<uint64_t> slot_used_;  // slot -> when it last started or ended a sequence (tick_)
    uint64_t tick_ = 0;
    HostCache* host_cache_;
    std::vector<std::pair<int32_t, GenerateResult>> finished_;
    int32_t next_handle_ = 0;
    BatchStats bs_;
    std::map<int32_t, double> timings_;  // target batch size -> seconds, timed between rounds
    double rounds_s_ = 0, calibrate_s_ = 0;  // the session's round time, and what timing sizes took
    double fastest_round_s_ = -1;            // ~ V(1): what a timing decode's cost is predicted from
    int64_t after_first_ = 0;     // tokens after each finished sequence's first
    bool any_token_ = false;
    std::chrono::steady_clock::time_point first_token_{}, last_token_{};
    // Scratch of the rounds, reused so that steady state does not allocate.
    std::vector<Model::Row> rows_;     // the round's target batch
    std::vector<std::pair<Sequence*, int32_t>> joining_;  // prompts ending in it, with their logits rows
    std::vector<int32_t> batch_;       // calibration batches
    std::vector<Distribution> p_;      // the target's distributions of one sequence's rows
    RowPipeline row_;                // p's pipeline and its scratch (core/row.h)
};

}  // namespace pyspec
