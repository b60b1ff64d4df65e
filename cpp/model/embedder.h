// Embeddings of token sequences on a loaded Model: a second llama_context on the
// Model's weights (Model::weights()), made with embeddings on, a pooling type
// and its own cache and batch size. The Model's own context (generation) is not
// touched: an engine generating on the Model and an embedder embedding with it
// run at the same time (llama.cpp runs contexts of one model side by side), and
// each guards its own context with its own lock.
//
// Contract of embed():
//   in   sequences of token ids (each non-empty, ids in [0, n_vocab), each at
//        most max_tokens() long); texts are the caller's to tokenize
//        (pyspec/embedding.py tokenizes as llama-server does).
//   out  float32 rows of n_embd(): one per sequence, pooled (mean, cls, last);
//        with pooling NONE one per token of each sequence, sequence by sequence.
//        normalize: each row divided by its L2 norm (a zero row stays zero), as
//        llama-server's default embd_normalize = 2.
//   how  sequences are packed into one llama_decode while they fit: at most
//        max_tokens() tokens and n_seq_max() sequences a decode, each sequence its
//        own seq_id at positions 0.., every row an output (llama.cpp refuses a
//        pooled batch with a row that is not); the cache is cleared before each
//        decode, so no sequence sees another's cells. A decode is one micro-batch
//        (n_ubatch = n_batch): mean and cls pooling are computed per micro-batch,
//        and a sequence split over two would be pooled over its last part only.
//        That is why a sequence is at most max_tokens() = min(n_batch, the model's
//        training context) long: no chunking, and no position past a learned
//        position table (BERT's 512).
//   errs everything is checked before the first decode, so a refused call does no
//        work: std::invalid_argument for no sequences, an empty one, or a token
//        outside the vocabulary; ContextOverflowError for a sequence longer than
//        max_tokens() (the message says the limit); DecodeError when llama_decode
//        fails; Cancelled when *cancel became true (llama.cpp's abort callback stops
//        a decode between graph nodes).
// Packed rows are not always bit-identical to the same sequence embedded alone:
// llama.cpp's CPU matrix kernels round a token's row differently by the number
// of rows in the batch (the plain path switches kernels at 8 rows, the repacked
// one works in blocks of 4), even for one sequence whose later tokens cannot
// change its earlier rows; Gemma 3's outsized activations make that visible (a
// lone 2-token input moved to cosine 0.9988 without repacking).
// tests/test_embeddings.py bounds the gap on its texts.
//
// Thread-safe: embed() holds the embedder's mutex for the whole call; callers
// must not hold Python's GIL while they wait for it (the bindings release it).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "model/model.h"

struct llama_context;

namespace pyspec {

struct EmbedderParams {
    int32_t n_ctx = 512;    // cells of its cache: llama-cpp-python's default n_ctx, llama-server's n_ubatch
    int32_t n_batch = 0;    // tokens a decode holds, and so the longest sequence; 0: n_ctx (<= n_ctx)
    int32_t n_threads = 0;  // 0: the Model's (its params' n_threads; 0 there: all hardware threads)
    // llama_flash_attn_type: 0 off (the default), 1 on, -1 auto. Off, unlike the
    // Model's auto: the CPU kernel of flash attention accumulates V in F16, which
    // moved Gemma 3 270M's pooled vectors by up to 1.6e-3 in cosine between a
    // packed and a lone sequence, against at most 3e-5 without it; off is also
    // llama-cpp-python's default (flash_attn=False), whose values it then equals.
    // Embedding inputs are short, so its speed matters little here.
    int32_t flash_attn = 0;
    // llama_pooling_type: 1 mean, 2 cls, 3 last, 0 none (a row per token), -1 the
    // model's own (its GGUF's pooling_type; none for a generative model). 4 (rank,
    // a reranker's score) is refused: it scores, it does not embed.
    int32_t pooling = 1;

    // std::invalid_argument unless n_ctx >= 1, 0 <= n_batch <= n_ctx, n_threads >= 0,
    // flash_attn in {-1, 0, 1} and pooling in [-1, 3].
    void validate() const;
};

class Embedder {
public:
    // The Model must outlive the embedder (the bindings keep it alive). Throws
    // InvalidModelError when llama.cpp cannot make the context, std::invalid_argument
    // for invalid params or a model whose own pooling is rank.
    Embedder(Model& model, const EmbedderParams& params);
    ~Embedder();
    Embedder(const Embedder&) = delete;
    Embedder& operator=(const Embedder&) = delete;

    const Model& model() const { return model_; }
    const EmbedderParams& params() const { return params_; }
    int32_t n_embd() const { return n_embd_; }          // floats a row (llama_model_n_embd_out)
    int32_t pooling() const { return pooling_; }        // as run: -1 resolved to the model's own
    int32_t n_ctx() const { return n_ctx_; }            // as the context reports it
    int32_t n_batch() const { return n_batch_; }
    int32_t n_seq_max() const { return n_seq_max_; }    // sequences one decode packs
    int32_t max_tokens() const { return max_tokens_; }  // the longest sequence embed() takes
    int32_t n_threads() const { return n_threads_; }
    int64_t n_decoded() const { return n_decoded_.load(); }  // tokens embedded over its life
    int64_t n_decodes() const { return n_decodes_.load(); }  // llama_decode calls over its life (the packing)

    // See the contract above. Returns rows() x n_embd() floats, row-major, where
    // rows() is seqs.size() (pooled) or the sum of their lengths (pooling NONE).
    std::vector<float> embed(const std::vector<std::vector<int32_t>>& seqs, bool normalize,
                             const std::atomic<bool>* cancel = nullptr);

private:
    void check(const std::vector<std::vector<int32_t>>& seqs) const;
    // Decode seqs[first, last) in one batch and write their rows at `out`.
    void decode_group(const std::vector<std::vector<int32_t>>& seqs, size_t first, size_t last, float* out);
    static bool abort_requested(void* self);

    struct ContextFree { void operator()(llama_context* c) const; };
    struct BatchStorage;
    struct BatchFree { void operator()(BatchStorage* b) const; };

    Model& model_;
    EmbedderParams params_;
    std::unique_ptr<llama_context, ContextFree> ctx_;
    std::unique_ptr<BatchStorage, BatchFree> batch_;  // freed before the context (declared after it)
    int32_t n_embd_ = 0;
    int32_t pooling_ = 1;
    int32_t n_ctx_ = 0;
    int32_t n_batch_ = 0;
    int32_t n_seq_max_ = 1;
    int32_t max_tokens_ = 0;
    int32_t n_threads_ = 1;
    std::mutex mutex_;  // one embed() at a time on this context
    std::atomic<const std::atomic<bool>*> abort_flag_{nullptr};
    std::atomic<int64_t> n_decoded_{0};
    std::atomic<int64_t> n_decodes_{0};
};

}  // namespace pyspec
